package activities

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

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
// handover gets nothing when no hold is kept for the run it names, or when
// the asking run (the one Temporal dispatched the activity for, so running)
// did not continue as new from that run: it began otherwise (a new start of
// the same workflow ID, a retry), or continued from another run; the hold
// stays its run's. Temporal starts a run's continuation only when that run
// closes, so a still-running named run cannot be claimed.
func TestHoldIsHandedOnlyToItsRunsContinuation(t *testing.T) {
	const wf, self = "default-test-workflow-id", "default-test-run-id" // the test environment's activity info
	for _, c := range []struct {
		name    string
		keptFor string // the run whose hold is kept
		began   string // the run the asking run continued from, as its history says
		want    string
	}{
		{"no hold kept", "", "run-0", "none is kept for run run-0"},
		{"the asking run did not continue as new", "run-0", "", "did not continue as new from run run-0"},
		{"the asking run continued from another run", "run-0", "run-x", "did not continue as new from run run-0"},
	} {
		a := &Agent{Identity: "w", Slots: []Slot{{Index: 0}}}
		a.init()
		a.startedFrom = func(workflowID, runID string) (string, error) {
			if workflowID != wf || runID != self {
				t.Fatalf("%s: asked about %s/%s; want the asking run", c.name, workflowID, runID)
			}
			return c.began, nil
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

// TestReleaseHoldFreesOnlyItsRunsHold: ReleaseHold frees the asking
// workflow's hold at once when one of the named runs holds it, stopping
// the epoch still running on its slots; it leaves alone a hold of another
// run, and one of another workflow under the same generation and request;
// asked twice, the second does nothing.
func TestReleaseHoldFreesOnlyItsRunsHold(t *testing.T) {
	const wf = "default-test-workflow-id" // the test environment's activity info
	a := &Agent{Identity: "w", Slots: []Slot{{Index: 0}, {Index: 1}, {Index: 2}}}
	a.init()
	mine, _ := a.slots.take(2)
	h, _ := a.holds.add(holdKey{wf, 3, 1}, "run-1", mine, spec.Placement{})
	theirs, _ := a.slots.take(1)
	other, _ := a.holds.add(holdKey{"other-workflow", 3, 1}, "run-1", theirs, spec.Placement{})
	epoch, stop := context.WithCancelCause(context.Background())
	done := a.slots.running(mine[1].Index, stop)
	go func() { <-epoch.Done(); done() }()

	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	env.RegisterActivity(a.ReleaseHold)
	release := func(runIDs ...string) {
		t.Helper()
		if _, err := env.ExecuteActivity(a.ReleaseHold, spec.ReleaseHoldInput{Generation: 3, Request: 1, RunIDs: runIDs}); err != nil {
			t.Fatal(err)
		}
	}
	release("run-0", "run-2")
	if h.removed || isClosed(h.released) {
		t.Fatal("a run that does not hold the hold released it")
	}
	release("run-2", "run-1")
	if !h.removed || !isClosed(h.released) {
		t.Fatal("the run holding the hold could not release it")
	}
	if !errors.Is(context.Cause(epoch), errReleased) {
		t.Fatalf("the epoch on the released slot: %v; want stopped as released", context.Cause(epoch))
	}
	if held, _ := a.SlotUsage(); held != 1 {
		t.Fatalf("%d slots held after the release; want 1 (the other workflow's)", held)
	}
	if other.removed {
		t.Fatal("another workflow's hold of the same generation and request was released")
	}
	release("run-1") // again: nothing to do
	if _, err := env.ExecuteActivity(a.ReleaseHold, spec.ReleaseHoldInput{Generation: 3, Request: 1}); err == nil || !strings.Contains(err.Error(), "run_ids") {
		t.Fatalf("a release naming no run: %v; want an error naming run_ids", err)
	}
}
