package collective

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// connect dials rank `to` and accepts rank `from` through ln, at once, and
// checks that both share this rank's flags. It returns when both
// connections are up, or with the first error (closing what it opened).
func (g *Group) connect(ctx context.Context, ln *Listener, to, from int) (out, in net.Conn, err error) {
	dialSecret, err := linkSecret(g.gang, g.rank, g.rank, to, g.opts)
	if err != nil {
		return nil, nil, err
	}
	acceptSecret, err := linkSecret(g.gang, g.rank, from, g.rank, g.opts)
	if err != nil {
		return nil, nil, err
	}
	type result struct {
		conn  net.Conn
		flags byte
		err   error
	}
	dialed, accepted := make(chan result, 1), make(chan result, 1)
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		c, flags, err := g.dial(jctx, to, dialSecret)
		dialed <- result{c, flags, err}
	}()
	go func() {
		k := connKey{run: g.gang.Run, gen: g.gang.Generation, from: uint32(from), to: uint32(g.rank), world: uint32(g.world)}
		c, flags, err := ln.accept(jctx, k, acceptSecret, g.flags)
		if err != nil {
			err = fmt.Errorf("collective: rank %d: waiting for rank %d (%s) to connect: %w", g.rank, from, g.gang.Peers[from], err)
		}
		accepted <- result{c, flags, err}
	}()
	var firstErr error
	for range 2 {
		var r result
		peer := to
		select {
		case r = <-dialed:
			out = r.conn
		case r = <-accepted:
			in, peer = r.conn, from
		}
		if r.err == nil && r.flags != g.flags {
			// The other half goes on: its peer learns of the difference from
			// this rank's flags, at once, rather than wait for its context.
			if firstErr == nil {
				firstErr = flagsDiffer(peer, g.gang.Peers[peer], r.flags, g.rank, g.flags)
			}
			continue
		}
		if r.err != nil && firstErr == nil {
			firstErr = r.err
			cancel()
		}
	}
	if firstErr != nil {
		for _, c := range []net.Conn{out, in} {
			if c != nil {
				c.Close()
			}
		}
		return nil, nil, firstErr
	}
	return out, in, nil
}

// flagsDiffer is Join's error for a neighbour whose flags differ from this
// rank's, naming the first option that differs.
func flagsDiffer(peer int, addr string, theirs byte, rank int, ours byte) error {
	if (theirs^ours)&flagGatherLinks != 0 {
		return fmt.Errorf("collective: rank %d (%s) %s small all-reduces over links to the ranks 2, 4, 8, ... away and rank %d %s: every rank needs the same options.GatherLinks, GatherBytes and Transport, and a release that has GatherLinks (0.6.0 or later)",
			peer, addr, gathersWord(theirs), rank, gathersWord(ours))
	}
	word := func(f byte) string {
		if f&flagHostWindows != 0 {
			return "reduces through host windows"
		}
		return "does not reduce through host windows"
	}
	return fmt.Errorf("collective: rank %d (%s) %s and rank %d %s: every rank needs the same options.HostWindows, and a release that has it (0.6.0 or later)",
		peer, addr, word(theirs), rank, word(ours))
}

func gathersWord(flags byte) string {
	if flags&flagGatherLinks != 0 {
		return "gathers"
	}
	return "does not gather"
}

// ranksOnHost counts the gang's ranks whose listener is on the same host as rank's.
func ranksOnHost(peers []string, rank int) int {
	host, _, err := net.SplitHostPort(peers[rank])
	if err != nil {
		return 1
	}
	n := 0
	for _, p := range peers {
		if h, _, err := net.SplitHostPort(p); err == nil && h == host {
			n++
		}
	}
	return n
}

// dial connects to rank `to`, retrying until its listener is up, and
// returns the connection and the flags its acceptor answered with.
func (g *Group) dial(ctx context.Context, to int, secret []byte) (net.Conn, byte, error) {
	addr := g.gang.Peers[to]
	h := hello{Run: g.gang.Run, Generation: g.gang.Generation, From: uint32(g.rank), To: uint32(to), World: uint32(g.world), Flags: g.flags}
	backoff := 20 * time.Millisecond
	var d net.Dialer
	var refusedSince time.Time     // when the address began refusing, if it does
	var unreachableSince time.Time // when an attempt began that got no answer, if one did
	for {
		attempt, started := ctx, time.Now()
		cancelAttempt := func() {}
		if g.opts.UnreachableTimeout > 0 {
			attempt, cancelAttempt = context.WithTimeout(ctx, g.opts.UnreachableTimeout)
		}
		conn, err := d.DialContext(attempt, "tcp", addr)
		cancelAttempt()
		switch {
		case err == nil || !errors.Is(err, syscall.ECONNREFUSED):
			refusedSince = time.Time{}
		case refusedSince.IsZero():
			refusedSince = time.Now()
		case g.opts.RefusedTimeout > 0 && time.Since(refusedSince) >= g.opts.RefusedTimeout:
			return nil, 0, &PeerError{Rank: to, Addr: addr, Reporter: g.rank,
				Reason: fmt.Sprintf("its address refused connections for %v: nothing listens there (its worker is gone)", time.Since(refusedSince).Round(time.Millisecond))}
		}
		if err == nil || ctx.Err() != nil || !unanswered(err) {
			unreachableSince = time.Time{}
		} else if g.opts.UnreachableTimeout > 0 {
			if unreachableSince.IsZero() {
				unreachableSince = started
			}
			if time.Since(unreachableSince) >= g.opts.UnreachableTimeout {
				return nil, 0, &PeerError{Rank: to, Addr: addr, Reporter: g.rank,
					Reason: fmt.Sprintf("its address answered no connection attempt for %v (%v): its host is cut off or gone", time.Since(unreachableSince).Round(time.Millisecond), err)}
			}
		}
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			var flags byte
			flags, err = dialHandshake(ctx, conn, secret, h)
			if err == nil {
				return conn, flags, nil
			}
			conn.Close()
			if errors.Is(err, errAuth) {
				return nil, 0, fmt.Errorf("collective: rank %d: connecting to rank %d (%s): %w", g.rank, to, addr, err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("collective: rank %d: connecting to rank %d (%s): %w (last error: %v)", g.rank, to, addr, ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
		if g.opts.RefusedTimeout > 0 && !refusedSince.IsZero() {
			backoff = min(backoff, g.opts.RefusedTimeout/4) // look again within the timeout
		}
	}
}

// unanswered reports whether a connection attempt failed for want of any
// answer from the address: it timed out, or the network says the host
// cannot be reached. A refusal is an answer (RefusedTimeout).
func unanswered(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH)
}
