package tune

import (
	"fmt"
	"math"
	"slices"

	"github.com/durabletrain/durabletrain/spec"
)

// Decision is a scheduler's answer to a reported result.
type Decision int

const (
	Continue Decision = iota
	Stop              // stop the trial early, gracefully (it keeps its checkpoints)
)

func (d Decision) String() string {
	if d == Stop {
		return "stop"
	}
	return "continue"
}

// Result is one trial's report after an epoch: Iteration epochs done, and
// the value of the searched metric.
type Result struct {
	Trial     int
	Iteration int
	Value     float64
}

// Scheduler decides, for each reported result in the order results arrive,
// whether the trial goes on. Schedulers are deterministic: the same results
// in the same order give the same decisions, so a workflow can replay them.
type Scheduler interface {
	OnResult(r Result) Decision
}

// SchedulerConfig chooses and configures a scheduler (Ray Tune's names).
type SchedulerConfig struct {
	Type               string  `json:"type,omitempty"`                 // "fifo" (default), "asha" or "median"
	GracePeriod        int     `json:"grace_period,omitempty"`         // asha, median: iterations before any stop; default 1
	ReductionFactor    float64 `json:"reduction_factor,omitempty"`     // asha: default 4
	MaxT               int     `json:"max_t,omitempty"`                // asha: the last rung is below it; default 100
	MinSamplesRequired int     `json:"min_samples_required,omitempty"` // median: other trials needed; default 3
	// pbt (see PBT): epochs between a trial's perturbations; default 2.
	PerturbationInterval int `json:"perturbation_interval,omitempty"`
	// pbt: the bottom and top fractions of trials (the bottom clone the top); default 0.25.
	QuantileFraction float64 `json:"quantile_fraction,omitempty"`
	// pbt: the chance of resampling a value from its domain instead of perturbing it; default 0.25.
	ResampleProbability *float64 `json:"resample_probability,omitempty"`
	// pbt: the dimensions to mutate, spec path -> domain; default: param_space's dimensions other than grid_search.
	HyperparamMutations map[string]Domain `json:"hyperparam_mutations,omitempty"`
}

// NewScheduler builds a search's scheduler: New's, and for PBT bound to
// the search's param_space and seed.
func (s Spec) NewScheduler() (Scheduler, error) {
	sched, err := New(s.Scheduler, s.Mode)
	if p, ok := sched.(*PBT); ok && err == nil {
		err = p.bind(s.ParamSpace, s.Seed)
	}
	return sched, err
}

// New builds the configured scheduler for a metric maximised (mode "max") or
// minimised ("min"); a PBT needs its search (Spec.NewScheduler).
func New(c SchedulerConfig, mode string) (Scheduler, error) {
	if err := spec.CheckMode("mode", mode); err != nil {
		return nil, err
	}
	sign := 1.0
	if mode == spec.ModeMin {
		sign = -1
	}
	if c.GracePeriod == 0 {
		c.GracePeriod = 1
	}
	switch c.Type {
	case "", "fifo":
		return FIFO{}, nil
	case "asha":
		if c.ReductionFactor == 0 {
			c.ReductionFactor = 4
		}
		if c.MaxT == 0 {
			c.MaxT = 100
		}
		switch {
		case c.GracePeriod < 1:
			return nil, fmt.Errorf("scheduler.grace_period is %d; want 1 or more", c.GracePeriod)
		case !(c.ReductionFactor > 1):
			return nil, fmt.Errorf("scheduler.reduction_factor is %v; want above 1", c.ReductionFactor)
		case c.MaxT <= c.GracePeriod:
			return nil, fmt.Errorf("scheduler.max_t is %d; want above scheduler.grace_period (%d)", c.MaxT, c.GracePeriod)
		}
		return NewASHA(c.GracePeriod, c.ReductionFactor, c.MaxT, sign), nil
	case "median":
		if c.MinSamplesRequired == 0 {
			c.MinSamplesRequired = 3
		}
		if c.GracePeriod < 1 || c.MinSamplesRequired < 1 {
			return nil, fmt.Errorf("scheduler.grace_period and scheduler.min_samples_required must be 1 or more")
		}
		return &Median{grace: c.GracePeriod, minSamples: c.MinSamplesRequired, sign: sign, history: map[int][]float64{}}, nil
	case "pbt":
		return newPBT(c, sign)
	}
	return nil, fmt.Errorf(`scheduler.type is %q; want "fifo", "asha", "median" or "pbt"`, c.Type)
}

