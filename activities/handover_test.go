package activities

import (
	"strings"
	"sync"
	"testing"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/testsuite"

	"github.com/durabletrain/durabletrain/spec"
)

// TestHoldPassesToOneRunOnly: a hold passes from the run that holds it to
// the next, once; the run it passed from can no longer free it; a hold
// already freed passes to nobody; and when the run that holds it frees it
// while its successor asks, exactly one of them wins.
func TestHoldPassesToOneRunOnly(t *testing.T) {
	var tab holdTable
	k := holdKey{"wf", 1, 0}
	h, handed := tab.add(k, "run-1", []Slot{{Index: 0}}, spec.Placement{})
	if _, _, ok := tab.handOver(k, "run-0", "run-2"); ok {
		t.Fatal("a run that never held the hold took it")
	}
	if _, _, ok := tab.handOver(holdKey{"other", 1, 0}, "run-1", "run-2"); ok {
		t.Fatal("a hold passed under another workflow's key")
	}
	_, next, ok := tab.handOver(k, "run-1", "run-2")
	if !ok || !isClosed(handed) || isClosed(next) {
		t.Fatalf("handOver ok=%v, old channel closed=%v, new closed=%v; want passed, old closed, new open", ok, isClosed(handed), isClosed(next))
	}
	if _, _, ok := tab.handOver(k, "run-1", "run-3"); ok {
		t.Fatal("the same hold passed twice from run-1")
	}
	if tab.remove(h, "run-1") {
		t.Fatal("run-1 freed a hold it had passed on")
	}
	if !tab.remove(h, "run-2") || tab.remove(h, "run-2") {
		t.Fatal("run-2 could not free its hold exactly once")
	}
	if _, _, ok := tab.handOver(k, "run-2", "run-3"); ok {
		t.Fatal("a freed hold passed on")
	}

	for range 200 {
		h, _ := tab.add(k, "a", nil, spec.Placement{})
		var freed, passed bool
		var wg sync.WaitGroup
		wg.Go(func() { freed = tab.remove(h, "a") })
		wg.Go(func() { _, _, passed = tab.handOver(k, "a", "b") })
		wg.Wait()
		if freed == passed {
			t.Fatalf("freed %v and passed %v; want exactly one", freed, passed)
		}
		tab.remove(h, "b")
	}
}

// TestHoldIsHandedOnlyToItsRunsContinuation: a HoldSlot asking for a
// handover gets nothing when no hold is kept for the run it names, when
// that run is still running (a stranger naming it), when the asking run is
// of another chain (a new start of the same workflow ID) or has ended; the
// hold stays its run's.
func TestHoldIsHandedOnlyToItsRunsContinuation(t *testing.T) {
	const wf, self = "default-test-workflow-id", "default-test-run-id" // the test environment's activity info
	type answer struct {
		status enumspb.WorkflowExecutionStatus
		first  string
	}
	can := enumspb.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW
	running := enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING
	for _, c := range []struct {
		name      string
		keptFor   string // the run whose hold is kept
		prev, now answer // what Temporal says of run-0 and of the asking run
		want      string
	}{
		{"no hold kept", "", answer{can, "run-0"}, answer{running, "run-0"}, "none is kept for run run-0"},
		{"the named run still runs", "run-0", answer{running, "run-0"}, answer{running, "run-0"}, "did not continue as new"},
		{"another chain of the same ID", "run-0", answer{can, "run-0"}, answer{running, "run-x"}, "is not a running continuation"},
		{"the asking run has ended", "run-0", answer{can, "run-0"}, answer{enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED, "run-0"}, "is not a running continuation"},
	} {
		a := &Agent{Identity: "w", Slots: []Slot{{Index: 0}}}
		a.init()
		a.describe = func(workflowID, runID string) (enumspb.WorkflowExecutionStatus, string, error) {
			switch {
			case workflowID != wf:
			case runID == "run-0":
				return c.prev.status, c.prev.first, nil
			case runID == self:
				return c.now.status, c.now.first, nil
			}
			t.Fatalf("%s: asked about %s/%s", c.name, workflowID, runID)
			return 0, "", nil
		}
		var h *hold
		if c.keptFor != "" {
			slots, _ := a.slots.take(1)
			h, _ = a.holds.add(holdKey{wf, 1, 0}, c.keptFor, slots, spec.Placement{})
		}
		var suite testsuite.WorkflowTestSuite
		env := suite.NewTestActivityEnvironment()
		env.RegisterActivity(a.HoldSlot)
		_, err := env.ExecuteActivity(a.HoldSlot, spec.HoldSlotInput{WorkflowID: wf, RunID: self, Generation: 1, Request: 0,
			Handover: &spec.Handover{PreviousRunID: "run-0"}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%s: %v; want refused: %q", c.name, err, c.want)
		}
		if h != nil && (h.runID != c.keptFor || h.removed) {
			t.Fatalf("%s: the hold is now %s's (removed %v); want it kept for %s", c.name, h.runID, h.removed, c.keptFor)
		}
	}
}
