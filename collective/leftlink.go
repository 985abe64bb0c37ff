package collective

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/durabletrain/durabletrain/internal/race"
)

// recvJob is the receiving half of one operation: served by the operation's
// own goroutine for a small operation over TCP, by readLeft otherwise.
type recvJob struct {
	seq      uint32
	op       byte
	items    []recvItem
	tokens   chan struct{} // one per item received, for the sender to forward it
	finished chan struct{}
	// forwards, for a small operation over TCP, are the sends that wait for a
	// receipt: the goroutine that reads makes them as the data arrives
	// (forwardFrom), instead of waking another goroutine for each (see run).
	forwards  []sendItem
	forwarded int // forwards sent
}

type recvItem struct {
	dst []float32
	add bool // sum into dst (reduce-scatter) or overwrite it (all-gather, broadcast)
}

// leftReading is where reading the left link stands between the goroutines
// that take turns at it, under leftMu (see serveLeft).
type leftReading struct {
	hdr  [headerLen]byte
	hdrN int // bytes of hdr read so far: a read interrupted in a header goes on from there
	// pending: hdr is a data frame's, read before its operation began.
	pending bool
	// ended: the left neighbour closed its group gracefully between
	// operations; the next operation that expects data from it fails.
	ended bool
	// heard is when the last frame's header was read: silence is counted
	// from it, whoever reads (serveLeft's arm). deadline is the read
	// deadline set; kicked, that a reader was interrupted (takeLeft) and
	// the deadline must be set again.
	heard, deadline time.Time
	kicked          bool
}

// leftIdleGap is how long the left link may go unread between operations
// before readLeft reads it (keepalives, aborts, a stall). Operations read it
// themselves, so while they come closer together than this, readLeft only
// wakes once a gap to find that one ran. Failures are still noticed at
// once: an operation reads the link, and an abort also reaches every rank
// leftwards through the other direction of its right link (readRight).
const leftIdleGap = 20 * time.Millisecond

// leftEnd is why serveLeft returned.
type leftEnd int

const (
	leftJobDone leftEnd = iota // the job's last frame is in
	leftWaiting                // no job: a data frame arrived before its operation, or the neighbour closed
	leftYielded                // no job: an operation wants the link (takeLeft)
	leftFailed                 // the group failed
)

// serveLeft reads frames from the left neighbour until job's last frame is
// in, or, with no job, until a data frame arrives (its header is kept for
// its operation) or an operation takes the link. It handles keepalives,
// aborts and silence (StallTimeout) on the way. The caller holds leftMu.
func (g *Group) serveLeft(job *recvJob) leftEnd {
	l := &g.leftRd
	if job == nil && l.pending {
		return leftWaiting // until its operation takes it
	}
	if l.ended {
		if job == nil {
			return leftWaiting
		}
		g.blame(g.left, closedReason+" before sending this operation's data")
		return leftFailed
	}
	next := 0
	for {
		if !l.pending {
			g.armLeft()
			if job == nil && g.wantLeft.Load() {
				return leftYielded
			}
			if testHookBeforeLeftRead != nil {
				testHookBeforeLeftRead(g)
			}
			n, err := io.ReadFull(g.leftReader, l.hdr[l.hdrN:])
			l.hdrN += n
			if err != nil {
				if job == nil && g.wantLeft.Load() && errors.Is(err, os.ErrDeadlineExceeded) {
					return leftYielded
				}
				if !g.leftSilent(err) {
					continue // bytes are waiting: read them
				}
				g.failLeft(err)
				return leftFailed
			}
			l.hdrN, l.heard = 0, time.Now()
		}
		h := parseHeader(l.hdr[:])
		switch h.typ {
		case frameKeepalive:
			continue
		case frameAbort:
			if h.op == 1 && job == nil {
				// The left neighbour finished and closed. That fails nothing until
				// this rank expects data from it again (a pending or later operation).
				io.CopyN(io.Discard, g.leftReader, int64(h.length))
				l.ended = true
				return leftWaiting
			}
			g.readAbort(g.leftReader, h)
			return leftFailed
		case frameData:
			if race.Enabled {
				raceShmSends.Load() // after every shared-memory send this frame's data came round after
			}
		default:
			g.failPeer(g.left, "protocol error", fmt.Errorf("unknown frame type %d", h.typ))
			return leftFailed
		}
		if job == nil {
			l.pending = true
			g.leftEarly.Add(1)
			return leftWaiting
		}
		l.pending = false
		it := job.items[next]
		if h.seq != job.seq || h.op != job.op || int(h.length) != 4*len(it.dst) {
			g.failPeer(g.left, "protocol error", fmt.Errorf(
				"received operation #%d kind %d with %d bytes, expected operation #%d kind %d with %d bytes: ranks called collectives in different orders or with different lengths",
				h.seq, h.op, h.length, job.seq, job.op, 4*len(it.dst)))
			return leftFailed
		}
		dst := it.dst
		if it.add {
			dst = g.scratch[:len(it.dst)]
		}
		g.armLeft()
		if err := g.readLeftFull(asBytes(dst)); err != nil {
			g.failLeft(err)
			return leftFailed
		}
		if it.add {
			addInto(it.dst, dst)
		}
		next++
		if job.tokens != nil {
			job.tokens <- struct{}{}
		} else if err := g.forwardFrom(job, next); err != nil {
			g.failPeer(g.right, "sending", err)
			return leftFailed
		}
		if next == len(job.items) {
			return leftJobDone
		}
	}
}

