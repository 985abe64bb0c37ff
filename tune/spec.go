package tune

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/durabletrain/durabletrain/internal/strictjson"
	"github.com/durabletrain/durabletrain/spec"
)

// Spec is a search, as TuneWorkflow takes it (Ray Tune's tune.run arguments):
//
//	{"name": "lr-width", "train": {...a training spec...},
//	 "param_space": {"hyper.lr": {"loguniform": [1e-4, 1e-2]}, "model.hidden": {"grid_search": [[64], [256, 128]]}},
//	 "num_samples": 4, "metric": "test_accuracy", "mode": "max", "scope": "last", "max_concurrent_trials": 2,
//	 "stop": {"training_iteration": 8}, "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2, "max_t": 8},
//	 "search_alg": {"type": "random"}, "seed": 1, "results_url": "file:///var/lib/durabletrain/checkpoints"}
type Spec struct {
	Name                string             `json:"name,omitempty"`                  // names the search's results; default: the workflow ID
	Train               json.RawMessage    `json:"train,omitempty"`                 // the training spec every trial starts from (see the training spec above)
	ParamSpace          map[string]Domain  `json:"param_space"`                     // spec path -> a domain: {"grid_search": [...]}, {"choice": [...]}, {"uniform": [lo, hi]}, {"loguniform": [lo, hi]}, {"randint": [lo, hi]}
	NumSamples          int                `json:"num_samples,omitempty"`           // default 1
	Metric              string             `json:"metric,omitempty"`                // default test_accuracy
	Mode                string             `json:"mode,omitempty"`                  // default max
	Scope               string             `json:"scope,omitempty"`                 // how a trial's values rank it: last (default), all, avg, last-5-avg, last-10-avg
	MaxConcurrentTrials int                `json:"max_concurrent_trials,omitempty"` // default 1
	Stop                map[string]float64 `json:"stop,omitempty"`                  // stop a trial once a value reaches it (training_iteration or a metric)
	Scheduler           SchedulerConfig    `json:"scheduler"`
	SearchAlg           SearcherConfig     `json:"search_alg"`            // how trials' configs are chosen: random (default) or tpe
	Seed                uint64             `json:"seed,omitempty"`        // the searcher's and scheduler's draws
	ResultsURL          string             `json:"results_url,omitempty"` // blob URL results.csv goes under; default the trials' checkpoint URL
}

// TrainingIteration is the stop criterion on epochs done (Ray's name).
const TrainingIteration = "training_iteration"

// Limits of a search: its spec is one workflow input, and its results (a
// row per trial) travel as one Temporal payload, capped at 2 MiB.
const (
	MaxSpecBytes = 64 << 10
	MaxTrials    = 10000
)

