package tune

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/durabletrain/durabletrain/internal/strictjson"
	"github.com/durabletrain/durabletrain/spec"
)

// PBT is population-based training (Jaderberg et al., 2017) as Ray Tune's
// PopulationBasedTraining schedules it, asynchronously: each time a trial
// has trained perturbation_interval more epochs, it is ranked among the
// running trials by its latest value; one in the bottom quantile_fraction
// exploits a trial of the top quantile_fraction, chosen at random (it
// continues from that trial's checkpoint, with that trial's config), and
// explores: each of hyperparam_mutations' values is resampled from its
// domain with probability resample_probability, or else multiplied by 1.2
// or 0.8 (a number) or moved to a neighbouring value (a choice), kept
// within the domain. PBT stops no trial: its decisions are Exploit's and
// Explore's. Every draw comes from the search's seed, the trial and the
// iteration, so the same results in the same order give the same decisions.
type PBT struct {
	interval  int
	quantile  float64
	resample  float64
	mutations map[string]Domain
	keys      []string
	sign      float64
	seed      uint64
	latest    map[int]float64 // running trial -> its latest value (sign applied)
	perturbed map[int]int     // trial -> the iteration it was last considered at
}

// PBT's defaults, Ray's where Ray has one (its interval is in its own time
// units; ours is epochs).
const (
	DefaultPerturbationInterval = 2
	DefaultQuantileFraction     = 0.25
	DefaultResampleProbability  = 0.25
)

func newPBT(c SchedulerConfig, sign float64) (*PBT, error) {
	p := &PBT{interval: c.PerturbationInterval, quantile: c.QuantileFraction, resample: DefaultResampleProbability, sign: sign,
		mutations: c.HyperparamMutations, latest: map[int]float64{}, perturbed: map[int]int{}}
	if p.interval == 0 {
		p.interval = DefaultPerturbationInterval
	}
	if p.quantile == 0 {
		p.quantile = DefaultQuantileFraction
	}
	if c.ResampleProbability != nil {
		p.resample = *c.ResampleProbability
	}
	switch {
	case p.interval < 1:
		return nil, fmt.Errorf("scheduler.perturbation_interval is %d; want 1 or more epochs (leave it out for %d)", p.interval, DefaultPerturbationInterval)
	case !(p.quantile > 0 && p.quantile <= 0.5):
		return nil, fmt.Errorf("scheduler.quantile_fraction is %v; want above 0 and at most 0.5 (leave it out for %v)", p.quantile, DefaultQuantileFraction)
	case !(p.resample >= 0 && p.resample <= 1):
		return nil, fmt.Errorf("scheduler.resample_probability is %v; want 0 to 1 (leave it out for %v)", p.resample, DefaultResampleProbability)
	}
	for _, k := range slices.Sorted(maps.Keys(p.mutations)) {
		if err := strictjson.CheckPath(spec.Training{}, k); err != nil {
			return nil, fmt.Errorf("scheduler.hyperparam_mutations: %v", err)
		}
		if p.mutations[k].Kind == "grid_search" {
			return nil, fmt.Errorf(`scheduler.hyperparam_mutations.%s is a grid_search; want choice, uniform, loguniform or randint`, boundKey(k))
		}
	}
	return p, nil
}

// bind completes a PBT of a search: what it mutates (param_space's random
// dimensions, unless hyperparam_mutations names them) and its seed.
func (p *PBT) bind(space map[string]Domain, seed uint64) error {
	p.seed = seed
	if len(p.mutations) == 0 {
		p.mutations = map[string]Domain{}
		for k, d := range space {
			if d.Kind != "grid_search" {
				p.mutations[k] = d
			}
		}
	}
	if len(p.mutations) == 0 {
		return fmt.Errorf(`scheduler "pbt": nothing to mutate; want hyperparam_mutations, or a param_space dimension other than grid_search`)
	}
	p.keys = slices.Sorted(maps.Keys(p.mutations))
	return nil
}

func (p *PBT) OnResult(r Result) Decision {
	v := p.sign * r.Value
	if !finite(v) {
		v = -math.MaxFloat64 // the worst: a diverged trial is the first to exploit
	}
	p.latest[r.Trial] = v
	return Continue
}

// Due says whether a trial's result at iteration is a perturbation point:
// perturbation_interval epochs since it was last considered (Exploit
// decides only at one; a time-shared population pauses a trial only at one).
func (p *PBT) Due(trial, iteration int) bool { return iteration-p.perturbed[trial] >= p.interval }

// Exploit says whether the trial of a result, just recorded by OnResult,
// should continue from a better trial's checkpoint: that trial's number, or
// -1. It decides once each perturbation_interval epochs of the trial.
func (p *PBT) Exploit(r Result) int {
	if !p.Due(r.Trial, r.Iteration) {
		return -1
	}
	p.perturbed[r.Trial] = r.Iteration
	ids := slices.Collect(maps.Keys(p.latest))
	slices.SortFunc(ids, func(a, b int) int {
		switch va, vb := p.latest[a], p.latest[b]; {
		case va < vb:
			return -1
		case va > vb:
			return 1
		}
		return a - b
	})
	n := len(ids)
	k := min(int(math.Ceil(float64(n)*p.quantile)), n/2)
	if k == 0 || !slices.Contains(ids[:k], r.Trial) {
		return -1
	}
	rng := rand.New(rand.NewPCG(p.seed, uint64(r.Trial)<<32|uint64(r.Iteration)))
	return ids[n-k+rng.IntN(k)]
}

// Cloned records that trial took donor's checkpoint: until it reports
// again it ranks as the donor does (its own last value is of weights it
// no longer has).
func (p *PBT) Cloned(trial, donor int) {
	if v, ok := p.latest[donor]; ok {
		p.latest[trial] = v
	}
}

// Explore is the config a trial continues with after it exploited a
// donor: the donor's config with each mutated value resampled or perturbed.
func (p *PBT) Explore(trial, iteration int, donor map[string]json.RawMessage) map[string]json.RawMessage {
	rng := rand.New(rand.NewPCG(p.seed^0x9e3779b97f4a7c15, uint64(trial)<<32|uint64(iteration)))
	cfg := maps.Clone(donor)
	if cfg == nil {
		cfg = map[string]json.RawMessage{}
	}
	for _, k := range p.keys {
		d := p.mutations[k]
		resample := rng.Float64() < p.resample
		up := rng.IntN(2) == 0
		cur, ok := cfg[k]
		if resample || !ok {
			cfg[k] = d.sample(rng)
			continue
		}
		cfg[k] = d.perturb(cur, up, rng)
	}
	return cfg
}

// perturb moves a value: a number by ×1.2 (up) or ×0.8, kept in the
// domain; a choice to the next value up or down the list. A value not of
// the domain is resampled.
func (d Domain) perturb(cur json.RawMessage, up bool, rng *rand.Rand) json.RawMessage {
	if d.Kind == "choice" {
		i := slices.IndexFunc(d.Values, func(v json.RawMessage) bool { return jsonEqual(v, cur) })
		if i < 0 {
			return d.sample(rng)
		}
		if up {
			i = min(i+1, len(d.Values)-1)
		} else {
			i = max(i-1, 0)
		}
		return d.Values[i]
	}
	var v float64
	if json.Unmarshal(cur, &v) != nil || !finite(v) {
		return d.sample(rng)
	}
	factor := 0.8
	if up {
		factor = 1.2
	}
	return d.within(v * factor)
}

type pbtState struct {
	Latest    map[int]float64 `json:"latest"`
	Perturbed map[int]int     `json:"perturbed"`
}
