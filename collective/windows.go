package collective

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Host windows: where every rank of a gang is on one host, each rank
// exposes a window (shared memory, shm_linux.go) that every other rank
// maps, and an all-reduce reads its peers' data where it lies instead of
// passing it around the ring (MPI's shared-memory collectives, NCCL's
// single-node all-reduce). Options.HostWindows turns it on.
//
// An all-reduce runs in pieces of at most one window half per rank, the
// halves taken in turn. In each piece every rank copies the parts of its
// buffer that its peers sum into its window (all but its own segment's);
// all arrive at a barrier; rank r sums segment r: its own values, then
// rank r+1's, r+2's, ... read from their windows, the ring's order, so the
// sums are the ring's bit for bit; it puts the sum in its window; all arrive
// again; every rank copies the other segments' sums from their owners'
// windows. Two barriers per piece against the ring's 2(world-1) steps, and
// each byte copied into shared memory once instead of once per step. A
// half is written again two pieces later, after a barrier that every rank
// reaches only once it read that half: no third barrier.
//
// A barrier is a counter in each window's header: a rank arrives by
// raising its own (and waking sleepers), and waits until every peer's is
// as high, polling (Options.SpinWindow) and then sleeping on the futex of
// the counter it waits for. The first barrier of each operation checks that
// every rank started the same one (sequence number, kind and length).
// Keepalives and aborts still travel the ring's TCP links, so a dead or
// stopped rank is found as it is without windows; a rank that closes its
// group marks its window closed, so peers waiting for it fail at once.

// Window header words, after the token (shmTokenLen bytes at offset 0),
// each on its own cache line.
const (
	winArrivedOffset = 64  // barriers this rank has reached (it writes)
	winWaitersOffset = 128 // peers sleeping on arrived (each adds itself)
	winClosedOffset  = 192 // 1 once the rank closed its group
	// The rank's group failure, written once before its callers see it:
	// the culprit plus 2 (1: nobody to blame; 0: not failed), written last,
	// the rank that detected it, and the reason (up to maxAbortMsg bytes).
	// A peer at a barrier reads it as it would the rank's abort frame,
	// which travels the ring's TCP links and may come after the rank
	// closed its window.
	winFailedOffset       = 320
	winFailReporterOffset = 324
	winFailReasonLen      = 328
	winFailReasonOffset   = 384
	// winDescOffset: the operation begun, in two descriptors of 32 bytes:
	// seq, kind, length (low, high), root. An operation whose first barrier
	// is the rank's e-th writes descriptor e%2: a peer reads it after seeing
	// the rank reach e, and the rank cannot write that descriptor again
	// before barrier e+2, which waits for the peer.
	winDescOffset = 256
)

// defaultWindowBytes is Options.WindowBytes by default: each half of a
// rank's window, so a window is twice this and a page.
// windowSpin is how long a rank polls for a peer at a barrier (where
// Options.SpinWindow is positive) before it sleeps: a peer comes from a
// piece's copies and sums, which take longer than a ring step's, and where
// ranks outnumber cores it comes only once the rank gave it the core.
// Polling stops early once the system takes the core for other work
// (coreYielder). Measured, 4 ranks on 2 cores, 1 MiB, one run each: 382
// µs polling up to 5 ms, 415 up to 1 ms, 424 up to 200 µs (2026-11-27,
// about 14:05 UTC; BENCHMARKS.md).
const windowSpin = 5 * time.Millisecond

const (
	defaultWindowBytes = 1 << 20
	// defaultWindowMaxBytes is Options.WindowMaxBytes by default: measured
	// with a CPU-bound process per core beside 2 and 4 ranks on 2 cores,
	// windows took 0.71-0.96x the ring's time at 1 and 4 MiB, 0.95-1.26x at
	// 8 MiB and 1.12-1.42x at 16 MiB, where ranks kept in step by a barrier
	// per piece wait out each other's lost time slices and the ring's
	// slots let them run ahead (idle, windows were faster at every size;
	// BENCHMARKS.md).
	defaultWindowMaxBytes = 4 << 20
	minWindowBytes        = 4 << 10
	maxWindowBytes        = 1 << 30
)

