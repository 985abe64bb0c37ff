package spec

import (
	"encoding/json"
	"slices"
)

// Trial states: TrialStatus.Status.
const (
	TrialPending   = "pending"
	TrialRunning   = "running"
	TrialStopping  = "stopping"      // the scheduler or a stop criterion stopped it; it finishes its epoch
	TrialEarlyStop = "early-stopped" // ended by the scheduler, with its checkpoint
	TrialStopped   = "stopped"       // ended by a stop criterion
	TrialCompleted = "completed"
	TrialFailed    = "failed"
	TrialCancelled = "cancelled" // its search was cancelled: it closed with its checkpoints, or never started
)

// Search states: TuneResults.State.
const (
	TuneRunning      = "running"
	TuneCompleted    = "completed"
	TuneFailedTrials = "completed-with-failures"
	TuneCancelled    = "cancelled"
)

// TrialStatus is one row of the results table.
type TrialStatus struct {
	Trial      int                        `json:"trial"`
	WorkflowID string                     `json:"workflow_id"`
	Config     map[string]json.RawMessage `json:"config"`
	Status     string                     `json:"status"`
	Epochs     int                        `json:"epochs"`
	Last       *float64                   `json:"last,omitempty"` // the metric's latest value
	Best       *float64                   `json:"best,omitempty"` // its best value by mode
	Checkpoint *CheckpointRef             `json:"checkpoint,omitempty"`
	Reason     string                     `json:"reason,omitempty"` // why it stopped early, or how it failed
}

// TuneResults is the search as the results query shows it, and its result.
type TuneResults struct {
	Name       string        `json:"name"`
	State      string        `json:"state"`
	Metric     string        `json:"metric"`
	Mode       string        `json:"mode"`
	Scheduler  string        `json:"scheduler"`
	Trials     []TrialStatus `json:"trials"`
	Best       int           `json:"best"` // index of the best trial by its last value (Ray's scope "last"); -1 if none
	ResultsCSV string        `json:"results_csv,omitempty"`
}

// WriteTuneResultsInput is what the CSV activity writes.
type WriteTuneResultsInput struct {
	URL     string       `json:"url"`
	Name    string       `json:"name"`
	Results *TuneResults `json:"results"`
}

// ConfigPaths are the spec paths the trials' configs set, sorted: the
// columns of a results table.
func (r *TuneResults) ConfigPaths() []string {
	var paths []string
	for _, t := range r.Trials {
		for p := range t.Config {
			if !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
		}
	}
	slices.Sort(paths)
	return paths
}

// Observe records an epoch's value of metric as the trial's last value, and
// as its best if it beats the best so far under mode; it returns the value.
func (t *TrialStatus) Observe(m EpochMetrics, metric, mode string) float64 {
	v, _ := m.Value(metric)
	t.Last = &v
	if t.Best == nil || Better(mode, v, *t.Best) {
		b := v
		t.Best = &b
	}
	return v
}
