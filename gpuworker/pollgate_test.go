package gpuworker

import (
	"context"
	"testing"
	"time"

	"go.temporal.io/sdk/worker"
)

// used and released are what the SDK tells a slot supplier about a permit.
type used struct {
	worker.SlotMarkUsedInfo
	p *worker.SlotPermit
}

func (i used) Permit() *worker.SlotPermit { return i.p }

type released struct {
	worker.SlotReleaseInfo
	p *worker.SlotPermit
}

func (i released) Permit() *worker.SlotPermit { return i.p }

// TestPollGateAsksForHoldsOnlyWhileASlotIsFree: a worker whose slots a
// host's hold has filled stops polling, and polls again once they are freed.
func TestPollGateAsksForHoldsOnlyWhileASlotIsFree(t *testing.T) {
	g := newPollGate(2)
	a := g.TryReserveSlot(nil)
	if a == nil || g.TryReserveSlot(nil) != nil {
		t.Fatal("free slots should allow exactly one poll at a time")
	}
	g.MarkSlotUsed(used{p: a}) // a hold arrived on poll a
	if g.TryReserveSlot(nil) != nil {
		t.Fatal("a worker polled while a hold it took had not yet taken its slots")
	}
	g.slotsChanged(0, 2, 0) // the hold took both slots
	if g.TryReserveSlot(nil) != nil {
		t.Fatal("a worker with no free slot polled")
	}
	got := make(chan *worker.SlotPermit, 1)
	go func() {
		p, _ := g.ReserveSlot(context.Background(), nil)
		got <- p
	}()
	select {
	case <-got:
		t.Fatal("a reservation went through with no free slot")
	case <-time.After(50 * time.Millisecond):
	}
	g.ReleaseSlot(released{p: a}) // the hold ended
	g.slotsChanged(2, 0, 0)
	select {
	case p := <-got:
		if p == nil {
			t.Fatal("no permit once slots were freed")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a waiting reservation was not woken when slots were freed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.slotsChanged(0, 2, 0)
	cancel()
	if _, err := g.ReserveSlot(ctx, nil); err == nil {
		t.Fatal("a cancelled reservation returned a permit")
	}
}