// Operation kinds in a window's descriptor: the ring's opAllReduce and
// opBroadcast, either marked winAroundRing (too large for the windows: it
// runs the ring after the barrier), and a barrier.
const (
	winAroundRing = 0x80
	winBarrier    = 0xff
)

// hostWindows is this rank's view of every rank's window, by rank.
type hostWindows struct {
	wins  []*shmRing // wins[q]: rank q's window, two slots of half bytes
	half  int        // bytes
	epoch uint32     // barriers this rank has reached
	turn  int        // pieces run: the next uses half turn%2
	// closed marks this rank's window closed once (a second Close finds
	// it unmapped).
	closed sync.Once
}

func (h *hostWindows) own(r int) *shmRing { return h.wins[r] }

// floats is half i of rank q's window, as floats.
func (h *hostWindows) floats(q, i int) []float32 { return asFloats(h.wins[q].slot(i)) }

// exchangeWindows runs at Join, after the ring's own links are negotiated
// (negotiateShm), on every rank of a gang with flagHostWindows: each rank
// creates its window, the ranks pass every window's name around the ring,
// each maps every other's, and they pass around whether each mapped them
// all. Windows are used only if every rank did; otherwise the gang runs
// its ring, as without the option. The connections carry the exchange in
// the ring's direction; each message is small enough never to block on a
// socket buffer, so every rank writes before it reads.
func (g *Group) exchangeWindows() error {
	w, r := g.world, g.rank
	half := g.opts.WindowBytes
	var own *shmRing
	var path string
	var token []byte
	desc := binary.BigEndian.AppendUint16(nil, 0)
	// Both neighbours are here (maybe all are), and a half holds a float
	// of every rank's segment.
	if g.sendRing != nil && g.recvRing != nil && half/4/w >= 1 {
		var err error
		if own, path, token, err = createShmRing(2, half); err == nil {
			defer os.Remove(path)
			desc = binary.BigEndian.AppendUint16(nil, uint16(len(path)))
			desc = append(desc, path...)
			desc = binary.BigEndian.AppendUint32(desc, uint32(half))
			desc = append(desc, token...)
		} else {
			g.log.Info("no host window: the gang runs its ring", zap.Error(err))
		}
	}
	descs := make([][]byte, w)
	descs[r] = desc
	err := g.aroundRing(descs, func(in io.Reader) ([]byte, error) {
		var n [2]byte
		if _, err := io.ReadFull(in, n[:]); err != nil {
			return nil, err
		}
		l := int(binary.BigEndian.Uint16(n[:]))
		if l == 0 {
			return n[:], nil
		}
		if l > 4096 {
			return nil, fmt.Errorf("a window name of %d bytes; want at most 4096", l)
		}
		rest := make([]byte, l+4+shmTokenLen)
		if _, err := io.ReadFull(in, rest); err != nil {
			return nil, err
		}
		return append(n[:], rest...), nil
	})
	if err != nil {
		if own != nil {
			own.close()
		}
		return fmt.Errorf("passing host windows around the ring: %w", err)
	}
	wins := make([]*shmRing, w)
	wins[r] = own
	ok := own != nil
	for q, d := range descs {
		if q == r || !ok {
			continue
		}
		l := int(binary.BigEndian.Uint16(d))
		if l == 0 {
			ok = false
			break
		}
		peerPath, size := string(d[2:2+l]), int(binary.BigEndian.Uint32(d[2+l:]))
		if size != half {
			ok = false // every rank's WindowBytes must agree; the ring does not need them to
			break
		}
		if wins[q], err = openShmRing(peerPath, 2, size, d[2+l+4:]); err != nil {
			ok = false
			break
		}
	}
	oks := make([][]byte, w)
	oks[r] = []byte{0}
	if ok {
		oks[r][0] = 1
	}
	err = g.aroundRing(oks, func(in io.Reader) ([]byte, error) {
		b := make([]byte, 1)
		_, err := io.ReadFull(in, b)
		return b, err
	})
	all := err == nil
	for _, b := range oks {
		all = all && b != nil && b[0] == 1
	}
	if !all {
		for _, win := range wins {
			if win != nil {
				win.close()
			}
		}
		if err != nil {
			return fmt.Errorf("agreeing on host windows: %w", err)
		}
		return nil
	}
	for q, win := range wins {
		if q != r {
			win.setClock(windowToken(descs[q]))
		}
	}
	own.setClock(token)
	g.windows = &hostWindows{wins: wins, half: half}
	return nil
}

