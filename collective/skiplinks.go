package collective

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// The small all-reduce over skip links. Gathering every rank's buffer
// around the ring takes world-1 steps, one after the other: a latency that
// grows with the gang (63 steps for 64 hosts), and 12 messages for 4 ranks,
// where OpenMPI, with a link between any two ranks, sends 6 to 8 (a 4 KiB
// all-reduce over TCP with 4 ranks took 1.8-2.2x OpenMPI's time on every
// VM measured; BENCHMARKS.md). With links to the ranks 2, 4, 8, ... away
// as well as the ring, every rank gathers all the buffers in
// ceil(log2(world)) steps by Bruck's algorithm: at step k a rank sends the
// blocks it holds (its own and those received before, at most 2^k of
// them) to the rank 2^k to its right and receives as many from the rank
// 2^k to its left; step 0 is the ring's own link. Each rank then sums the
// buffers exactly as the gather around the ring does (gatherSum), so the
// sums are the ring's, bit for bit, whichever way they were gathered.
//
// A skip link carries data one way (from its dialer), and pings and pongs
// on demand: a rank waiting for a block asks the sender whether it lives
// after half a StallTimeout of silence, and declares it stalled after a
// whole StallTimeout with no answer. Nothing crosses an idle skip link, so
// nothing piles up between operations; keepalives keep the ring's links.
// Its other direction is read for the whole life of the group (watchSkip):
// pings, aborts, and a lost connection. Aborts travel on every link.

// skipLink is this rank's pair of connections at one distance.
type skipLink struct {
	dist     int
	to, from int      // the ranks dist to the right (we send to) and to the left (we receive from)
	out, in  net.Conn // dialed to `to`; accepted from `from`
	inReader *bufio.Reader
	// outMu serialises writes to out (the operation's blocks, watchSkip's
	// pongs, an abort); inMu writes to in (pings, an abort).
	outMu, inMu sync.Mutex
	frame       []byte // the frame being sent, under outMu
	// deadline is the incoming side's read deadline; pinged, whether a
	// ping is unanswered (both the operation's).
	deadline time.Time
	pinged   bool
}

// pingFlag marks a keepalive frame that asks for one back.
const pingFlag = 1

// gathersOverLinks decides, alike on every rank that shares the options,
// whether a gang gathers its small all-reduces over skip links: where it
// asks to (GatherLinks), gathers at all, and has 3 ranks or more. It reads
// the options only, never the addresses, which a rank may know only some
// of. Ranks that decide differently fail Join naming each other (connect).
func gathersOverLinks(opts Options, world int) bool {
	return opts.GatherLinks && opts.GatherBytes > 0 && world >= 3
}

// skipDistances are the distances of the skip links of a gang of world ranks.
func skipDistances(world int) []int {
	var ds []int
	for d := 2; d < world; d *= 2 {
		ds = append(ds, d)
	}
	return ds
}

// joinSkipLinks connects every skip link, all at once. A ring neighbour
// that closes its connection meanwhile (its Join failed: a rank beside it
// disagreed on the options, or died) ends it at once, rather than when ctx
// does: the ranks at the far end of this rank's skip links may be the ones
// that will never come.
func (g *Group) joinSkipLinks(ctx context.Context, ln *Listener) error {
	ds := skipDistances(g.world)
	links := make([]*skipLink, len(ds))
	errs := make([]error, len(ds))
	jctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	for _, side := range []struct {
		conn net.Conn
		peer int
	}{{g.leftConn, g.left}, {g.rightConn, g.right}} {
		defer watchClosed(side.conn, func(err error) {
			cancel(&PeerError{Rank: side.peer, Addr: g.addrOf(side.peer), Reporter: g.rank,
				Reason: fmt.Sprintf("it closed its connection while the gang formed (its Join failed, or it died): %v", err)})
		})()
	}
	var wg sync.WaitGroup
	for i, d := range ds {
		l := &skipLink{dist: d, to: (g.rank + d) % g.world, from: (g.rank - d + g.world) % g.world}
		links[i] = l
		wg.Add(1)
		go func() {
			defer wg.Done()
			if l.out, l.in, errs[i] = g.connect(jctx, ln, l.to, l.from); errs[i] != nil {
				cancel(errs[i])
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(jctx); err != nil && ctx.Err() == nil {
		errs = []error{err} // the first cause, not every link's cancellation
	}
	if err := errors.Join(errs...); err != nil {
		for _, l := range links {
			if l.out != nil {
				l.out.Close()
				l.in.Close()
			}
		}
		return err
	}
	g.skips = links
	return nil
}

// watchClosed calls closed if conn's peer closes it (or it fails) before
// the returned stop is called; data arriving ends the watch quietly (the
// peer lives, and has moved on). It reads nothing: it peeks.
func watchClosed(conn net.Conn, closed func(error)) (stop func()) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return func() {}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		var n int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			n, _, rerr = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			return rerr != syscall.EAGAIN && rerr != syscall.EINTR
		})
		switch {
		case err != nil: // stopped (the deadline), or the connection closed here
		case rerr != nil:
			closed(rerr)
		case n == 0:
			closed(io.EOF)
		}
	}()
	return func() {
		conn.SetReadDeadline(time.Unix(1, 0))
		<-done
		conn.SetReadDeadline(time.Time{})
	}
}

