package spec

import "testing"

// TestCountsCountEveryTrialOnce: a big search's counts add its listed rows,
// the rows it moved out, and, while it runs, the pending trials it does not
// list; an ended search has no pending trial left.
func TestCountsCountEveryTrialOnce(t *testing.T) {
	r := &TuneResults{State: TuneRunning, Total: 1000, Started: 600,
		Trials:   []TrialStatus{{Trial: 598, Status: TrialRunning}, {Trial: 599, Status: TrialCompleted}, {Trial: 600, Status: TrialPending}, {Trial: 601, Status: TrialPending}},
		Unlisted: map[string]int{TrialCompleted: 590, TrialFailed: 8}}
	c := r.Counts()
	if c[TrialPending] != 400 || c[TrialCompleted] != 591 || c[TrialRunning] != 1 || c[TrialFailed] != 8 {
		t.Fatalf("running search: %v; want 400 pending, 591 completed, 1 running, 8 failed", c)
	}
	// Cancelled: the listed pending rows became cancelled, the unlisted ones were counted so.
	r.State = TuneCancelled
	r.Trials[0].Status, r.Trials[2].Status, r.Trials[3].Status = TrialCancelled, TrialCancelled, TrialCancelled
	r.Unlisted[TrialCancelled] = 398
	c = r.Counts()
	total := 0
	for _, n := range c {
		total += n
	}
	if c[TrialPending] != 0 || total != 1000 {
		t.Fatalf("cancelled search: %v (%d trials); want none pending and 1000 in all", c, total)
	}
}
