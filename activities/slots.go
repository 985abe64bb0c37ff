package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/spec"
)

// slotTable is what the agent knows per slot: whether a gang holds it, the
// epoch running on it, and the latest checkpoint its gang committed. A slot
// serves one rank of one gang at a time.
type slotTable struct {
	mu     sync.Mutex
	order  []Slot
	busy   map[int]bool
	epochs map[int]chan struct{}           // closed when the slot's running RunEpoch returns
	stops  map[int]context.CancelCauseFunc // stops the slot's running RunEpoch
	refs   map[int]*spec.CheckpointRef     // the latest checkpoint the slot's gang committed
	keys   map[int]*slotKey                // the identity of the slot's current hold
	out    map[int]withdrawn               // slots out of service: their GPU is unhealthy
	// changed, if set, is told the free, held and withdrawn counts whenever
	// a slot is taken, freed, withdrawn or brought back (called with mu
	// held: it must not call back).
	changed func(free, held, withdrawn int)
}

func (t *slotTable) notify() {
	if t.changed != nil {
		free := 0
		for _, s := range t.order {
			if _, out := t.out[s.Index]; !out && !t.busy[s.Index] {
				free++
			}
		}
		t.changed(free, len(t.busy), len(t.out))
	}
}

func (t *slotTable) init(slots []Slot) {
	t.order = slots
	t.busy, t.epochs, t.refs, t.keys = map[int]bool{}, map[int]chan struct{}{}, map[int]*spec.CheckpointRef{}, map[int]*slotKey{}
	t.stops, t.out = map[int]context.CancelCauseFunc{}, map[int]withdrawn{}
}

// take reserves the first n free slots, all or none.
func (t *slotTable) take(n int) ([]Slot, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var got []Slot
	for _, s := range t.order {
		if _, out := t.out[s.Index]; len(got) < n && !t.busy[s.Index] && !out {
			got = append(got, s)
		}
	}
	if len(got) < n {
		return nil, false
	}
	for _, s := range got {
		t.busy[s.Index] = true
	}
	t.notify()
	return got, true
}

// free forgets everything about a slot's gang and makes it free again.
func (t *slotTable) free(i int) {
	t.mu.Lock()
	delete(t.busy, i)
	delete(t.refs, i)
	delete(t.keys, i)
	t.notify()
	t.mu.Unlock()
}

func (t *slotTable) setKey(i int, k *slotKey) {
	t.mu.Lock()
	t.keys[i] = k
	t.mu.Unlock()
}

// key is the identity of the slot's hold if the workflow holds it, else nil.
func (t *slotTable) key(i int, workflowID string) *slotKey {
	t.mu.Lock()
	defer t.mu.Unlock()
	if k := t.keys[i]; k != nil && k.workflowID == workflowID {
		return k
	}
	return nil
}

func (t *slotTable) setCheckpoint(i int, ref *spec.CheckpointRef) {
	t.mu.Lock()
	t.refs[i] = ref
	t.mu.Unlock()
}

func (t *slotTable) checkpoint(i int) *spec.CheckpointRef {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.refs[i]
}

// running marks the slot's epoch as running until the returned func is
// called; stop ends it early (stopEpoch).
func (t *slotTable) running(i int, stop context.CancelCauseFunc) func() {
	done := make(chan struct{})
	t.mu.Lock()
	t.epochs[i], t.stops[i] = done, stop
	t.mu.Unlock()
	return func() {
		t.mu.Lock()
		if t.epochs[i] == done {
			delete(t.epochs, i)
			delete(t.stops, i)
		}
		t.mu.Unlock()
		close(done)
	}
}

// stopEpoch cancels the slot's running epoch, if any, with cause.
func (t *slotTable) stopEpoch(i int, cause error) {
	t.mu.Lock()
	stop := t.stops[i]
	t.mu.Unlock()
	if stop != nil {
		stop(cause)
	}
}

// waitEpoch waits until the slot's running epoch, if any, has returned, or at most limit.
func (t *slotTable) waitEpoch(ctx context.Context, i int, limit time.Duration) {
	t.mu.Lock()
	done := t.epochs[i]
	t.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(limit):
	}
}

// latestCheckpoint is the newest checkpoint taken on any of slots, or nil.
func (a *Agent) latestCheckpoint(slots []Slot) *spec.CheckpointRef {
	var ref *spec.CheckpointRef
	for _, s := range slots {
		if c := a.slots.checkpoint(s.Index); c != nil && (ref == nil || c.Epoch > ref.Epoch || c.Epoch == ref.Epoch && c.Step > ref.Step) {
			ref = c
		}
	}
	return ref
}

