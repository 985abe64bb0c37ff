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
	Name      string `json:"name"`
	State     string `json:"state"`
	Metric    string `json:"metric"`
	Mode      string `json:"mode"`
	Scheduler string `json:"scheduler"`
	// Trials are the rows the search keeps, by trial number: every trial's
	// in a search of up to MaxListedTrials; in a bigger one, the trials
	// running, those finished whose rows have not moved to Parts yet, and
	// the next pending ones.
	Trials []TrialStatus `json:"trials"`
	// Best is the number of the best trial by its last value (Ray's scope
	// "last"), or -1 if none; BestTrial is its row.
	Best       int          `json:"best"`
	BestTrial  *TrialStatus `json:"best_trial,omitempty"`
	ResultsCSV string       `json:"results_csv,omitempty"`
	// Total is the search's trials, Started how many have started.
	Total   int `json:"total,omitempty"`
	Started int `json:"started,omitempty"`
	// Unlisted counts, by status, the trials not in Trials: finished ones
	// whose rows moved to Parts, and pending ones a cancel left unstarted.
	Unlisted map[string]int `json:"unlisted,omitempty"`
	// Parts are the objects, under the results URL, holding the moved rows
	// as JSON lines; the results CSV has every row.
	Parts []string `json:"parts,omitempty"`
}

// MaxListedTrials bounds the rows a search keeps in its state, its query
// answer and what it carries through continue-as-new: a search of more
// trials moves its finished rows to blob storage in parts.
const MaxListedTrials = 500

// Row is trial i's row, if the search lists it.
func (r *TuneResults) Row(i int) *TrialStatus {
	j, ok := slices.BinarySearchFunc(r.Trials, i, func(t TrialStatus, i int) int { return t.Trial - i })
	if !ok {
		return nil
	}
	return &r.Trials[j]
}

// Counts are the search's trials by status, listed or not.
func (r *TuneResults) Counts() map[string]int {
	c := map[string]int{}
	pending := 0
	for _, t := range r.Trials {
		c[t.Status]++
		if t.Status == TrialPending {
			pending++
		}
	}
	for st, n := range r.Unlisted {
		c[st] += n
	}
	// A running search lists only the next pending trials; the rest are
	// pending too. An ended one counted its unstarted trials as cancelled.
	if r.State == TuneRunning && r.Total > r.Started+pending {
		c[TrialPending] += r.Total - r.Started - pending
	}
	return c
}

// WriteTuneRowsInput is a part of a big search's rows, moved out of its state.
type WriteTuneRowsInput struct {
	URL  string        `json:"url"`
	Name string        `json:"name"`
	Part int           `json:"part"`
	Rows []TrialStatus `json:"rows"`
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