// windowToken is the token in a window's descriptor.
func windowToken(d []byte) []byte {
	l := int(binary.BigEndian.Uint16(d))
	return d[2+l+4:]
}

// aroundRing gives every rank every rank's message: msgs[g.rank] is this
// rank's; in world-1 steps each rank sends its right neighbour the message
// it has newest and reads its left neighbour's with read.
func (g *Group) aroundRing(msgs [][]byte, read func(io.Reader) ([]byte, error)) error {
	w, r := g.world, g.rank
	for k := range w - 1 {
		if _, err := g.rightConn.Write(msgs[((r-k)%w+w)%w]); err != nil {
			return fmt.Errorf("to rank %d: %w", g.right, err)
		}
		m, err := read(g.leftConn)
		if err != nil {
			return fmt.Errorf("from rank %d: %w", g.left, err)
		}
		msgs[((r-k-1)%w+w)%w] = m
	}
	return nil
}

// arrive raises this rank's barrier counter and wakes its sleepers.
func (g *Group) arrive() {
	h := g.windows
	own := h.own(g.rank)
	h.epoch++
	own.release()
	own.word(winArrivedOffset).Store(h.epoch)
	if own.word(winWaitersOffset).Load() != 0 {
		futexWake(own.word(winArrivedOffset))
	}
}

// describe writes the operation this rank begins into its header, before
// the operation's first arrive.
func (g *Group) describe(op byte, n, root int) {
	own, d := g.windows.own(g.rank), descOffset(g.windows.epoch+1)
	own.word(d).Store(g.seq)
	own.word(d + 4).Store(uint32(op))
	own.word(d + 8).Store(uint32(uint64(n)))
	own.word(d + 12).Store(uint32(uint64(n) >> 32))
	own.word(d + 16).Store(uint32(root))
}

// descOffset is where the descriptor of an operation whose first barrier
// is the epoch-th lies.
func descOffset(epoch uint32) int { return winDescOffset + 32*int(epoch%2) }

// awaitAll returns once every peer reached this rank's latest barrier;
// first checks their operation against this rank's (the first barrier of an
// operation).
func (g *Group) awaitAll(first bool) error {
	h := g.windows
	for i := 1; i < g.world; i++ {
		q := (g.rank + i) % g.world
		win := h.wins[q]
		arrived := win.word(winArrivedOffset)
		wait := spinWait{yield: g.largeSpin}
		if g.spin > 0 {
			wait.window = windowSpin
		}
		for int32(arrived.Load()-h.epoch) < 0 {
			if err := g.Err(); err != nil {
				return err
			}
			// Closed is read first: a rank whose group failed published why
			// before it could close, so a closed window's failure is seen.
			closed := win.word(winClosedOffset).Load() != 0
			if g.peerWindowFailed(win) {
				return g.err
			}
			if closed && int32(arrived.Load()-h.epoch) < 0 {
				g.blame(q, closedReason+" before this operation")
				return g.err
			}
			if wait.poll(g) {
				continue
			}
			waiters := win.word(winWaitersOffset)
			waiters.Add(1)
			if v := arrived.Load(); int32(v-h.epoch) < 0 && g.Err() == nil {
				futexWait(arrived, v, shmSleep)
			}
			waiters.Add(^uint32(0))
		}
		win.acquire()
		if first {
			own, d := h.own(g.rank), descOffset(h.epoch)
			for off := d; off <= d+16; off += 4 {
				if win.word(off).Load() != own.word(off).Load() {
					g.failPeer(q, "protocol error", fmt.Errorf(
						"rank %d began operation #%d, %s, and this rank #%d, %s: ranks called collectives in different orders or with different lengths (or options.WindowMaxBytes)",
						q, win.word(d).Load(), describedOp(win, d), g.seq, describedOp(own, d)))
					return g.err
				}
			}
		}
	}
	return nil
}