// slotsTraining says whether an epoch runs on any of slots.
func (a *Agent) slotsTraining(slots []Slot) bool {
	a.slots.mu.Lock()
	defer a.slots.mu.Unlock()
	for _, s := range slots {
		if a.slots.epochs[s.Index] != nil {
			return true
		}
	}
	return false
}

// drainSlots waits until the epochs running on slots, if any, have
// returned, for at most limit, calling beat at every tick meanwhile. It
// says whether they all returned.
func (a *Agent) drainSlots(ctx context.Context, slots []Slot, limit time.Duration, tick <-chan time.Time, beat func()) bool {
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for _, s := range slots {
		a.slots.mu.Lock()
		done := a.slots.epochs[s.Index]
		a.slots.mu.Unlock()
		for waiting := done != nil; waiting; {
			select {
			case <-done:
				waiting = false
			case <-ctx.Done():
				return false
			case <-deadline.C:
				return false
			case <-tick:
				beat()
			}
		}
	}
	return true
}

// HoldSlot reserves free slots for one host of a gang (in.Slots of them,
// on this worker, all or none), tells the workflow where they are, and
// holds them, heartbeating, until the workflow releases them (by
// cancelling) or the worker shuts down (a preemption). A run that continued
// as new takes over its predecessor's hold instead (in.Handover, handover.go).
func (a *Agent) HoldSlot(ctx context.Context, in spec.HoldSlotInput) error {
	a.init()
	if in.Handover != nil {
		return a.takeOver(ctx, in)
	}
	n := max(1, in.Slots)
	if n > spec.MaxWorkersPerHost {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("a hold of %d slots; want at most %d", n, spec.MaxWorkersPerHost), spec.ErrUser, nil)
	}
	a.checkHealth(a.Slots) // an unhealthy GPU is never offered
	slots, ok := a.slots.take(n)
	if !ok {
		return temporal.NewApplicationError(fmt.Sprintf("no %d free healthy slots on %s", n, a.Identity), spec.ErrNoSlot)
	}
	key, err := newSlotKey(in.WorkflowID)
	if err != nil {
		a.freeSlots(in.WorkflowID, slots)
		return err
	}
	placement := spec.Placement{Rank: in.Request, Worker: a.Identity, HostQueue: a.HostQueue, Collective: a.advertise(), Slot: slots[0].Index, GPU: slots[0].GPU,
		PublicKey: key.private.PublicKey().Bytes(), SmallAllReduce: true, GatherLinks: true, HostWindows: true}
	for _, s := range slots {
		a.slots.setKey(s.Index, key)
		if n > 1 {
			placement.Slots = append(placement.Slots, s.Index)
		}
	}
	if a.PoolKey != nil {
		placement.Grant = grantMAC(a.PoolKey, in.WorkflowID, placement.Collective, placement.PublicKey)
	}
	h, handed := a.holds.add(holdKey{in.WorkflowID, in.Generation, in.Request}, in.RunID, slots, placement)
	return a.keep(ctx, h, handed, in)
}

