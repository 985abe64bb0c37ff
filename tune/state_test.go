package tune

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

// TestStateCarriesTheDecisions: a scheduler restored from its state
// midway (as a search that continued as new restores it) decides every
// later result as the one that never stopped, for each scheduler; a state
// of another configuration is refused.
func TestStateCarriesTheDecisions(t *testing.T) {
	for _, c := range []SchedulerConfig{{Type: "fifo"}, {Type: "asha", GracePeriod: 1, ReductionFactor: 2, MaxT: 16}, {Type: "median", GracePeriod: 2, MinSamplesRequired: 2}} {
		whole, _ := New(c, "max")
		first, _ := New(c, "max")
		rng := rand.New(rand.NewPCG(1, 2))
		var results []Result
		for trial := range 40 {
			for it := 1; it <= 12; it++ {
				results = append(results, Result{Trial: trial, Iteration: it, Value: rng.Float64() + float64(it)/10})
			}
		}
		rng.Shuffle(len(results), func(i, j int) { results[i], results[j] = results[j], results[i] })
		var second Scheduler
		for i, r := range results {
			if i == len(results)/2 {
				st, err := State(first)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := json.Marshal(st)
				second, _ = New(c, "max")
				if err := SetState(second, b); err != nil {
					t.Fatalf("%s: %v", c.Type, err)
				}
				first = second
			}
			if a, b := whole.OnResult(r), first.OnResult(r); a != b {
				t.Fatalf("%s: result %d (%+v): %v without continue-as-new, %v after it", c.Type, i, r, a, b)
			}
		}
	}
	asha, _ := New(SchedulerConfig{Type: "asha", GracePeriod: 1, ReductionFactor: 2, MaxT: 16}, "max")
	st, _ := State(asha)
	other, _ := New(SchedulerConfig{Type: "asha", GracePeriod: 1, ReductionFactor: 3, MaxT: 16}, "max")
	if err := SetState(other, st); err == nil {
		t.Fatal("an ASHA state restored into an ASHA of other rungs")
	}
}

// TestForgetKeepsASHAsDecisions: forgetting finished trials shrinks ASHA's
// state and changes none of its decisions about the others.
func TestForgetKeepsASHAsDecisions(t *testing.T) {
	c := SchedulerConfig{Type: "asha", GracePeriod: 1, ReductionFactor: 2, MaxT: 8}
	a, _ := New(c, "max")
	b, _ := New(c, "max")
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 100 {
		for it := 1; it <= 8; it++ {
			r := Result{Trial: trial, Iteration: it, Value: rng.Float64()}
			if x, y := a.OnResult(r), b.OnResult(r); x != y {
				t.Fatalf("trial %d: %v kept, %v forgotten", trial, x, y)
			}
		}
		Forget(b, trial)
	}
	sa, _ := State(a)
	sb, _ := State(b)
	if len(sb) >= len(sa) {
		t.Fatalf("state with finished trials forgotten is %d bytes, kept %d; want smaller", len(sb), len(sa))
	}
}
