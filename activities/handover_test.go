package activities

import (
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

// TestHoldIsHandedOnlyToTheRunItsRunContinuedAs: a HoldSlot asking for a
// handover gets nothing when no hold is kept for the run it names, when
// that run is still running (a stranger naming it), or when it continued
// as another run; the hold stays its run's.
func TestHoldIsHandedOnlyToTheRunItsRunContinuedAs(t *testing.T) {
	const wf, self = "default-test-workflow-id", "default-test-run-id" // the test environment's activity info
	for _, c := range []struct {
		name      string
		keptFor   string // the run whose hold is kept
		continued string // what Temporal says the named run continued as
		want      string
	}{
		{"no hold kept", "", "", "none is kept for run run-0"},
		{"the named run still runs", "run-0", "", "did not continue as run " + self},
		{"it continued as another run", "run-0", "run-other", "did not continue as run " + self},
	} {
		a := &Agent{Identity: "w", Slots: []Slot{{Index: 0}}}
		a.init()
		a.runEnded = func(workflowID, runID string) (string, error) {
			if workflowID != wf || runID != "run-0" {
				t.Fatalf("%s: asked about %s/%s", c.name, workflowID, runID)
			}
			return c.continued, nil
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