// keep tells the run in.RunID that it holds h, then holds it for that run
// until the run releases it, continues as new (then the next run may take
// it over: handover.go) or the worker stops.
// handed closes when the hold passes on to that run's successor.
func (a *Agent) keep(ctx context.Context, h *hold, handed <-chan struct{}, in spec.HoldSlotInput) error {
	slots, placement := h.slots, h.placement
	kept := false
	defer func() {
		if !kept && a.holds.remove(h, in.RunID) {
			a.freeSlots(in.WorkflowID, slots)
		}
	}()
	if err := activity.GetClient(ctx).SignalWorkflow(ctx, in.WorkflowID, in.RunID, spec.SignalSlotGranted,
		spec.SlotGranted{Generation: in.Generation, Request: in.Request, Attempt: in.Attempt, Placement: placement, RunID: in.RunID}); err != nil {
		return fmt.Errorf("telling workflow %s about slot %d: %w", in.WorkflowID, slots[0].Index, err)
	}
	log := a.Log.With(zap.String("workflow", in.WorkflowID), zap.Int("generation", in.Generation), zap.Int("slot", slots[0].Index))
	if in.Handover != nil {
		log.Info("slot taken over from the run before", zap.Int("host", in.Request), zap.Int("slots", len(slots)), zap.String("previous_run", in.Handover.PreviousRunID))
	} else {
		log.Info("slot held", zap.Int("host", in.Request), zap.Int("slots", len(slots)), zap.String("gpu", slots[0].GPU))
	}
	t := time.NewTicker(heartbeatInterval(ctx))
	defer t.Stop()
	for {
		select {
		case <-handed:
			kept = true // the run continued as new and its successor holds the slots now
			return nil
		case <-h.released:
			kept = true // ReleaseHold freed the slots
			return nil
		case <-ctx.Done():
			// Released by the workflow (the gang ended): the expected end of
			// a hold; or the run continued as new, and its successor may
			// take the slots over with the gang's warm replicas.
			if a.awaitHandover(activity.GetClient(ctx), activity.GetWorkerStopChannel(ctx), handed, h, in, log) {
				kept = true
				return nil
			}
			log.Info("slot released")
			return nil
		case <-activity.GetWorkerStopChannel(ctx):
			// Let the ranks' epoch stop with its gang and checkpoint first,
			// heartbeating all the while: a lease lost now (a save longer
			// than the heartbeat timeout) would break the gang mid-checkpoint
			// and charge the run a failure for a preemption.
			before := a.latestCheckpoint(slots)
			training := a.slotsTraining(slots)
			left := a.drainSlots(ctx, slots, a.leaveTimeout()+time.Second, t.C, func() { activity.RecordHeartbeat(ctx, placement) })
			switch after := a.latestCheckpoint(slots); {
			case !left:
				log.Warn("slot given up: the worker is stopping and its ranks did not leave within the grace", zap.Duration("leave_timeout", a.leaveTimeout()))
				return a.preemptedUnsaved(slots, "its ranks did not leave within the worker's grace")
			case !training:
				log.Info("slot given up: the worker is stopping")
				return a.preemptedUnsaved(slots, "no epoch was training on it")
			case after == nil || before != nil && *after == *before:
				log.Warn("slot given up: the worker is stopping and its ranks left without saving at the stop")
				return a.preemptedUnsaved(slots, "its ranks left without a checkpoint: the grace ran out, their save failed, or they had trained no step since the last one")
			}
			log.Info("slot given up: the worker is stopping")
			return a.preempted(slots)
		case <-t.C:
			activity.RecordHeartbeat(ctx, placement)
		}
	}
}

// ReleaseHold frees a hold of the asking workflow at once (see
// spec.ReleaseHoldInput): it stops any epoch still running on the hold's
// slots, drops their replicas and frees them. A hold already freed, or not
// held by one of in.RunIDs, is left as it is: releasing is idempotent.
func (a *Agent) ReleaseHold(ctx context.Context, in spec.ReleaseHoldInput) error {
	a.init()
	self := activity.GetInfo(ctx).WorkflowExecution // the asker, as Temporal says, not as the input says
	if len(in.RunIDs) == 0 || len(in.RunIDs) > 2 {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("run_ids has %d run IDs; want 1 or 2: the asking run's, and the run it continued from", len(in.RunIDs)), spec.ErrUser, nil)
	}
	h, ok := a.holds.release(holdKey{self.ID, in.Generation, in.Request}, in.RunIDs)
	if !ok {
		return nil
	}
	for _, s := range h.slots {
		a.slots.stopEpoch(s.Index, errReleased)
	}
	for _, s := range h.slots {
		a.slots.waitEpoch(ctx, s.Index, 5*time.Second)
	}
	a.freeSlots(self.ID, h.slots)
	a.Log.Info("slot released by its run", zap.String("workflow", self.ID), zap.Int("generation", in.Generation), zap.Int("host", in.Request),
		zap.Int("slot", h.slots[0].Index), zap.String("run", h.runID))
	return nil
}

// errReleased ends an epoch whose run let go of its slots.
var errReleased = errors.New("the run released the slot")

// freeSlots drops the workflow's replicas on the slots and frees them.
func (a *Agent) freeSlots(workflowID string, slots []Slot) {
	for _, s := range slots {
		a.replicas.dropOn(workflowID, s.Index)
		a.slots.free(s.Index)
	}
}

// SlotUsage is how many of the worker's slots gangs hold, and how many of
// those are running an epoch now.
func (a *Agent) SlotUsage() (held, training int) {
	a.init()
	a.slots.mu.Lock()
	defer a.slots.mu.Unlock()
	return len(a.slots.busy), len(a.slots.epochs)
}
