package collective

import (
	"context"
	"fmt"
	"io"
)

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
