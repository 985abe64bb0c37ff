package activities

import (
	"sync"
	"testing"

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