// readySkipLinks sets up reading the skip links' incoming sides as the
// ring's left link is read: spinning while an operation runs, outside the
// runtime's poller where ranks outnumber cores (see Join).
func (g *Group) readySkipLinks(spin time.Duration) {
	for _, l := range g.skips {
		var r io.Reader = newSpinReader(l.in, spin, &g.inOp)
		if g.yield != nil {
			if c, err := newFDConn(l.in, pollPolicy{active: &g.inOp, window: g.opts.SpinWindow, yield: g.yield}); err == nil && c != l.in {
				l.in, r = c, c
			}
		}
		l.inReader = bufio.NewReaderSize(r, 16<<10)
	}
}

// gatherOverLinks is the small all-reduce over skip links (see the top of
// this file): it gathers every rank's buffer into g.gathered by rank, then
// sums them as gatherSum does.
func (g *Group) gatherOverLinks(ctx context.Context, buf []float32) error {
	n, w, r := len(buf), g.world, g.rank
	if cap(g.gathered) < (w+1)*n {
		g.gathered = make([]float32, (w+1)*n)
		g.plans = nil // the plans' chunks point into the old slice
	}
	got := g.gathered[:(w+1)*n] // rank q's buffer at q; the sum after them
	block := func(q int) []float32 { return got[q*n : (q+1)*n] }
	copy(block(r), buf)
	// Step 0: the ring's link, through the ring's own machinery (TCP or
	// shared memory, its aborts and stalls).
	p := g.planFor(opGatherLinks, buf, func(buf []float32) ([]sendItem, []recvItem) {
		var recvs []recvItem
		for _, c := range chunksOf(block(g.left), g.recvPer) {
			recvs = append(recvs, recvItem{dst: c})
		}
		return g.sendChunks(nil, buf, 0, 0), recvs
	})
	if err := g.run(ctx, opGatherLinks, 4*n, p.sends, p.recvs); err != nil {
		return err
	}
	seq := g.seq
	if len(g.skips) > 0 {
		if err := g.skipSteps(ctx, seq, got, n); err != nil {
			return err
		}
	}
	sumInRingOrder(got[w*n:], w, block) // as gatherSum
	copy(buf, got[w*n:])
	return nil
}

// skipSteps runs the steps over skip links of operation seq: at distance d
// this rank holds the blocks of ranks r, r-1, ..., r-d+1 and sends the
// first min(d, w-d) of them; it receives as many, ending at rank r-d's.
func (g *Group) skipSteps(ctx context.Context, seq uint32, got []float32, n int) error {
	w := g.world
	defer g.abortWhenDone(ctx, seq)()
	if 4*n <= g.opts.SpinMaxBytes {
		g.inOp.Store(true)
		defer g.inOp.Store(false)
	}
	for _, l := range g.skips {
		c := min(l.dist, w-l.dist)
		// The blocks of ranks last-c+1 .. last (mod w), in order: one piece
		// of got, or two where they wrap past rank w-1.
		pieces := func(last int) [][]float32 {
			first := (last - c + 1 + w) % w
			if first <= last {
				return [][]float32{got[first*n : (last+1)*n]}
			}
			return [][]float32{got[first*n : w*n], got[:(last+1)*n]}
		}
		if err := g.sendSkip(l, seq, pieces(g.rank), 4*c*n); err != nil {
			return err
		}
		if err := g.recvSkip(l, seq, pieces(l.from), 4*c*n); err != nil {
			return err
		}
	}
	return nil
}

// sendSkip sends one frame of blocks over l. It does not block for long:
// a step sends at most what the gather's bound allows (64 KiB by default),
// which the socket's buffers hold even when the peer does not read.
func (g *Group) sendSkip(l *skipLink, seq uint32, pieces [][]float32, length int) error {
	l.outMu.Lock()
	l.frame = append(l.frame[:0], make([]byte, headerLen)...)
	header{typ: frameData, op: opGatherLinks, seq: seq, length: uint32(length)}.put(l.frame)
	for _, p := range pieces {
		l.frame = append(l.frame, asBytes(p)...)
	}
	_, err := l.out.Write(l.frame)
	l.outMu.Unlock()
	if err != nil {
		return g.skipFailed(l.to, "sending", err)
	}
	return nil
}

