package collective

import (
	"errors"
	"fmt"
	"io"
	"time"
)

// nbLink is a TCP link read and written without blocking, by an
// operation's progress loop: a read or write that cannot proceed now
// returns 0 and no error, and the loop waits for both links at once
// (progressWaker.await).
type nbLink interface {
	// tryRead reads what has arrived, up to len(p): io.EOF once the peer
	// closed, os.ErrDeadlineExceeded once the read deadline has passed.
	tryRead(p []byte) (int, error)
	// tryWritev writes what the socket takes now of bufs, in order.
	tryWritev(bufs [][]byte) (int, error)
	// hold runs f with the link's descriptor, kept open while f runs.
	hold(f func(fd int)) error
}

// progress runs an operation over TCP too large to forward inline (its
// sends exceed inlineSendBytes) in the calling goroutine, as MPI's progress
// engine does: it writes frames to the right neighbour and reads them from
// the left one without blocking on either, sums what it receives as it
// arrives, and sends each forward as soon as its receipt is in. When
// neither link can move it sleeps in poll(2) on both; an operation of at
// most SpinMaxBytes (look) first looks again for SpinWindow, yielding the
// goroutine between looks, or the core where ranks outnumber cores.
//
// Why: handing the receiving half to readLeft costs a goroutine wake per
// chunk, and two busy threads per process, which on a host with as many
// processes as cores means threads queueing for cores; and a blocking
// write cannot read meanwhile, so the operation needs the second goroutine
// at all. One goroutine that never blocks on a link needs neither.
//
// Frames are written whole under writeMu (keepalives go between them), and
// the left link is read under leftMu (takeLeft): keepalives, aborts and
// silence (StallTimeout, from the last frame heard) are handled on the way
// as serveLeft handles them. Once its own frames are all in, it goes on
// reading the left link for aborts while sends remain, and keeps the
// header of a data frame that arrives early for its operation.
func (g *Group) progress(job *recvJob, sends []sendItem, look bool) error {
	left, right := g.nbLeft, g.nbRight
	g.progressOps.Add(1)
	g.takeLeft()
	defer g.releaseLeft()
	l := &g.leftRd
	if l.ended {
		g.blame(g.left, closedReason+" before sending this operation's data")
		<-g.done
		return g.err
	}
	g.armLeft()
	var (
		// Sending: sends[si] has its first sOff bytes (header, then payload)
		// written; writing means writeMu is held for it.
		si, sOff int
		writing  bool
		out      [headerLen]byte
		// Receiving: items[ri] has rOff payload bytes in, the first summed
		// floats of them added into its buffer; inFrame: its header is read.
		ri, rOff, summed int
		inFrame          bool
		bufs             [2][]byte
	)
	items := job.items
	var wait spinWait // looking again before sleeping
	switch {
	case look:
		wait.window = g.opts.SpinWindow
	case g.largeSpin != nil && g.largeSpin.ready():
		// A large operation where every rank has a core: look too, until
		// the system takes the core from this rank for other work (a loaded
		// host), where sleeping costs that work less.
		wait.window, wait.yield = g.opts.SpinWindow, g.largeSpin
	}
	// fail returns the group's error once why is done: why fails the group
	// (g.fail), whose abort frame to the right waits for writeMu, so a frame
	// in progress is given up first.
	fail := func(why func()) error {
		if writing {
			g.writeMu.Unlock()
			writing = false
		}
		why()
		<-g.done
		return g.err
	}
	for {
		select {
		case <-g.done:
			return fail(func() {})
		default:
		}
		moved, mutexBusy := false, false
		// Write what may be written.
		for si < len(sends) {
			s := sends[si]
			if !writing {
				if s.after > ri {
					break // its receipt is not in yet
				}
				if !g.writeMu.TryLock() {
					mutexBusy = true // a keepalive is being written
					break
				}
				writing = true
				header{typ: frameData, op: job.op, seq: job.seq, length: uint32(4 * len(s.src))}.put(out[:])
			}
			payload := asBytes(s.src)
			v := bufs[:0]
			if sOff < headerLen {
				v = append(v, out[sOff:], payload)
			} else {
				v = append(v, payload[sOff-headerLen:])
			}
			n, err := right.tryWritev(v)
			if err != nil {
				return fail(func() { g.failPeer(g.right, "sending", err) })
			}
			if n == 0 {
				break
			}
			moved = true
			if sOff += n; sOff == headerLen+len(payload) {
				g.wroteRight()
				g.writeMu.Unlock()
				writing = false
				si, sOff = si+1, 0
			}
		}
		// Read what has arrived: this operation's frames, then (while sends
		// remain) whatever comes before the next operation's.
		for ri < len(items) || (si < len(sends) && !l.pending && !l.ended) {
			if !inFrame {
				if !l.pending {
					n, err := g.readLeftNow(l.hdr[l.hdrN:])
					if err != nil {
						if !g.leftSilent(err) {
							continue // bytes are waiting: read them
						}
						return fail(func() { g.failLeft(err) })
					}
					if n == 0 {
						break
					}
					moved = true
					if l.hdrN += n; l.hdrN < headerLen {
						continue
					}
					l.hdrN, l.heard = 0, time.Now()
					g.armLeft()
				}
				h := parseHeader(l.hdr[:])
				switch h.typ {
				case frameKeepalive:
					continue
				case frameAbort:
					if h.op == 1 && ri == len(items) {
						// The left neighbour closed after sending us all of this
						// operation: that fails only an operation that expects more.
						io.CopyN(io.Discard, g.leftReader, int64(h.length))
						l.ended = true
						continue
					}
					return fail(func() { g.readAbort(g.leftReader, h) })
				case frameData:
				default:
					return fail(func() { g.failPeer(g.left, "protocol error", fmt.Errorf("unknown frame type %d", h.typ)) })
				}
				if ri == len(items) {
					l.pending = true // the next operation's
					g.leftEarly.Add(1)
					break
				}
				l.pending = false
				it := items[ri]
				if h.seq != job.seq || h.op != job.op || int(h.length) != 4*len(it.dst) {
					return fail(func() {
						g.failPeer(g.left, "protocol error", fmt.Errorf(
							"received operation #%d kind %d with %d bytes, expected operation #%d kind %d with %d bytes: ranks called collectives in different orders or with different lengths",
							h.seq, h.op, h.length, job.seq, job.op, 4*len(it.dst)))
					})
				}
				inFrame, rOff, summed = true, 0, 0
			}
			it := items[ri]
			dst := it.dst
			if it.add {
				dst = g.scratch[:len(it.dst)]
			}
			b := asBytes(dst)
			if rOff < len(b) {
				n, err := g.readLeftNow(b[rOff:])
				if err != nil {
					if !g.leftSilent(err) {
						continue // bytes are waiting: read them
					}
					return fail(func() { g.failLeft(err) })
				}
				if n == 0 {
					break
				}
				moved = true
				rOff += n
				if it.add {
					// Sum the whole floats in so far, while they are in cache.
					if whole := rOff / 4; whole > summed {
						addInto(it.dst[summed:whole], dst[summed:whole])
						summed = whole
					}
				}
			}
			if rOff == len(b) {
				ri, inFrame = ri+1, false
			}
		}
		if si == len(sends) && ri == len(items) {
			return nil
		}
		if moved {
			wait.until, wait.spins = time.Time{}, 0
			continue
		}
		if wait.poll(g) {
			continue // look again
		}
		// Nothing moved: sleep until a link can, or the left one's silence
		// has lasted StallTimeout (the next read then fails).
		wantRead := ri < len(items) || (si < len(sends) && !l.pending && !l.ended)
		timeout := time.Duration(-1)
		if wantRead {
			// A millisecond past the deadline, so that the read after it fails.
			timeout = max(0, time.Until(l.deadline)) + time.Millisecond
		}
		if mutexBusy {
			timeout = time.Millisecond
		}
		// Blocked on a right neighbour that does not read, with the next
		// operation's frame from the left one waiting (pending): watch the
		// left link for its close, which is how a failure elsewhere (the
		// right neighbour stopped, and its own right neighbour gave up on it)
		// reaches this rank while it reads nothing.
		watch := writing && l.pending
		if g.waker.await(left, right, wantRead, writing, watch, timeout) && watch {
			return fail(g.leftClosedWhilePending)
		}
	}
}