// FIFO runs every trial to its end (stop criteria aside).
type FIFO struct{}

func (FIFO) OnResult(Result) Decision { return Continue }

// ASHA is asynchronous successive halving (Li et al., "A System for
// Massively Parallel Hyperparameter Tuning"), as Ray Tune's
// AsyncHyperBandScheduler with one bracket: rungs at grace_period ×
// reduction_factor^k below max_t. A trial reaching a rung is stopped if its
// value is below the rung's cutoff, the (1 − 1/reduction_factor) quantile of
// the values recorded there so far; either way its value is recorded. No
// trial waits for others: promotion is decided on arrival.
type ASHA struct {
	maxT  int
	rf    float64
	rungs []rung // highest milestone first
	sign  float64
}

type rung struct {
	milestone int
	recorded  map[int]float64 // trial -> value (sign applied)
	order     []float64       // values in arrival order, for the quantile
}

// NewASHA makes an ASHA scheduler; sign is +1 to maximise, −1 to minimise.
func NewASHA(grace int, rf float64, maxT int, sign float64) *ASHA {
	a := &ASHA{rf: rf, sign: sign, maxT: maxT}
	for k := 0; ; k++ {
		m := float64(grace) * math.Pow(rf, float64(k))
		if m >= float64(maxT) {
			break
		}
		a.rungs = append(a.rungs, rung{milestone: int(math.Round(m)), recorded: map[int]float64{}})
	}
	slices.Reverse(a.rungs)
	return a
}

// Milestones are the rungs' iterations, lowest first.
func (a *ASHA) Milestones() []int {
	var m []int
	for _, r := range a.rungs {
		m = append(m, r.milestone)
	}
	slices.Reverse(m)
	return m
}

func (a *ASHA) OnResult(r Result) Decision {
	if r.Iteration >= a.maxT {
		return Stop // max_t reached: the trial has had all it may
	}
	v := a.sign * r.Value
	for i := range a.rungs {
		g := &a.rungs[i]
		if _, done := g.recorded[r.Trial]; done && r.Iteration >= g.milestone {
			break // this rung (and those below) already judged the trial
		}
		if r.Iteration < g.milestone {
			continue
		}
		decision := Continue
		if cutoff, ok := percentile(g.order, (1-1/a.rf)*100); ok && v < cutoff {
			decision = Stop
		}
		g.recorded[r.Trial] = v
		g.order = append(g.order, v)
		return decision
	}
	return Continue
}

// percentile is numpy's percentile with linear interpolation (its default),
// which Ray Tune's ASHA uses: gonum's stat.Quantile offers other definitions.
func percentile(values []float64, p float64) (float64, bool) {
	if len(values) == 0 {
		return 0, false
	}
	s := slices.Clone(values)
	slices.Sort(s)
	pos := p / 100 * float64(len(s)-1)
	lo := math.Floor(pos)
	hi := math.Ceil(pos)
	if lo == hi {
		return s[int(lo)], true
	}
	return s[int(lo)] + (pos-lo)*(s[int(hi)]-s[int(lo)]), true
}

// Median is Ray Tune's median stopping rule: after grace_period, a trial
// whose best value so far is worse than the median of the other trials'
// running means (over their results up to the same iteration) is stopped,
// once at least min_samples_required other trials have reported that far.
type Median struct {
	grace, minSamples int
	sign              float64
	history           map[int][]float64 // trial -> values by iteration (sign applied)
	order             []int             // trials in first-report order
}

func (m *Median) OnResult(r Result) Decision {
	if _, ok := m.history[r.Trial]; !ok {
		m.order = append(m.order, r.Trial)
	}
	h := append(m.history[r.Trial], m.sign*r.Value)
	m.history[r.Trial] = h
	if r.Iteration < m.grace {
		return Continue
	}
	var means []float64
	for _, t := range m.order {
		o := m.history[t]
		if t == r.Trial || len(o) < r.Iteration {
			continue
		}
		var sum float64
		for _, v := range o[:r.Iteration] {
			sum += v
		}
		means = append(means, sum/float64(r.Iteration))
	}
	if len(means) < m.minSamples {
		return Continue
	}
	median, _ := percentile(means, 50)
	if slices.Max(h) < median {
		return Stop
	}
	return Continue
}
