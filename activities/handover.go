package activities

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/spec"
)

// A run continues as new to keep its history short, and its gang goes on:
// the holds of its hosts outlive the run that asked for them, for as long
// as the run asked (its gang timeout, at most MaxHandoverWindow), and the run it continued as takes each over with a
// HoldSlot that names it (spec.Handover). The slots, their keys, the gang's
// collective and the ranks' warm replicas (keyed by workflow ID, generation
// and rank) stay as they were, so the next epoch neither forms a gang nor
// restores a checkpoint.
//
// A hold is handed over only to a running run of the same workflow and the
// same chain of continue-as-new (the same first run) as the holding run,
// once that one has continued as new: no other workflow, nor a new start
// of the same workflow ID, can take slots it was not given.

// A hold whose run continued as new waits this long for the next run to
// take it over (HoldSlotInput.KeepFor, bounded) before its slots are freed.
const (
	DefaultHandoverWindow = time.Minute
	MaxHandoverWindow     = 10 * time.Minute
)

// handoverWindow is how long hold in waits for the next run.
func handoverWindow(in spec.HoldSlotInput) time.Duration {
	if in.KeepFor <= 0 {
		return DefaultHandoverWindow
	}
	return min(time.Duration(in.KeepFor), MaxHandoverWindow)
}

type holdKey struct {
	workflowID string
	generation int
	request    int
}

// hold is the slots one host of a gang holds, and the run that holds them.
type hold struct {
	key       holdKey
	slots     []Slot
	placement spec.Placement

	// runID is the run the hold is for; handed is closed when it passes to
	// the next run (and replaced); removed once its slots are freed. All
	// three are guarded by the table's mutex.
	runID   string
	handed  chan struct{}
	removed bool
	// released is closed when a run let go of the hold (ReleaseHold),
	// which freed its slots.
	released chan struct{}
}

// holdTable is the holds of this worker, by workflow, generation and request.
type holdTable struct {
	mu sync.Mutex
	m  map[holdKey]*hold
}

// add records a new hold for run runID; it returns the hold and the
// channel that closes when the hold passes to the run's successor.
func (t *holdTable) add(k holdKey, runID string, slots []Slot, placement spec.Placement) (*hold, <-chan struct{}) {
	h := &hold{key: k, slots: slots, placement: placement, runID: runID, handed: make(chan struct{}), released: make(chan struct{})}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[holdKey]*hold{}
	}
	t.m[k] = h // an older hold of the same key (a duplicate HoldSlot) keeps its own slots until it ends
	return h, h.handed
}

// remove forgets the hold if runID still holds it, and says whether it did:
// then the caller frees its slots.
func (t *holdTable) remove(h *hold, runID string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h.removed || h.runID != runID {
		return false
	}
	h.removed = true
	if t.m[h.key] == h {
		delete(t.m, h.key)
	}
	return true
}

// release forgets the hold of k if one of runIDs holds it, and returns it:
// then the caller frees its slots.
func (t *holdTable) release(k holdKey, runIDs []string) (*hold, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.m[k]
	if h == nil || h.removed || !slices.Contains(runIDs, h.runID) {
		return nil, false
	}
	h.removed = true
	delete(t.m, k)
	close(h.released)
	return h, true
}

// handOver passes the hold of k from run from to run to, and returns it
// with the channel that closes when it passes on again.
func (t *holdTable) handOver(k holdKey, from, to string) (*hold, <-chan struct{}, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.m[k]
	if h == nil || h.removed || h.runID != from {
		return nil, nil, false
	}
	close(h.handed)
	h.runID, h.handed = to, make(chan struct{})
	return h, h.handed, true
}

// takeOver is HoldSlot for a run that continued as new: it takes over the
// hold the previous run kept for this host, once Temporal shows that the
// asking run was started by the previous run continuing as new.
//
// One question settles it: the asking run is the one Temporal dispatched
// this activity for (its info, not its input), so it is running; the first
// event of its history names the run it continued from and how it began.
// A run continues as new into one run only, and only by closing.
func (a *Agent) takeOver(ctx context.Context, in spec.HoldSlotInput) error {
	info := activity.GetInfo(ctx)
	self := info.WorkflowExecution
	k := holdKey{self.ID, in.Generation, in.Request}
	from := in.Handover.PreviousRunID
	noHold := func(why string) error {
		return temporal.NewNonRetryableApplicationError(fmt.Sprintf("worker %s has no hold of generation %d, host %d of workflow %s to hand over: %s",
			a.Identity, in.Generation, in.Request, self.ID, why), spec.ErrNoSlot, nil)
	}
	a.holds.mu.Lock()
	h := a.holds.m[k]
	known := h != nil && !h.removed && h.runID == from
	a.holds.mu.Unlock()
	if !known {
		return noHold("none is kept for run " + from)
	}
	askCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// Asking may take a busy server a while: the hold heartbeats meanwhile,
	// or the run would time it out as a lost worker.
	beat := func() { activity.RecordHeartbeat(ctx, nil) }
	prev, err := a.continuedFrom(askCtx, activity.GetClient(ctx), info.WorkflowNamespace, self.ID, self.RunID, beat)
	if err != nil {
		return fmt.Errorf("reading how run %s of workflow %s began: %w", self.RunID, self.ID, err)
	}
	if prev != from {
		return noHold(fmt.Sprintf("run %s did not continue as new from run %s (it continued from %q)", self.RunID, from, prev))
	}
	h, handed, ok := a.holds.handOver(k, from, self.RunID)
	if !ok {
		return noHold("its slots were freed")
	}
	in.WorkflowID, in.RunID = self.ID, self.RunID
	return a.keep(ctx, h, handed, in)
}