// armLeft sets the left link's read deadline, StallTimeout after the last
// frame was heard, moved on at most every quarter window (a timer update
// per frame costs microseconds): silence is detected after 3/4 to 1
// StallTimeout. It counts from the last frame, not from when a reader
// began: operations and readLeft take turns, and a turn must not restart
// the count. A link left unread longer than that gets stall/8 from now: a
// read whose deadline has passed fails before it looks at what already
// arrived. The caller reads the link (holds leftMu, or is its only reader).
func (g *Group) armLeft() {
	l, stall := &g.leftRd, g.opts.StallTimeout
	now := time.Now()
	want := l.heard.Add(stall)
	if least := now.Add(stall / 8); want.Before(least) {
		want = least
	}
	if l.kicked || want.Sub(l.deadline) > stall/4 || l.deadline.Sub(now) < stall/8 {
		l.deadline, l.kicked = want, false
		g.leftConn.SetReadDeadline(want)
	}
}

// takeLeft gives the calling operation the left link (leftMu), interrupting
// readLeft if it is reading between operations: that costs a wake, paid
// only by an operation that follows a gap of leftIdleGap or more.
func (g *Group) takeLeft() {
	if g.leftMu.TryLock() {
		return
	}
	g.leftTaken.Add(1)
	g.wantLeft.Store(true)
	// serveLeft sets its deadline before it looks at wantLeft: either it
	// sees wantLeft, or this deadline ends its read.
	g.leftConn.SetReadDeadline(time.Unix(1, 0))
	g.leftMu.Lock()
	g.wantLeft.Store(false)
	g.leftRd.kicked = true
}

// releaseLeft ends an operation's turn at the left link.
func (g *Group) releaseLeft() {
	g.leftUsed.Store(time.Now().UnixNano())
	g.leftMu.Unlock()
}

// readLeft serves the left link for the group's lifetime: the receiving
// half of the operations that hand it theirs (g.jobs), and, once no
// operation has read the link for leftIdleGap, the frames that come between
// operations. Silence for longer than StallTimeout means the left neighbour
// has stalled.
func (g *Group) readLeft() {
	defer g.wg.Done()
	if g.recvRing != nil {
		g.readLeftBesideRing()
		return
	}
	idle := time.NewTimer(leftIdleGap)
	defer idle.Stop()
	for {
		select {
		case job := <-g.jobs: // its operation took leftMu for us (run)
			end := g.serveLeft(job)
			g.releaseLeft()
			if end == leftFailed {
				return
			}
			// Done: stop looking for frames (fdConn), and let the operation's
			// goroutine, which this wakes, have this thread's P at once rather
			// than wait for another thread to take it.
			g.inOp.Store(false)
			close(job.finished)
			runtime.Gosched()
		case <-idle.C:
			if since := time.Since(time.Unix(0, g.leftUsed.Load())); since < leftIdleGap {
				idle.Reset(leftIdleGap - since)
				continue
			}
			if g.leftMu.TryLock() {
				end := g.serveLeft(nil)
				g.leftMu.Unlock()
				if end == leftFailed {
					return
				}
			}
			idle.Reset(leftIdleGap)
		case <-g.done:
			return
		}
	}
}

