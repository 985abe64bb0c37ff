package tune

import (
	"slices"
	"testing"
)

// Hand-worked: grace 1, reduction factor 2, max_t 8 gives rungs at 1, 2, 4.
// A rung's cutoff is the 50th percentile (1 - 1/2) of what it has recorded.
func TestASHAHandWorked(t *testing.T) {
	a := NewASHA(1, 2, 8, +1)
	if m := a.Milestones(); !slices.Equal(m, []int{1, 2, 4}) {
		t.Fatalf("milestones %v, want [1 2 4]", m)
	}
	for i, c := range []struct {
		r    Result
		want Decision
		why  string
	}{
		{Result{0, 1, 0.5}, Continue, "first at rung 1: nothing to compare with"},
		{Result{1, 1, 0.6}, Continue, "cutoff 0.5 (the only value), 0.6 is above"},
		{Result{2, 1, 0.4}, Stop, "cutoff median(0.5, 0.6) = 0.55"},
		{Result{0, 2, 0.7}, Continue, "first at rung 2"},
		{Result{1, 2, 0.65}, Stop, "rung 2 cutoff 0.7"},
		{Result{3, 1, 0.55}, Continue, "rung 1 holds 0.5, 0.6, 0.4: median 0.5"},
		{Result{0, 3, 0.8}, Continue, "between rungs: judged at rung 2 already"},
		{Result{3, 2, 0.69}, Continue, "rung 2 holds 0.7, 0.65: cutoff 0.675"},
	} {
		if got := a.OnResult(c.r); got != c.want {
			t.Fatalf("result %d %+v: got %v, want %v (%s)", i, c.r, got, c.want, c.why)
		}
	}
	// T0 reaches rung 4 first: nothing there to compare with.
	if got := a.OnResult(Result{0, 4, 0.1}); got != Continue {
		t.Fatalf("first at rung 4: got %v", got)
	}
	if got := a.OnResult(Result{3, 4, 0.09}); got != Stop {
		t.Fatalf("rung 4 cutoff 0.1, 0.09 below: got %v", got)
	}
}

// For a metric minimised the comparisons turn around.
func TestASHAMinimises(t *testing.T) {
	a := NewASHA(1, 2, 8, -1)
	a.OnResult(Result{0, 1, 0.5})
	if got := a.OnResult(Result{1, 1, 0.4}); got != Continue {
		t.Fatalf("a lower loss than the cutoff: got %v", got)
	}
	if got := a.OnResult(Result{2, 1, 0.6}); got != Stop {
		t.Fatalf("a loss above the median 0.45: got %v", got)
	}
}

// With reduction factor 4 only the top quarter goes on.
func TestASHAReductionFactorFour(t *testing.T) {
	a := NewASHA(1, 4, 100, +1) // rungs 1, 4, 16, 64
	if m := a.Milestones(); !slices.Equal(m, []int{1, 4, 16, 64}) {
		t.Fatalf("milestones %v", m)
	}
	for i, v := range []float64{0.1, 0.2, 0.3, 0.4} {
		a.OnResult(Result{i, 1, v})
	}
	// Recorded 0.1..0.4: the 75th percentile is 0.325.
	if got := a.OnResult(Result{4, 1, 0.32}); got != Stop {
		t.Fatalf("0.32 below the 75th percentile 0.325: got %v", got)
	}
	if got := a.OnResult(Result{5, 1, 0.33}); got != Continue {
		t.Fatalf("0.33 above it: got %v", got)
	}
}

func TestMedianStoppingHandWorked(t *testing.T) {
	s, err := New(SchedulerConfig{Type: "median", GracePeriod: 1, MinSamplesRequired: 2}, "max")
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		r    Result
		want Decision
	}{
		{Result{0, 1, 0.5}, Continue},  // no other trial
		{Result{1, 1, 0.6}, Continue},  // one other: fewer than min_samples_required
		{Result{2, 1, 0.4}, Stop},      // others' means 0.5, 0.6: median 0.55 > best 0.4
		{Result{0, 2, 0.52}, Continue}, // no other trial has 2 results
		{Result{1, 2, 0.61}, Continue}, // one other with 2 results
		{Result{3, 1, 0.58}, Continue}, // others at 1: 0.5, 0.6, 0.4 -> median 0.5 < 0.58
		{Result{3, 2, 0.30}, Continue}, // others' means over 2: T0 0.51, T1 0.605 -> 0.5575; best so far 0.58
		{Result{2, 2, 0.45}, Stop},     // (a stopped trial reporting again is judged the same)
	} {
		if got := s.OnResult(c.r); got != c.want {
			t.Fatalf("result %d %+v: got %v, want %v", i, c.r, got, c.want)
		}
	}
}

func TestNewRejectsBadConfigs(t *testing.T) {
	for _, c := range []struct {
		cfg  SchedulerConfig
		mode string
	}{
		{SchedulerConfig{Type: "hyperband"}, "max"},
		{SchedulerConfig{Type: "asha", ReductionFactor: 1}, "max"},
		{SchedulerConfig{Type: "asha", GracePeriod: 5, MaxT: 5}, "max"},
		{SchedulerConfig{}, "maximum"},
	} {
		if _, err := New(c.cfg, c.mode); err == nil {
			t.Errorf("New(%+v, %q) accepted", c.cfg, c.mode)
		}
	}
}
