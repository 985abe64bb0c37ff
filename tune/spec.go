package tune

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/durabletrain/durabletrain/spec"
)

// Spec is a search, as TuneWorkflow takes it (Ray Tune's tune.run arguments):
//
//	{"name": "lr-width", "train": {...a training spec...},
//	 "param_space": {"hyper.lr": {"loguniform": [1e-4, 1e-2]}, "model.hidden": {"grid_search": [[64], [256, 128]]}},
//	 "num_samples": 4, "metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2,
//	 "stop": {"training_iteration": 8}, "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2, "max_t": 8},
//	 "seed": 1, "results_url": "file:///var/lib/durabletrain/checkpoints"}
type Spec struct {
	Name                string             `json:"name,omitempty"`
	Train               json.RawMessage    `json:"train,omitempty"`
	ParamSpace          map[string]Domain  `json:"param_space"`
	NumSamples          int                `json:"num_samples,omitempty"`           // default 1
	Metric              string             `json:"metric,omitempty"`                // default test_accuracy
	Mode                string             `json:"mode,omitempty"`                  // default max
	MaxConcurrentTrials int                `json:"max_concurrent_trials,omitempty"` // default 1
	Stop                map[string]float64 `json:"stop,omitempty"`                  // stop a trial once a value reaches it (training_iteration or a metric)
	Scheduler           SchedulerConfig    `json:"scheduler"`
	Seed                uint64             `json:"seed,omitempty"`
	ResultsURL          string             `json:"results_url,omitempty"` // blob URL results.csv goes under; default the trials' checkpoint URL
}

// TrainingIteration is the stop criterion on epochs done (Ray's name).
const TrainingIteration = "training_iteration"

// ParseSpec reads a search strictly (unknown fields are errors), fills the
// defaults and validates it, naming the field and what is accepted.
func ParseSpec(raw []byte) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return s, fmt.Errorf("tune spec: %v", err)
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
	switch {
	case len(s.ParamSpace) == 0:
		return s, fmt.Errorf(`tune spec: param_space is empty; want at least one "spec.path": {"grid_search"|"choice"|"uniform"|"loguniform"|"randint": ...}`)
	case s.NumSamples < 1 || s.NumSamples > 10000:
		return s, fmt.Errorf("tune spec: num_samples is %d; want 1 to 10000", s.NumSamples)
	case spec.CheckMetric("metric", s.Metric) != nil:
		return s, fmt.Errorf("tune spec: %v", spec.CheckMetric("metric", s.Metric))
	case spec.CheckMode("mode", s.Mode) != nil:
		return s, fmt.Errorf("tune spec: %v", spec.CheckMode("mode", s.Mode))
	case s.MaxConcurrentTrials < 1:
		return s, fmt.Errorf("tune spec: max_concurrent_trials is %d; want 1 or more", s.MaxConcurrentTrials)
	}
	for k := range s.Stop {
		if k != TrainingIteration && !slices.Contains(spec.Metrics, k) {
			return s, fmt.Errorf("tune spec: stop.%s: want %s or one of %s", k, TrainingIteration, strings.Join(spec.Metrics, ", "))
		}
	}
	if _, err := New(s.Scheduler, s.Mode); err != nil {
		return s, fmt.Errorf("tune spec: %v", err)
	}
	return s, nil
}
