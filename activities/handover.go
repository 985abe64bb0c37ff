package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/serviceerror"
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
}

// holdTable is the holds of this worker, by workflow, generation and request.
type holdTable struct {
	mu sync.Mutex
	m  map[holdKey]*hold
}

// add records a new hold for run runID; it returns the hold and the
// channel that closes when the hold passes to the run's successor.
func (t *holdTable) add(k holdKey, runID string, slots []Slot, placement spec.Placement) (*hold, <-chan struct{}) {
	h := &hold{key: k, slots: slots, placement: placement, runID: runID, handed: make(chan struct{})}
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
// previous run continued as new and that the asking run is a later run of
// the same chain (the same first run), still running.
func (a *Agent) takeOver(ctx context.Context, in spec.HoldSlotInput) error {
	self := activity.GetInfo(ctx).WorkflowExecution
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
	c := activity.GetClient(ctx)
	// Asking may take a busy server a while: the hold heartbeats meanwhile,
	// or the run would time it out as a lost worker.
	beat := func() { activity.RecordHeartbeat(ctx, nil) }
	status, chain, err := a.describeRun(askCtx, c, self.ID, from, beat)
	if err != nil {
		return fmt.Errorf("reading how run %s of workflow %s ended: %w", from, self.ID, err)
	}
	if status != enumspb.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
		return noHold(fmt.Sprintf("run %s did not continue as new (%s)", from, status))
	}
	selfStatus, selfChain, err := a.describeRun(askCtx, c, self.ID, self.RunID, beat)
	if err != nil {
		return fmt.Errorf("reading run %s of workflow %s: %w", self.RunID, self.ID, err)
	}
	if chain == "" || selfChain != chain || selfStatus != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
		return noHold(fmt.Sprintf("run %s is not a running continuation of run %s (first runs %s and %s)", self.RunID, from, selfChain, chain))
	}
	h, handed, ok := a.holds.handOver(k, from, self.RunID)
	if !ok {
		return noHold("its slots were freed")
	}
	in.WorkflowID, in.RunID = self.ID, self.RunID
	return a.keep(ctx, h, handed, in)
}

// awaitHandover is called when run in.RunID stopped holding h: if that run
// continued as new, it waits up to its handover window (or until the
// worker stops) for its successor to take the hold over, and says whether it did.
func (a *Agent) awaitHandover(c client.Client, workerStop, handed <-chan struct{}, h *hold, in spec.HoldSlotInput, log *zap.Logger) bool {
	window := handoverWindow(in)
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	a.holds.mu.Lock()
	still := !h.removed && h.runID == in.RunID
	a.holds.mu.Unlock()
	if !still {
		return true // taken over already
	}
	if status, _, err := a.describeRun(ctx, c, in.WorkflowID, in.RunID, nil); err != nil || status != enumspb.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW {
		return false // released by the run, or it ended for good
	}
	log.Info("the run continued as new; keeping the slot for its successor", zap.Duration("for", window))
	select {
	case <-handed:
		return true
	case <-ctx.Done():
		log.Info("the run that continued as new did not take the slot over; freeing it")
		return false
	case <-workerStop:
		return false
	}
}

// describeRun is a run's status and the first run of its chain of
// continue-as-new (Agent.describe in tests). A busy server may not answer at
// once (512 hosts ask together at a boundary): it is asked again, backing
// off, until ctx ends; beat, if set, is called before each try.
func (a *Agent) describeRun(ctx context.Context, c client.Client, workflowID, runID string, beat func()) (enumspb.WorkflowExecutionStatus, string, error) {
	if a.describe != nil {
		return a.describe(workflowID, runID)
	}
	wait := 250 * time.Millisecond
	for {
		if beat != nil {
			beat()
		}
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		d, err := c.DescribeWorkflowExecution(actx, workflowID, runID)
		cancel()
		if err == nil {
			info := d.GetWorkflowExecutionInfo()
			return info.GetStatus(), info.GetFirstRunId(), nil
		}
		var notFound *serviceerror.NotFound
		if errors.As(err, &notFound) || ctx.Err() != nil {
			return 0, "", err
		}
		select {
		case <-ctx.Done():
			return 0, "", err
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}
