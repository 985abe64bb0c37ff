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
