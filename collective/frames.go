package collective

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// Frames. Header: type, op kind, 2 reserved bytes, seq, payload length, aux.
// Abort frames carry the reporter in seq, the culprit+1 in aux, and op 1 when
// the rank closed its group gracefully rather than failing.
const (
	frameData      = 1
	frameKeepalive = 2
	frameAbort     = 3
	headerLen      = 16
	maxAbortMsg    = 1024
)

const (
	opAllReduce = 1
	opBroadcast = 2
	opGatherSum = 3 // AllReduce of a small buffer: gather, then sum in the ring's order
	// opGatherLinks: the same, gathered over the ring and skip links (skiplinks.go)
	opGatherLinks = 4
)

type header struct {
	typ, op, flags byte
	seq            uint32
	length         uint32
	aux            uint32
}

func (h header) put(b []byte) {
	b[0], b[1], b[2], b[3] = h.typ, h.op, h.flags, 0
	binary.LittleEndian.PutUint32(b[4:], h.seq)
	binary.LittleEndian.PutUint32(b[8:], h.length)
	binary.LittleEndian.PutUint32(b[12:], h.aux)
}

func parseHeader(b []byte) header {
	return header{typ: b[0], op: b[1], flags: b[2], seq: binary.LittleEndian.Uint32(b[4:]), length: binary.LittleEndian.Uint32(b[8:]), aux: binary.LittleEndian.Uint32(b[12:])}
}

// writeRight sends one frame to the right neighbour.
func (g *Group) writeRight(h header, payload []byte) error {
	var hb [headerLen]byte
	h.put(hb[:])
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	var err error
	if len(payload) <= smallFrame {
		// One write(2) through net.Conn: one syscall, and the runtime records the
		// happens-before edge of network I/O, which writev does not.
		g.frameBuf = append(append(g.frameBuf[:0], hb[:]...), payload...)
		_, err = g.rightConn.Write(g.frameBuf)
	} else {
		bufs := net.Buffers{hb[:], payload}
		_, err = bufs.WriteTo(g.rightConn)
	}
	g.wroteRight()
	return err
}

// wroteRight records a frame written to the right neighbour, under
// writeMu: when, and the longest silence toward it that ended within the
// last StallTimeout (the Silence of a verdict this rank hears after it ran
// again and wrote, a keepalive due or an operation's frames, before it
// read the verdict).
func (g *Group) wroteRight() {
	now := time.Now().UnixNano()
	prev := g.lastWrite.Swap(now)
	// A gap shorter than a keepalive's is never a verdict's silence: the
	// usual case, at every frame, costs one comparison.
	if gap := now - prev; prev != 0 && gap > int64(g.opts.KeepaliveInterval) &&
		(gap >= g.longGap.Load() || now-g.longGapEnd.Load() > int64(g.opts.StallTimeout)) {
		g.longGap.Store(gap)
		g.longGapEnd.Store(now)
	}
}

// silence is how long this rank had sent its right neighbour nothing when
// it heard that neighbour's verdict: the silence still going on, or the
// longest that ended within the last StallTimeout.
func (g *Group) silence() time.Duration {
	now := time.Now().UnixNano()
	s := now - g.lastWrite.Load()
	if now-g.longGapEnd.Load() <= int64(g.opts.StallTimeout) {
		s = max(s, g.longGap.Load())
	}
	return time.Duration(s)
}

// smallFrame is the largest payload copied next to its header for a single write.
const smallFrame = 64 << 10

func (g *Group) keepalive() {
	defer g.wg.Done()
	t := time.NewTicker(g.opts.KeepaliveInterval)
	defer t.Stop()
	// A tick that wakes this goroutine well after it last went back to
	// waiting came late: this process was off its cores (leftSilent). The
	// ticker keeps a tick while a keepalive is written, so a write that
	// waited for the link is followed by a wake at once, not taken for one.
	late := g.opts.KeepaliveInterval + g.opts.StallTimeout/4
	waiting := time.Now()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			if now := time.Now(); now.Sub(waiting) > late {
				g.offCoresAt.Store(now.UnixNano())
			}
			if g.keepaliveOnce() != nil {
				return
			}
			waiting = time.Now()
		}
	}
}

// keepaliveOnce sends a keepalive to the right neighbour unless a frame went
// there lately. An error ends keepalive: the right neighbour closed
// gracefully (nobody to keep informed), or the write failed, which fails
// the group.
func (g *Group) keepaliveOnce() error {
	if time.Since(time.Unix(0, g.lastWrite.Load())) < g.opts.KeepaliveInterval/2 {
		return nil
	}
	if g.rightClosed.Load() {
		return net.ErrClosed
	}
	err := g.writeRight(header{typ: frameKeepalive}, nil)
	if err != nil {
		time.Sleep(culpritGracePeriod) // a graceful close may be what broke the pipe
		if !g.rightClosed.Load() {
			g.failPeer(g.right, "sending keepalive", err)
		}
	}
	return err
}

// readRight watches the reverse direction of the right connection, which
// carries only abort frames: a bare EOF there means the right neighbour died.
func (g *Group) readRight() {
	defer g.wg.Done()
	var hb [headerLen]byte
	for {
		if _, err := io.ReadFull(g.rightConn, hb[:]); err != nil {
			g.blame(g.right, fmt.Sprintf("connection lost: %v", err))
			return
		}
		h := parseHeader(hb[:])
		if h.typ != frameAbort {
			g.failPeer(g.right, "protocol error", fmt.Errorf("unexpected frame type %d on the reverse direction", h.typ))
			return
		}
		if h.op == 1 {
			// The right neighbour closed after finishing its operations: what it
			// sent us is still arriving in order on the left connection, and our
			// next send to it will fail on its own. Nothing to abort yet.
			g.rightClosed.Store(true)
			return
		}
		g.readAbort(g.rightConn, h)
		return
	}
}

// readAbort reads an abort frame's message and fails the group with the culprit it names.
func (g *Group) readAbort(conn io.Reader, h header) {
	msg := make([]byte, min(h.length, maxAbortMsg))
	io.ReadFull(conn, msg)
	culprit := int(h.aux) - 1
	pe := &PeerError{Rank: culprit, Addr: g.addrOf(culprit), Reporter: int(h.seq), Reason: string(msg)}
	if culprit == g.rank && pe.Reporter == g.right && pe.Stalled() {
		pe.Silence = g.silence()
	}
	g.fail(pe, pe)
}
