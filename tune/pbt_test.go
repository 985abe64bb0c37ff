package tune

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func newTestPBT(t *testing.T, c SchedulerConfig, spaceJSON string) *PBT {
	t.Helper()
	c.Type = "pbt"
	s := Spec{Scheduler: c, Mode: "max", ParamSpace: space(t, spaceJSON), Seed: 3}
	sched, err := s.NewScheduler()
	if err != nil {
		t.Fatal(err)
	}
	return sched.(*PBT)
}

// Every perturbation_interval epochs a trial of the bottom quarter exploits
// one of the top quarter; the others go on; nobody is stopped.
func TestPBTExploitsFromTheTopQuantile(t *testing.T) {
	p := newTestPBT(t, SchedulerConfig{PerturbationInterval: 2}, `{"hyper.lr": {"loguniform": [1e-4, 1e-1]}}`)
	for trial := range 8 { // values 0.0 .. 0.7: trials 0, 1 are the bottom quarter, 6, 7 the top
		if p.OnResult(Result{Trial: trial, Iteration: 1, Value: float64(trial) / 10}) != Continue {
			t.Fatal("PBT stopped a trial")
		}
		if d := p.Exploit(Result{Trial: trial, Iteration: 1}); d != -1 {
			t.Fatalf("trial %d exploited %d before its perturbation interval", trial, d)
		}
	}
	for trial := range 8 {
		p.OnResult(Result{Trial: trial, Iteration: 2, Value: float64(trial) / 10})
		d := p.Exploit(Result{Trial: trial, Iteration: 2})
		switch {
		case trial < 2 && d != 6 && d != 7:
			t.Fatalf("trial %d (bottom) exploits %d; want 6 or 7", trial, d)
		case trial >= 2 && d != -1:
			t.Fatalf("trial %d exploits %d; only the bottom quarter does", trial, d)
		}
		if again := p.Exploit(Result{Trial: trial, Iteration: 3}); again != -1 {
			t.Fatalf("trial %d considered again one epoch later", trial)
		}
	}
	// Its state crosses continue-as-new; a finished trial drops out of the ranking.
	st, _ := State(p)
	q := newTestPBT(t, SchedulerConfig{PerturbationInterval: 2}, `{"hyper.lr": {"loguniform": [1e-4, 1e-1]}}`)
	if err := SetState(q, st); err != nil || !reflect.DeepEqual(p.latest, q.latest) || !reflect.DeepEqual(p.perturbed, q.perturbed) {
		t.Fatalf("state %s did not round-trip: %v", st, err)
	}
	Forget(q, 7)
	if _, ok := q.latest[7]; ok {
		t.Fatal("a finished trial is still ranked")
	}
}

// Explore starts from the donor's config and moves each mutated value:
// resampled in its domain, or ×1.2 / ×0.8, or to a neighbouring choice,
// always inside the domain, the same for the same trial and epoch.
func TestPBTExploresWithinTheDomain(t *testing.T) {
	sp := `{"hyper.lr": {"loguniform": [1e-4, 1e-1]}, "hyper.batch_size": {"randint": [16, 257]}, "hyper.optimizer": {"choice": ["sgd", "adam"]}}`
	p := newTestPBT(t, SchedulerConfig{ResampleProbability: new(float64)}, sp) // never resample: always perturb
	donor := map[string]json.RawMessage{"hyper.lr": json.RawMessage(`0.01`), "hyper.batch_size": json.RawMessage(`100`),
		"hyper.optimizer": json.RawMessage(`"sgd"`), "model.hidden": json.RawMessage(`[64]`)}
	ups, downs := 0, 0
	for it := range 200 {
		cfg := p.Explore(1, it, donor)
		if !reflect.DeepEqual(cfg, p.Explore(1, it, donor)) {
			t.Fatal("the same trial and epoch explore differently")
		}
		if string(cfg["model.hidden"]) != "[64]" {
			t.Fatalf("a value not mutated changed: %s", cfg["model.hidden"])
		}
		var lr float64
		var bs int
		json.Unmarshal(cfg["hyper.lr"], &lr)
		json.Unmarshal(cfg["hyper.batch_size"], &bs)
		switch {
		case lr == 0.012 && bs == 120:
			ups++
		case lr == 0.008 && bs == 80:
			downs++
		case (lr != 0.012 && lr != 0.008) || (bs != 120 && bs != 80):
			t.Fatalf("explored lr %v batch %d; want ×1.2 or ×0.8 of 0.01 and 100", lr, bs)
		}
		if o := string(cfg["hyper.optimizer"]); o != `"sgd"` && o != `"adam"` {
			t.Fatalf("optimizer %s", o)
		}
	}
	if ups == 0 || downs == 0 {
		t.Fatalf("%d ups, %d downs of both together", ups, downs)
	}
	// At the edge of the domain a value stays inside it; resampling draws from it.
	p = newTestPBT(t, SchedulerConfig{}, sp)
	for it := range 200 {
		cfg := p.Explore(2, it, map[string]json.RawMessage{"hyper.lr": json.RawMessage(`0.099`), "hyper.batch_size": json.RawMessage(`256`)})
		var lr float64
		var bs int
		json.Unmarshal(cfg["hyper.lr"], &lr)
		json.Unmarshal(cfg["hyper.batch_size"], &bs)
		if !(lr >= 1e-4 && lr < 1e-1) || bs < 16 || bs > 256 {
			t.Fatalf("explored lr %v batch %d outside the domain", lr, bs)
		}
	}
}

func TestPBTConfigErrorsNameTheField(t *testing.T) {
	for _, tc := range []struct {
		c     SchedulerConfig
		space string
		want  string
	}{
		{SchedulerConfig{PerturbationInterval: -1}, `{"hyper.lr": {"uniform": [0.1, 0.2]}}`, "scheduler.perturbation_interval is -1"},
		{SchedulerConfig{QuantileFraction: 0.7}, `{"hyper.lr": {"uniform": [0.1, 0.2]}}`, "scheduler.quantile_fraction is 0.7; want above 0 and at most 0.5"},
		{SchedulerConfig{HyperparamMutations: space(t, `{"hyper.rate": {"uniform": [0.1, 0.2]}}`)}, `{"hyper.lr": {"uniform": [0.1, 0.2]}}`, `scheduler.hyperparam_mutations: "hyper.rate": unknown field`},
		{SchedulerConfig{}, `{"model.hidden": {"grid_search": [[64], [32]]}}`, "nothing to mutate"},
	} {
		tc.c.Type = "pbt"
		s := Spec{Scheduler: tc.c, Mode: "max", ParamSpace: space(t, tc.space)}
		if _, err := s.NewScheduler(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.c, err, tc.want)
		}
	}
}