// recvSkip reads the frame of blocks of operation seq from l into pieces,
// answering for silence as the top of this file says.
func (g *Group) recvSkip(l *skipLink, seq uint32, pieces [][]float32, length int) error {
	// Silence counts from when this rank began to wait, give or take a
	// quarter: the deadline is set anew only when less than that is left
	// (a timer update per step costs microseconds).
	stall := g.opts.StallTimeout
	if now := time.Now(); l.pinged || l.deadline.Sub(now) < stall/4 {
		l.deadline, l.pinged = now.Add(stall/2), false
		l.in.SetReadDeadline(l.deadline)
	}
	var hb [headerLen]byte
	for {
		if err := g.readSkipFull(l, hb[:]); err != nil {
			return err
		}
		h := parseHeader(hb[:])
		switch h.typ {
		case frameKeepalive: // a pong
			continue
		case frameAbort:
			if h.op == 1 {
				g.blame(l.from, closedReason+" before sending this operation's data")
			} else {
				g.readAbort(l.inReader, h)
			}
			<-g.done
			return g.err
		case frameData:
		default:
			return g.skipFailed(l.from, "protocol error", fmt.Errorf("unknown frame type %d", h.typ))
		}
		if h.seq != seq || h.op != opGatherLinks || int(h.length) != length {
			return g.skipFailed(l.from, "protocol error", fmt.Errorf(
				"received operation #%d kind %d with %d bytes over the link from %d ranks away, expected operation #%d kind %d with %d bytes: ranks called collectives in different orders or with different lengths",
				h.seq, h.op, h.length, l.dist, seq, opGatherLinks, length))
		}
		for _, p := range pieces {
			if err := g.readSkipFull(l, asBytes(p)); err != nil {
				return err
			}
		}
		return nil
	}
}

// readSkipFull fills p from l's incoming side. Silence until the deadline
// (half a StallTimeout) sends a ping; silence for a whole one after it
// fails the group, blaming the sender.
func (g *Group) readSkipFull(l *skipLink, p []byte) error {
	for len(p) > 0 {
		k, err := io.ReadFull(l.inReader, p)
		p = p[k:]
		if k > 0 {
			l.pinged = false
		}
		switch {
		case err == nil:
		case g.Err() != nil:
			return g.err
		case !errors.Is(err, os.ErrDeadlineExceeded):
			return g.skipFailed(l.from, "connection lost", err)
		case !l.pinged:
			l.inMu.Lock()
			var ping [headerLen]byte
			header{typ: frameKeepalive, flags: pingFlag}.put(ping[:])
			_, werr := l.in.Write(ping[:])
			l.inMu.Unlock()
			if werr != nil {
				return g.skipFailed(l.from, "asking whether it lives", werr)
			}
			l.deadline, l.pinged = time.Now().Add(g.opts.StallTimeout), true
			g.skipPings.Add(1)
			l.in.SetReadDeadline(l.deadline)
		default:
			return g.skipFailed(l.from, ReasonStalled, fmt.Errorf("no data, and no answer to a ping for %v", g.opts.StallTimeout))
		}
	}
	return nil
}

// skipFailed fails the group blaming peer (after the grace in which the
// peer's own abort, naming the real culprit, may arrive on another link)
// and returns the group's error.
func (g *Group) skipFailed(peer int, what string, err error) error {
	select {
	case <-g.done:
	case <-time.After(culpritGracePeriod):
		g.blame(peer, fmt.Sprintf("%s: %v", what, err))
	}
	<-g.done
	return g.err
}

// watchSkip reads the other direction of l's outgoing connection for the
// group's life: it answers pings, and fails the group on an abort or a
// lost connection (a graceful close ends it quietly).
func (g *Group) watchSkip(l *skipLink) {
	defer g.wg.Done()
	var hb [headerLen]byte
	for {
		if _, err := io.ReadFull(l.out, hb[:]); err != nil {
			if g.Err() == nil {
				g.skipFailed(l.to, "connection lost", err)
			}
			return
		}
		h := parseHeader(hb[:])
		switch {
		case h.typ == frameKeepalive && h.flags&pingFlag != 0:
			var pong [headerLen]byte
			header{typ: frameKeepalive}.put(pong[:])
			l.outMu.Lock()
			_, err := l.out.Write(pong[:])
			l.outMu.Unlock()
			if err != nil {
				if g.Err() == nil {
					g.skipFailed(l.to, "answering a ping", err)
				}
				return
			}
		case h.typ == frameAbort && h.op == 1:
			return // it closed its group gracefully
		case h.typ == frameAbort:
			g.readAbort(l.out, h)
			return
		default:
			g.skipFailed(l.to, "protocol error", fmt.Errorf("unexpected frame type %d on the reverse direction of a skip link", h.typ))
			return
		}
	}
}

// skipConns are the skip links' connections with the lock that serialises
// writes to each, for fail's aborts.
func (g *Group) skipConns(add func(net.Conn, *sync.Mutex)) {
	for _, l := range g.skips {
		add(l.out, &l.outMu)
		add(l.in, &l.inMu)
	}
}
