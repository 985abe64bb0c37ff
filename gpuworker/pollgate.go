package gpuworker

import (
	"context"
	"sync"

	"go.temporal.io/sdk/worker"

	"github.com/durabletrain/durabletrain/activities"
)

// HoldTuner is the worker.Options.Tuner of the worker that serves agent's
// HoldSlot on the shared GPU task queue: it polls only while the agent has a
// free slot (pollGate). Call it once agent.SlotsChanged is set, before the
// agent serves: it chains onto that hook.
func HoldTuner(agent *activities.Agent) (worker.WorkerTuner, error) {
	gate := newPollGate(len(agent.Slots))
	if next := agent.SlotsChanged; next != nil {
		agent.SlotsChanged = func(free, held, withdrawn int) { gate.slotsChanged(free, held, withdrawn); next(free, held, withdrawn) }
	} else {
		agent.SlotsChanged = gate.slotsChanged
	}
	fixed, err := worker.NewFixedSizeSlotSupplier(max(1, len(agent.Slots)))
	if err != nil {
		return nil, err
	}
	return worker.NewCompositeTuner(worker.CompositeTunerOptions{WorkflowSlotSupplier: fixed, ActivitySlotSupplier: gate,
		LocalActivitySlotSupplier: fixed, NexusSlotSupplier: fixed, SessionActivitySlotSupplier: fixed})
}

// pollGate is the slot supplier of the GPU queue's worker: it lets the
// worker poll for one hold at a time, only while the agent has a free slot
// and no hold it took is still taking its slots. A host's hold takes
// several slots at once, so counting running activities
// (MaxConcurrentActivityExecutionSize) would let a full worker take holds
// it can only refuse.
type pollGate struct {
	mu      sync.Mutex
	free    int // the agent's free slots
	polling int // permits handed out and not yet used or released
	// taking are the holds that have arrived and not yet taken their slots
	// (nor ended): until they have, how many slots stay free is unknown,
	// and a poll then could take a hold this worker must refuse.
	taking []*pollPermit
	wake   chan struct{} // closed and replaced whenever free or polling changes
	max    int
}

func newPollGate(slots int) *pollGate {
	return &pollGate{free: slots, max: slots, wake: make(chan struct{})}
}

// pollPermit marks whether its task has started (MarkSlotUsed).
type pollPermit struct{ used bool }

// slotsChanged is told the agent's free slots (Agent.SlotsChanged). Fewer
// free slots than before means a hold took its slots.
func (g *pollGate) slotsChanged(free, _, _ int) {
	g.mu.Lock()
	if free < g.free && len(g.taking) > 0 {
		g.taking = g.taking[1:]
	}
	g.free = free
	g.changed()
	g.mu.Unlock()
}

// settle forgets p as a hold still to take its slots; mu is held.
func (g *pollGate) settle(p *pollPermit) {
	for i, q := range g.taking {
		if q == p {
			g.taking = append(g.taking[:i], g.taking[i+1:]...)
			return
		}
	}
}

// changed wakes the waiting reservations; mu is held.
func (g *pollGate) changed() {
	close(g.wake)
	g.wake = make(chan struct{})
}

func (g *pollGate) ReserveSlot(ctx context.Context, _ worker.SlotReservationInfo) (*worker.SlotPermit, error) {
	for {
		// The look and the channel to wait on are taken under one lock: a
		// change between them (slots freed after a look that found none)
		// would otherwise close a channel this reservation never waits on,
		// and it would sleep through it, a worker with free slots not
		// polling for holds until the next change.
		g.mu.Lock()
		p, wake := g.tryReserveLocked(), g.wake
		g.mu.Unlock()
		if p != nil {
			return p, nil
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (g *pollGate) TryReserveSlot(worker.SlotReservationInfo) *worker.SlotPermit {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.tryReserveLocked()
}

// tryReserveLocked is TryReserveSlot; mu is held.
func (g *pollGate) tryReserveLocked() *worker.SlotPermit {
	// One poll at a time: the SDK may reserve the next permit before it
	// marks the last one used, and until a hold has taken its slots, how
	// many are left is unknown.
	if g.polling > 0 || g.free == 0 || len(g.taking) > 0 {
		return nil
	}
	g.polling++
	return &worker.SlotPermit{UserData: &pollPermit{}}
}

func (g *pollGate) MarkSlotUsed(info worker.SlotMarkUsedInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p, ok := info.Permit().UserData.(*pollPermit); ok && !p.used {
		p.used = true
		g.polling--
		g.taking = append(g.taking, p)
		g.changed()
	}
}

func (g *pollGate) ReleaseSlot(info worker.SlotReleaseInfo) {
	g.mu.Lock()
	defer g.mu.Unlock()
	p, ok := info.Permit().UserData.(*pollPermit)
	if !ok {
		return
	}
	if !p.used {
		p.used = true
		g.polling--
	}
	g.settle(p) // a hold that ended without taking slots (refused, cancelled)
	g.changed()
}

func (g *pollGate) MaxSlots() int { return g.max }
