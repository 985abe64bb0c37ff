package spec

import (
	"math"
	"strings"
	"testing"
)

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

// TestObserveScoresUnderEveryScope: a trial's score is its last value, its
// best, the mean of every epoch's, or the mean of the newest 5 or 10, as
// the scope says; an epoch reported again (a trial that rolled back to a
// checkpoint redoes it) is not counted twice, and the window stays bounded.
func TestObserveScoresUnderEveryScope(t *testing.T) {
	values := []float64{0.5, 0.9, 0.6, 0.7, 0.8, 0.65, 0.7, 0.75, 0.72, 0.74, 0.76, 0.78}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	for _, c := range []struct {
		scope string
		want  float64
	}{
		{"", values[len(values)-1]},
		{ScopeLast, values[len(values)-1]},
		{ScopeAll, 0.9},
		{ScopeAvg, mean(values)},
		{ScopeLast5Avg, mean(values[len(values)-5:])},
		{ScopeLast10Avg, mean(values[len(values)-10:])},
	} {
		var row TrialStatus
		for e, v := range values {
			row.Observe(EpochMetrics{Epoch: e, TestAccuracy: v}, MetricTestAccuracy, ModeMax, c.scope)
			if e == 6 { // rolled back to epoch 3's checkpoint: epochs 3 to 6 are reported again
				for redo := 3; redo <= 6; redo++ {
					row.Observe(EpochMetrics{Epoch: redo, TestAccuracy: values[redo]}, MetricTestAccuracy, ModeMax, c.scope)
				}
			}
		}
		if row.Score == nil || math.Abs(*row.Score-c.want) > 1e-12 {
			t.Errorf("scope %q: score %v; want %v", c.scope, row.Score, c.want)
		}
		if row.Values != len(values) || len(row.Recent) > MaxScopeWindow {
			t.Errorf("scope %q: %d values counted, %d kept; want %d counted, at most %d kept", c.scope, row.Values, len(row.Recent), len(values), MaxScopeWindow)
		}
	}
	if err := CheckScope("scope", "last-3-avg"); err == nil || !strings.Contains(err.Error(), `scope is "last-3-avg"; want one of`) {
		t.Errorf("a scope Ray does not have: %v; want an error naming the field and the scopes", err)
	}
}
