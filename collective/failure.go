package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
)

// PeerError is the error every rank returns when the group fails: Rank names
// the peer that died, stalled, refused us or aborted, as seen by Reporter.
type PeerError struct {
	Rank     int    // the culprit; -1 when no peer is to blame (the caller cancelled)
	Addr     string // the culprit's listener address, when known
	Reporter int    // the rank that first detected the failure
	Reason   string
	// Silence is set on the error of a rank that heard its right neighbour
	// (the rank it sends to) declare it stalled: how long it had sent that
	// neighbour nothing when the verdict reached it. A rank that hears its
	// verdict ran and could be reached; one whose Silence is a little over
	// the StallTimeout was starved of CPU or paused, not hung, and a longer
	// StallTimeout would have kept its gang.
	Silence time.Duration
}

// ReasonStalled begins the Reason of a PeerError whose culprit sent its
// accuser nothing, not even a keepalive, for the accuser's StallTimeout.
const ReasonStalled = "stalled"

// Stalled reports whether the error declares its culprit stalled.
func (e *PeerError) Stalled() bool {
	return e.Rank >= 0 && strings.HasPrefix(e.Reason, ReasonStalled+":")
}

func (e *PeerError) Error() string {
	if e.Rank < 0 {
		return fmt.Sprintf("collective: group aborted by rank %d: %s", e.Reporter, e.Reason)
	}
	return fmt.Sprintf("collective: rank %d (%s) failed, detected by rank %d: %s", e.Rank, e.Addr, e.Reporter, e.Reason)
}

// closedReason is the abort message of a rank that closes its group.
const closedReason = "rank closed the group"

// ErrClosed is returned by operations on a group closed by its own rank.
var ErrClosed = errors.New("collective: group closed")

func (g *Group) addrOf(rank int) string {
	if rank >= 0 && rank < len(g.gang.Peers) {
		return g.gang.Peers[rank]
	}
	return ""
}

// abortWhenDone aborts the group, naming nobody, if ctx ends before the
// returned stop is called: a caller that cancels operation seq ends it on
// every rank.
func (g *Group) abortWhenDone(ctx context.Context, seq uint32) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		reason := fmt.Sprintf("operation #%d cancelled: %v", seq, context.Cause(ctx))
		pe := &PeerError{Rank: -1, Reporter: g.rank, Reason: reason}
		g.fail(pe, pe)
	})
}

// failPeer fails the group blaming a neighbour, unless that neighbour's own
// abort frame (naming the real culprit) arrives within a short grace period.
func (g *Group) failPeer(peer int, what string, err error) {
	select {
	case <-g.done:
		return
	default:
	}
	if peer == g.right {
		// The right neighbour may have aborted on purpose: its abort frame is on the way.
		select {
		case <-g.done:
			return
		case <-time.After(culpritGracePeriod):
		}
	}
	g.blame(peer, fmt.Sprintf("%s: %v", what, err))
}

// blame fails the group naming peer as the culprit.
func (g *Group) blame(peer int, reason string) {
	pe := &PeerError{Rank: peer, Addr: g.addrOf(peer), Reporter: g.rank, Reason: reason}
	g.fail(pe, pe)
}

// fail records the group's first error, tells both neighbours whom to blame
// (pe travels in the abort frame), and closes the connections so that every
// blocked call returns. local is what this rank's callers get.
func (g *Group) fail(local error, pe *PeerError) {
	g.failOnce.Do(func() {
		if g.windows != nil && local != ErrClosed {
			// Before any caller can see the error (and close the group,
			// marking its window closed): a peer that finds the window
			// closed then finds why.
			g.publishWindowFailure(pe)
		}
		g.err = local
		close(g.done)
		if g.opts.OnFailure != nil && local != ErrClosed {
			go g.opts.OnFailure(local)
		}
		if g.world == 1 {
			return
		}
		if g.waker != nil {
			g.waker.wake() // a progress loop waiting in poll(2)
		}
		g.wakeRings()
		if g.windows != nil {
			g.wakeWindows()
		}
		if local != ErrClosed && pe.Reason != closedReason {
			g.log.Warn("collective group failed", zap.Int("culprit", pe.Rank), zap.Int("reporter", pe.Reporter), zap.String("reason", pe.Reason))
		}
		reason := pe.Reason
		if len(reason) > maxAbortMsg {
			reason = reason[:maxAbortMsg]
		}
		frame := make([]byte, headerLen+len(reason))
		var graceful byte
		if local == ErrClosed {
			graceful = 1
		}
		header{typ: frameAbort, op: graceful, seq: uint32(pe.Reporter), length: uint32(len(reason)), aux: uint32(pe.Rank + 1)}.put(frame)
		copy(frame[headerLen:], reason)
		type side struct {
			conn net.Conn
			mu   *sync.Mutex
		}
		sides := []side{{g.rightConn, &g.writeMu}, {g.leftConn, &g.leftWriteMu}}
		g.skipConns(func(c net.Conn, mu *sync.Mutex) { sides = append(sides, side{c, mu}) })
		var wg sync.WaitGroup
		for _, side := range sides {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Unblock a writer stuck on a peer that does not read, then send the abort.
				side.conn.SetWriteDeadline(time.Now().Add(abortWriteTimeout))
				side.mu.Lock()
				side.conn.Write(frame)
				side.mu.Unlock()
			}()
		}
		wg.Wait()
		for _, side := range sides {
			side.conn.Close()
		}
	})
}