// readLeftBesideRing reads the left TCP link of a shared-memory link, which
// carries keepalives and aborts only (the data crosses the ring).
func (g *Group) readLeftBesideRing() {
	var hb [headerLen]byte
	for {
		g.armLeft()
		if err := g.readLeftFull(hb[:]); err != nil {
			g.failLeft(err)
			return
		}
		g.leftRd.heard = time.Now()
		h := parseHeader(hb[:])
		switch h.typ {
		case frameKeepalive:
			continue
		case frameAbort:
			if h.op == 1 {
				// The left neighbour finished and closed: the operation that
				// expects more data from it fails (shmReceiver.await).
				g.leftClosed.Store(true)
				futexWake(g.recvRing.published())
				return
			}
			g.readAbort(g.leftReader, h)
		case frameData:
			g.failPeer(g.left, "protocol error", errors.New("a data frame over TCP on a shared-memory link"))
		default:
			g.failPeer(g.left, "protocol error", fmt.Errorf("unknown frame type %d", h.typ))
		}
		return
	}
}

// forwardFrom sends the forwards of a small operation that the items
// received so far allow: each waits for its receipts, as run's sends wait
// for their tokens.
func (g *Group) forwardFrom(job *recvJob, received int) error {
	for job.forwarded < len(job.forwards) && job.forwards[job.forwarded].after <= received {
		s := job.forwards[job.forwarded]
		h := header{typ: frameData, op: job.op, seq: job.seq, length: uint32(4 * len(s.src))}
		if err := g.writeRight(h, asBytes(s.src)); err != nil {
			return err
		}
		job.forwarded++
	}
	return nil
}

// leftSilent reports whether err, from a read of the left link, fails
// the group: any error but a passed read deadline, and a passed deadline
// that this rank watched on its cores, with nothing waiting to be read
// (the left neighbour fell silent). Otherwise the silence may be this
// rank's own:
//   - A deadline passes while this process is off its cores past it (a
//     host starved of CPU, a paused VM) with the neighbour's keepalives
//     waiting unread: the runtime's poller (like rawTCP.tryRead and
//     fdConn's) fails a read whose deadline has passed before it looks at
//     the socket. The caller reads them.
//   - This process was off its cores since the last frame it heard, or
//     notices its deadline late now: on a host starved of CPU the
//     neighbour on the same host was likely off its cores too, and could
//     not send. Silence is counted again from then (offCores).
//
// The link gets at least stall/8 more (armLeft), and the caller reads
// again. A neighbour that stays silent while this rank runs on its cores
// is declared stalled a StallTimeout after it was last heard or this rank
// last ran late; on a host that stays starved, Temporal's heartbeat
// timeout still ends the gang.
func (g *Group) leftSilent(err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) || (!g.leftWaiting() && !g.offCores()) {
		return true
	}
	g.leftLookedAgain.Add(1)
	g.leftRd.kicked = true
	g.armLeft()
	return false
}

// offCores reports whether this process was off its cores since the left
// neighbour was last heard: keepalive woke late since, or this rank
// notices its read deadline late now. Then silence is counted from then
// (leftRd.heard moves there).
func (g *Group) offCores() bool {
	l, stall := &g.leftRd, g.opts.StallTimeout
	var at time.Time
	if n := g.offCoresAt.Load(); n != 0 {
		at = time.Unix(0, n)
	}
	if now := time.Now(); now.Sub(l.deadline) > max(stall/8, 20*time.Millisecond) {
		at = now
	}
	if !at.After(l.heard) {
		return false
	}
	l.heard = at
	return true
}

// leftWaiting reports whether bytes from the left neighbour wait to be
// read, in leftReader or in the socket.
func (g *Group) leftWaiting() bool {
	if g.leftReader.Buffered() > 0 {
		return true
	}
	nb := g.nbLeft
	if nb == nil {
		nb = nbLinkOf(g.leftConn)
	}
	return nb != nil && readable(nb)
}

// readLeftFull reads len(p) bytes of the left link, reading on where a
// deadline passed with bytes waiting (leftSilent).
func (g *Group) readLeftFull(p []byte) error {
	for {
		n, err := io.ReadFull(g.leftReader, p)
		if err == nil || g.leftSilent(err) {
			return err
		}
		p = p[n:]
	}
}

// testHookBeforeLeftRead, when set, runs before serveLeft reads a frame's
// header, with the read deadline set: a test keeps the process off its
// cores there. Set before any group starts; read-only while groups run.
var testHookBeforeLeftRead func(*Group)

func (g *Group) failLeft(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		g.failPeer(g.left, ReasonStalled, fmt.Errorf("no data or keepalive for %v", g.opts.StallTimeout))
		return
	}
	g.failPeer(g.left, "connection lost", err)
}

// closedChan is the finished channel of an operation that receives nothing.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()