// leftClosedWhilePending fails the group after the left neighbour shut its
// side of the link while the header of a data frame for the next operation
// was pending: its abort frame, with the culprit, follows that frame's
// payload, which this rank reads now (the group is lost either way; the
// neighbour closed, so the reads end).
func (g *Group) leftClosedWhilePending() {
	l := &g.leftRd
	h := parseHeader(l.hdr[:])
	l.pending = false
	var hb [headerLen]byte
	if _, err := io.CopyN(io.Discard, g.leftReader, int64(h.length)); err != nil {
		g.failLeft(err)
		return
	}
	for {
		if _, err := io.ReadFull(g.leftReader, hb[:]); err != nil {
			g.failLeft(err)
			return
		}
		switch h := parseHeader(hb[:]); h.typ {
		case frameKeepalive:
			continue
		case frameAbort:
			g.readAbort(g.leftReader, h)
		default:
			g.failPeer(g.left, "connection lost", errors.New("closed in the middle of an operation"))
		}
		return
	}
}

// readLeftNow reads what has arrived from the left neighbour, without
// blocking: first what leftReader holds, then from the socket.
func (g *Group) readLeftNow(p []byte) (int, error) {
	if k := g.leftReader.Buffered(); k > 0 {
		return g.leftReader.Read(p[:min(len(p), k)])
	}
	return g.nbLeft.tryRead(p)
}
