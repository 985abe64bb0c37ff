package collective

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Host is the ranks of a gang that one process runs (the GPUs of one host),
// for the hierarchical all-reduce: the host's ranks sum their buffers in
// memory, each rank a segment of the vector, in local-rank order; the host's
// first rank carries that sum around the ring of hosts (a Group whose ranks
// are hosts); then every local rank copies the result. The ring carries one
// host's worth of traffic instead of one rank's per GPU, and its length is
// the number of hosts, not of ranks.
//
// Every rank of the gang still ends bit-identical: the ring makes every
// host's leader hold the same sum, and the local ranks copy it. The order of
// summation differs from a flat ring's over the same ranks, so the low bits
// of a sum depend on whether a gang reduced hierarchically.
//
// A Host fails as a whole: a local rank that fails, is cancelled or closes
// while the others wait fails the host's ring membership too, so the other
// hosts hear of it from their neighbours within the ring's own detection
// time, and every local rank returns a *PeerError naming the culprit by its
// rank in the gang.
type Host struct {
	first, n, world int

	joinOnce sync.Once
	joined   chan struct{} // closed once Join has an outcome
	ring     *Group        // nil on a gang of one host

	mu       sync.Mutex
	claimed  []bool
	bufs     [][]float32
	arrived  int
	release  chan struct{} // closed when the current barrier completes
	failed   chan struct{} // closed on failure, or once a view closed
	err      error
	doneOnce sync.Once
}

// NewHost prepares the host whose ranks are first to first+n-1 of a gang of
// world ranks; world must be a multiple of n and first of n (hosts of equal
// size, laid out in rank order).
func NewHost(first, n, world int) (*Host, error) {
	if n < 1 || world < n || world%n != 0 || first < 0 || first%n != 0 || first+n > world {
		return nil, fmt.Errorf("collective: a host of %d ranks from rank %d in a world of %d; want hosts of equal size in rank order", n, first, world)
	}
	return &Host{first: first, n: n, world: world, joined: make(chan struct{}), claimed: make([]bool, n),
		bufs: make([][]float32, n), release: make(chan struct{}), failed: make(chan struct{})}, nil
}

// Hosts is the number of hosts in the gang; Index this host's place among them.
func (h *Host) Hosts() int { return h.world / h.n }
func (h *Host) Index() int { return h.first / h.n }