// ParseSpec reads a search strictly (unknown fields, wrong types and a 0
// that would become a default are errors naming the field, with its line and
// column, the train spec's included), fills the defaults and validates it,
// naming the field and what is accepted. It expands nothing: a search too
// large is refused from its arithmetic.
func ParseSpec(raw []byte) (Spec, error) {
	var s Spec
	if len(raw) > MaxSpecBytes {
		return s, fmt.Errorf("tune spec: the spec is %d bytes; want at most %d", len(raw), MaxSpecBytes)
	}
	if err := strictjson.Decode(raw, &s, strictjson.As("train", spec.Training{})); err != nil {
		return s, fmt.Errorf("tune spec: %w", err)
	}
	var zeros struct {
		NumSamples          *int `json:"num_samples"`
		MaxConcurrentTrials *int `json:"max_concurrent_trials"`
	}
	json.Unmarshal(raw, &zeros)
	switch {
	case zeros.NumSamples != nil && *zeros.NumSamples == 0:
		return s, fmt.Errorf("tune spec: num_samples is 0; want 1 to %d (leave it out, or null, for 1)", MaxTrials)
	case zeros.MaxConcurrentTrials != nil && *zeros.MaxConcurrentTrials == 0:
		return s, fmt.Errorf("tune spec: max_concurrent_trials is 0; want 1 or more (leave it out, or null, for 1)")
	}
	if s.NumSamples == 0 {
		s.NumSamples = 1
	}
	if s.Metric == "" {
		s.Metric = spec.MetricTestAccuracy
	}
	if s.Mode == "" {
		s.Mode = spec.ModeMax
	}
	if s.MaxConcurrentTrials == 0 {
		s.MaxConcurrentTrials = 1
	}
	if s.Scope == "" {
		s.Scope = spec.ScopeLast
	}
	switch {
	case s.Name != "" && spec.CheckName("name", s.Name) != nil:
		return s, fmt.Errorf("tune spec: %v", spec.CheckName("name", s.Name))
	case len(s.ParamSpace) == 0:
		return s, fmt.Errorf(`tune spec: param_space is empty; want at least one "spec.path": {"grid_search"|"choice"|"uniform"|"loguniform"|"randint": ...}`)
	case s.NumSamples < 1 || s.NumSamples > MaxTrials:
		return s, fmt.Errorf("tune spec: num_samples is %d; want 1 to %d", s.NumSamples, MaxTrials)
	case spec.CheckMetric("metric", s.Metric) != nil:
		return s, fmt.Errorf("tune spec: %v", spec.CheckMetric("metric", s.Metric))
	case spec.CheckMode("mode", s.Mode) != nil:
		return s, fmt.Errorf("tune spec: %v", spec.CheckMode("mode", s.Mode))
	case spec.CheckScope("scope", s.Scope) != nil:
		return s, fmt.Errorf("tune spec: %v", spec.CheckScope("scope", s.Scope))
	case s.MaxConcurrentTrials < 1 || s.MaxConcurrentTrials > MaxTrials:
		return s, fmt.Errorf("tune spec: max_concurrent_trials is %d; want 1 to %d", s.MaxConcurrentTrials, MaxTrials)
	}
	for _, path := range slices.Sorted(maps.Keys(s.ParamSpace)) {
		if err := strictjson.CheckPath(spec.Training{}, path); err != nil {
			return s, fmt.Errorf("tune spec: param_space: %v", err)
		}
	}
	if err := s.SearchAlg.check(s.ParamSpace); err != nil {
		return s, fmt.Errorf("tune spec: %v", err)
	}
	if n, err := trialCount(s.ParamSpace, s.NumSamples); err != nil {
		return s, fmt.Errorf("tune spec: %v", err)
	} else if n < 1 {
		return s, fmt.Errorf("tune spec: the search has no trials")
	}
	for _, k := range slices.Sorted(maps.Keys(s.Stop)) {
		if k != TrainingIteration && spec.CheckMetricName("stop."+boundKey(k), k) != nil {
			return s, fmt.Errorf("tune spec: stop.%s: want %s, or a metric: %s, or one your program reports", boundKey(k), TrainingIteration, strings.Join(spec.Metrics, ", "))
		}
	}
	if _, err := s.NewScheduler(); err != nil {
		return s, fmt.Errorf("tune spec: %v", err)
	}
	if s.ResultsURL != "" {
		if err := spec.CheckURL("results_url", s.ResultsURL); err != nil {
			return s, fmt.Errorf("tune spec: %v", err)
		}
	}
	if len(s.Train) > 0 {
		if _, err := spec.Parse(s.Train); err != nil {
			return s, fmt.Errorf("tune spec: train: %v", err)
		}
	}
	return s, nil
}

// trialCount is how many trials a search expands to (grid cells × samples),
// or an error once it passes MaxTrials, computed without expanding.
func trialCount(space map[string]Domain, samples int) (int, error) {
	n := samples
	for _, k := range slices.Sorted(maps.Keys(space)) {
		if d := space[k]; d.Kind == "grid_search" {
			n *= len(d.Values)
			if n > MaxTrials {
				return 0, fmt.Errorf("the search is at least %d trials (grid_search of param_space.%s and the others, × num_samples %d); want at most %d",
					n, boundKey(k), samples, MaxTrials)
			}
		}
	}
	if n > MaxTrials {
		return 0, fmt.Errorf("the search is %d trials; want at most %d", n, MaxTrials)
	}
	return n, nil
}

func boundKey(k string) string {
	if len(k) > 64 {
		return fmt.Sprintf("%q… (%d bytes)", k[:48], len(k))
	}
	return k
}