// handoverGrace is how long a hold whose run stopped holding it (without
// letting it go: ReleaseHold) waits for a successor before asking Temporal
// whether the run continued as new at all.
const handoverGrace = 2 * time.Second

// awaitHandover is called when run in.RunID stopped holding h: if that run
// continued as new, it waits up to its handover window (or until the
// worker stops) for its successor to take the hold over, and says whether
// it did (or the hold was let go of, which freed it).
//
// A run that ends for good lets go of its holds before it closes; one that
// continues as new keeps them. So the hold first waits handoverGrace
// without asking anything (at a boundary of 512 hosts, that is 512
// questions the server is spared), and only a hold not taken over by then
// asks how its run ended: it was terminated, or recorded before runs let
// go of their holds, or its successor is slow to come.
func (a *Agent) awaitHandover(c client.Client, workerStop, handed <-chan struct{}, h *hold, in spec.HoldSlotInput, log *zap.Logger) bool {
	window := handoverWindow(in)
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	a.holds.mu.Lock()
	still := !h.removed && h.runID == in.RunID
	a.holds.mu.Unlock()
	if !still {
		return true // taken over or let go of already
	}
	grace := time.NewTimer(min(window, handoverGrace))
	defer grace.Stop()
	select {
	case <-handed:
		return true
	case <-h.released:
		return true
	case <-workerStop:
		return false
	case <-grace.C:
	}
	if status, err := runStatus(ctx, c, in.WorkflowID, in.RunID); err != nil || status != enumspb.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
		return false // it ended for good
	}
	log.Info("the run continued as new; keeping the slot for its successor", zap.Duration("for", window))
	select {
	case <-handed:
		return true
	case <-h.released:
		return true
	case <-ctx.Done():
		log.Info("the run that continued as new did not take the slot over; freeing it")
		return false
	case <-workerStop:
		return false
	}
}

// continuedFrom is the run that run runID continued as new from, as the
// first event of its history says; empty if it began otherwise (a start, a
// retry, a cron run, a reset). Agent.startedFrom stands for it in tests.
// Asked again, backing off, while the server does not answer.
func (a *Agent) continuedFrom(ctx context.Context, c client.Client, namespace, workflowID, runID string, beat func()) (string, error) {
	if a.startedFrom != nil {
		return a.startedFrom(workflowID, runID)
	}
	var prev string
	err := retryRead(ctx, beat, func(ctx context.Context) error {
		resp, err := c.WorkflowService().GetWorkflowExecutionHistory(ctx, &workflowservice.GetWorkflowExecutionHistoryRequest{
			Namespace: namespace, Execution: &commonpb.WorkflowExecution{WorkflowId: workflowID, RunId: runID}, MaximumPageSize: 1})
		if err != nil {
			return err
		}
		events := resp.GetHistory().GetEvents()
		if len(events) == 0 {
			return fmt.Errorf("run %s of workflow %s has no history", runID, workflowID)
		}
		started := events[0].GetWorkflowExecutionStartedEventAttributes()
		if started.GetInitiator() == enumspb.CONTINUE_AS_NEW_INITIATOR_WORKFLOW {
			prev = started.GetContinuedExecutionRunId()
		}
		return nil
	})
	return prev, err
}

// runStatus is a run's status, asked again, backing off, while the server
// does not answer.
func runStatus(ctx context.Context, c client.Client, workflowID, runID string) (enumspb.WorkflowExecutionStatus, error) {
	var status enumspb.WorkflowExecutionStatus
	err := retryRead(ctx, nil, func(ctx context.Context) error {
		d, err := c.DescribeWorkflowExecution(ctx, workflowID, runID)
		status = d.GetWorkflowExecutionInfo().GetStatus()
		return err
	})
	return status, err
}

// retryRead calls read until it succeeds, Temporal says what it asks for
// does not exist, or ctx ends. A busy server may not answer at once (512
// hosts ask together at a boundary): each try has 5 s, and the next waits
// longer, up to 5 s; beat, if set, is called before each try.
func retryRead(ctx context.Context, beat func(), read func(context.Context) error) error {
	wait := 250 * time.Millisecond
	for {
		if beat != nil {
			beat()
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := read(actx)
		cancel()
		if err == nil {
			return nil
		}
		var notFound *serviceerror.NotFound
		if errors.As(err, &notFound) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}