// Join makes the host a member of the ring of hosts. Every local rank calls
// it; the first call joins and the others wait for its outcome (or their
// context). gang.Peers are the hosts' listener addresses, by host index, and
// gang.PublicKeys their keys, as for a Group of that many ranks.
//
// A failure of the ring fails the host at once, between operations too,
// and opts.OnFailure, if set, is told it as the local ranks are: hosts
// named by their first rank in the gang (a host's rank declared stalled
// hears its verdict, with its silence, as a flat ring's rank does).
func (h *Host) Join(ctx context.Context, ln *Listener, gang Gang, opts Options) error {
	h.joinOnce.Do(func() {
		defer close(h.joined)
		if h.Hosts() == 1 {
			return
		}
		told := opts.OnFailure
		opts.OnFailure = func(err error) {
			err = h.ringError(err)
			h.fail(err)
			if told != nil {
				told(err)
			}
		}
		ring, err := Join(ctx, ln, gang, h.Index(), opts)
		if err != nil {
			h.fail(h.ringError(err))
			return
		}
		h.mu.Lock()
		h.ring = ring
		failed := h.err != nil
		h.mu.Unlock()
		if failed { // a local rank failed while the ring was forming
			ring.Close()
		}
	})
	select {
	case <-h.joined:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Claim takes local rank l's view of the host, once; ok is false if it was
// taken before or the host has failed (a rank that joins again needs a new Host).
func (h *Host) Claim(l int) (v *HostRank, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l < 0 || l >= h.n || h.claimed[l] || h.err != nil {
		return nil, false
	}
	h.claimed[l] = true
	return &HostRank{h: h, local: l}, true
}

// Done is closed once the host has failed or a local rank has closed its view.
func (h *Host) Done() <-chan struct{} { return h.failed }

// fail ends the host with err (the first failure wins) and leaves the ring.
func (h *Host) fail(err error) {
	h.mu.Lock()
	if h.err != nil {
		h.mu.Unlock()
		return
	}
	h.err = err
	ring := h.ring
	h.mu.Unlock()
	h.doneOnce.Do(func() { close(h.failed) })
	if ring != nil {
		ring.Close()
	}
}

// ringError is a failure of the ring as the local ranks report it: hosts
// named by their first rank, the gang's ranks.
func (h *Host) ringError(err error) error {
	var pe *PeerError
	if !errors.As(err, &pe) {
		return err
	}
	out := *pe
	if out.Rank >= 0 {
		out.Rank *= h.n
	}
	out.Reporter *= h.n
	return &out
}

// HostRank is one local rank's view of its Host: a Reducer of the whole gang.
// Operations must be called in the same order with the same lengths on every
// rank of the gang; one at a time per view.
type HostRank struct {
	h      *Host
	local  int
	closed bool // guarded by h.mu
}

// Rank is the view's rank in the gang; World the gang's size.
func (v *HostRank) Rank() int  { return v.h.first + v.local }
func (v *HostRank) World() int { return v.h.world }

// Err reports why the host failed, or nil while it is healthy.
func (v *HostRank) Err() error {
	v.h.mu.Lock()
	defer v.h.mu.Unlock()
	return v.h.err
}

// barrier returns once every local rank has reached it, or with the host's failure.
func (v *HostRank) barrier(ctx context.Context) error {
	h := v.h
	h.mu.Lock()
	if h.err != nil {
		h.mu.Unlock()
		return h.err
	}
	h.arrived++
	if h.arrived == h.n {
		h.arrived = 0
		close(h.release)
		h.release = make(chan struct{})
		h.mu.Unlock()
		return nil
	}
	release := h.release
	h.mu.Unlock()
	select {
	case <-release:
		return nil
	case <-h.failed:
		select {
		case <-release: // completed before the failure
			return nil
		default:
		}
		return v.Err()
	case <-ctx.Done():
		h.fail(&PeerError{Rank: v.Rank(), Reporter: v.Rank(), Reason: fmt.Sprintf("rank %d stopped waiting: %v", v.Rank(), context.Cause(ctx))})
		return v.Err()
	}
}

// AllReduce replaces buf on every rank of the gang by the element-wise sum
// over all ranks, hierarchically: within the host, across hosts, within the host.
func (v *HostRank) AllReduce(ctx context.Context, buf []float32) error {
	return v.op(ctx, buf, -1)
}

// Broadcast copies root's buf to every rank of the gang.
func (v *HostRank) Broadcast(ctx context.Context, buf []float32, root int) error {
	if root < 0 || root >= v.h.world {
		return fmt.Errorf("collective: broadcast root %d out of range; want 0..%d", root, v.h.world-1)
	}
	return v.op(ctx, buf, root)
}

// Barrier returns once every rank of the gang has entered it.
func (v *HostRank) Barrier(ctx context.Context) error { return v.AllReduce(ctx, nil) }

// op is an all-reduce (root < 0) or a broadcast from root, in four steps
// separated by local barriers: deposit the buffers; sum each segment into
// the leader's buffer (or copy the root's there); the leader's ring
// operation; every rank copies the leader's buffer.
func (v *HostRank) op(ctx context.Context, buf []float32, root int) error {
	h := v.h
	h.mu.Lock()
	if v.closed {
		h.mu.Unlock()
		return ErrClosed
	}
	h.bufs[v.local] = buf
	h.mu.Unlock()
	if err := v.barrier(ctx); err != nil {
		return err
	}
	lead := h.bufs[0]
	if v.local == 0 {
		for l, b := range h.bufs {
			if len(b) != len(lead) {
				err := fmt.Errorf("collective: local rank %d passed %d values and local rank 0 %d; every rank must pass the same length", l, len(b), len(lead))
				h.fail(err)
				return err
			}
		}
	}
	if err := v.barrier(ctx); err != nil {
		return err
	}
	rootHost, rootLocal := -1, -1
	if root >= 0 {
		rootHost, rootLocal = root/h.n, root%h.n
	}
	switch {
	case root < 0: // this rank sums its segment of every local buffer into the leader's, in local-rank order
		lo, hi := v.local*len(lead)/h.n, (v.local+1)*len(lead)/h.n
		for _, b := range h.bufs[1:] {
			addInto(lead[lo:hi], b[lo:hi])
		}
	case rootHost == h.Index() && rootLocal == v.local && v.local != 0:
		copy(lead, buf)
	}
	if err := v.barrier(ctx); err != nil {
		return err
	}
	if v.local == 0 && h.ring != nil {
		var err error
		if root < 0 {
			err = h.ring.AllReduce(ctx, lead)
		} else {
			err = h.ring.Broadcast(ctx, lead, rootHost)
		}
		if err != nil {
			err = h.ringError(err)
			h.fail(err)
			return err
		}
	}
	if err := v.barrier(ctx); err != nil {
		return err
	}
	if v.local != 0 {
		copy(buf, lead)
	}
	return v.barrier(ctx) // the leader's buffer is the caller's: keep it until every copy is made
}

// Close leaves the host, which ends it: the other local ranks' operations,
// in progress or later, return a *PeerError naming this rank, as a rank
// leaving a Group fails its neighbours, and the host leaves the ring.
func (v *HostRank) Close() error {
	h := v.h
	h.mu.Lock()
	if v.closed {
		h.mu.Unlock()
		return nil
	}
	v.closed = true
	h.mu.Unlock()
	h.fail(&PeerError{Rank: v.Rank(), Reporter: v.Rank(), Reason: closedReason})
	return nil
}