// describedOp says in words what a window's descriptor at d describes.
func describedOp(win *shmRing, d int) string {
	n := uint64(win.word(d+8).Load()) | uint64(win.word(d+12).Load())<<32
	kind, root := win.word(d+4).Load(), win.word(d+16).Load()
	how := "through the windows"
	if kind != winBarrier && kind&winAroundRing != 0 {
		kind &^= winAroundRing
		how = "around the ring (past WindowMaxBytes)"
	}
	switch kind {
	case winBarrier:
		return "a barrier"
	case opAllReduce:
		return fmt.Sprintf("an all-reduce of %d floats %s", n, how)
	case opBroadcast:
		return fmt.Sprintf("a broadcast of %d floats from rank %d %s", n, root, how)
	}
	return fmt.Sprintf("an operation of unknown kind %d", kind)
}

// barrierWindows is one barrier, checked as an operation's first.
func (g *Group) barrierWindows(op byte, n, root int) error {
	g.describe(op, n, root)
	g.arrive()
	return g.awaitAll(true)
}

// windowsOp runs one operation over the windows, aborting the group if
// ctx ends first.
func (g *Group) windowsOp(ctx context.Context, run func() error) error {
	if err := g.Err(); err != nil {
		return err
	}
	g.seq++
	stop := g.abortWhenDone(ctx, g.seq)
	if ctx.Err() != nil { // cancelled already: arrive nowhere, so nobody goes on without this rank
		<-g.done
		return g.err
	}
	defer stop()
	return run()
}

// agreeOnWindows is one barrier through the windows before an operation
// too large for them runs around the ring: there every rank checks that all
// began the same operation, so that ranks that disagree (one through the
// windows, one around the ring) fail with a protocol error instead of each
// waiting for the other.
// The kind it describes is op|winAroundRing: a rank whose WindowMaxBytes
// sent the same operation through the windows sees another kind.
func (g *Group) agreeOnWindows(ctx context.Context, op byte, n, root int) error {
	return g.windowsOp(ctx, func() error { return g.barrierWindows(op|winAroundRing, n, root) })
}

// allReduceWindows is AllReduce over the host windows (see the top of
// this file); an empty buf is a barrier.
func (g *Group) allReduceWindows(ctx context.Context, buf []float32) error {
	return g.windowsOp(ctx, func() error {
		n, w, r := len(buf), g.world, g.rank
		if n == 0 {
			return g.barrierWindows(winBarrier, 0, 0)
		}
		h := g.windows
		per := h.half / 4 / w // floats of each segment a piece carries
		seg := func(s int) []float32 { return buf[s*n/w : (s+1)*n/w] }
		longest := (n + w - 1) / w
		for lo := 0; lo < longest; lo += per {
			part := func(s int) []float32 { // segment s's part of this piece
				sg := seg(s)
				return sg[min(lo, len(sg)):min(lo+per, len(sg))]
			}
			half := h.turn % 2
			h.turn++
			slot := func(q, s int) []float32 { return h.floats(q, half)[s*per : s*per+per] }
			for s := range w {
				if s != r {
					copy(slot(r, s), part(s))
				}
			}
			if lo == 0 {
				g.describe(opAllReduce, n, 0)
			}
			g.arrive()
			if err := g.awaitAll(lo == 0); err != nil {
				return err
			}
			mine := part(r)
			for i := 1; i < w; i++ {
				addInto(mine, slot((r+i)%w, r)[:len(mine)])
			}
			copy(slot(r, r), mine)
			g.arrive()
			if err := g.awaitAll(false); err != nil {
				return err
			}
			for s := range w {
				if s != r {
					p := part(s)
					copy(p, slot(s, s)[:len(p)])
				}
			}
		}
		return nil
	})
}

