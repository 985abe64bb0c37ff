package tune

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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

// Metrics a search can rank trials by, and stop criteria can name.
var Metrics = []string{"test_accuracy", "test_loss", "train_loss"}

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
		s.Metric = "test_accuracy"
	}
	if s.Mode == "" {
		s.Mode = "max"
	}
	if s.MaxConcurrentTrials == 0 {
		s.MaxConcurrentTrials = 1
	}
	switch {
	case len(s.ParamSpace) == 0:
		return s, fmt.Errorf(`tune spec: param_space is empty; want at least one "spec.path": {"grid_search"|"choice"|"uniform"|"loguniform"|"randint": ...}`)
	case s.NumSamples < 1 || s.NumSamples > 10000:
		return s, fmt.Errorf("tune spec: num_samples is %d; want 1 to 10000", s.NumSamples)
	case !slices.Contains(Metrics, s.Metric):
		return s, fmt.Errorf("tune spec: metric is %q; want one of %s", s.Metric, strings.Join(Metrics, ", "))
	case s.Mode != "max" && s.Mode != "min":
		return s, fmt.Errorf(`tune spec: mode is %q; want "max" or "min"`, s.Mode)
	case s.MaxConcurrentTrials < 1:
		return s, fmt.Errorf("tune spec: max_concurrent_trials is %d; want 1 or more", s.MaxConcurrentTrials)
	}
	for k := range s.Stop {
		if k != "training_iteration" && !slices.Contains(Metrics, k) {
			return s, fmt.Errorf("tune spec: stop.%s: want training_iteration or one of %s", k, strings.Join(Metrics, ", "))
		}
	}
	if _, err := New(s.Scheduler, s.Mode); err != nil {
		return s, fmt.Errorf("tune spec: %v", err)
	}
	return s, nil
}

// Value is the metric a trial reports, by name.
func Value(metric string, testAccuracy, testLoss, trainLoss float64) float64 {
	switch metric {
	case "test_loss":
		return testLoss
	case "train_loss":
		return trainLoss
	}
	return testAccuracy
}