// broadcastWindows is Broadcast over the host windows: root copies each
// piece into its window; once all arrive, the others copy it out. One
// barrier a piece: root writes a half again only after every rank arrived
// past the piece that read it.
func (g *Group) broadcastWindows(ctx context.Context, buf []float32, root int) error {
	return g.windowsOp(ctx, func() error {
		h := g.windows
		per := h.half / 4
		for lo := 0; lo < max(len(buf), 1); lo += per {
			p := buf[lo:min(lo+per, len(buf))]
			half := h.turn % 2
			h.turn++
			if g.rank == root {
				copy(h.floats(root, half), p)
			}
			if lo == 0 {
				g.describe(opBroadcast, len(buf), root)
			}
			g.arrive()
			if err := g.awaitAll(lo == 0); err != nil {
				return err
			}
			if g.rank != root {
				copy(p, h.floats(root, half))
			}
		}
		return nil
	})
}

// markWindowClosed marks this rank's window closed, so peers waiting at a
// barrier for it fail at once, then wakes them.
func (g *Group) markWindowClosed() {
	g.windows.closed.Do(func() {
		own := g.windows.own(g.rank)
		own.word(winClosedOffset).Store(1)
		futexWake(own.word(winArrivedOffset))
	})
}

// publishWindowFailure writes this rank's group failure into its window
// (see winFailedOffset) and wakes peers sleeping on its counter.
func (g *Group) publishWindowFailure(pe *PeerError) {
	own := g.windows.own(g.rank)
	reason := pe.Reason[:min(len(pe.Reason), maxAbortMsg)]
	copy(own.headerBytes(winFailReasonOffset, len(reason)), reason)
	own.word(winFailReasonLen).Store(uint32(len(reason)))
	own.word(winFailReporterOffset).Store(uint32(pe.Reporter))
	own.release()
	own.word(winFailedOffset).Store(uint32(pe.Rank + 2))
	futexWake(own.word(winArrivedOffset))
}

// peerWindowFailed fails this rank's group as the peer owning win failed,
// if it did, as the peer's abort frame would, and reports whether it did.
func (g *Group) peerWindowFailed(win *shmRing) bool {
	failed := win.word(winFailedOffset).Load()
	if failed == 0 {
		return false
	}
	win.acquire()
	n := min(int(win.word(winFailReasonLen).Load()), maxAbortMsg)
	culprit := int(failed) - 2
	if culprit >= g.world {
		culprit = -1 // not a rank of this gang: blame nobody rather than a stranger
	}
	pe := &PeerError{
		Rank:     culprit,
		Addr:     g.addrOf(culprit),
		Reporter: int(win.word(winFailReporterOffset).Load()),
		Reason:   string(win.headerBytes(winFailReasonOffset, n)),
	}
	g.fail(pe, pe)
	return true
}

// wakeWindows wakes this rank's own sleepers on its peers' counters (the
// group failed).
func (g *Group) wakeWindows() {
	for q, win := range g.windows.wins {
		if q != g.rank {
			futexWake(win.word(winArrivedOffset))
		}
	}
}

// unmapWindows drops this rank's mappings, once no operation runs.
func (g *Group) unmapWindows() {
	for _, win := range g.windows.wins {
		win.close()
	}
}
