package spec

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Trial states: TrialStatus.Status.
const (
	TrialPending    = "pending"
	TrialRunning    = "running"
	TrialStopping   = "stopping"      // the scheduler or a stop criterion stopped it; it finishes its epoch
	TrialExploiting = "exploiting"    // PBT: it stops, then continues from a better trial's cloned checkpoint
	TrialPaused     = "paused"        // PBT: it stopped at a perturbation point to give its slot to a trial that had trained less
	TrialEarlyStop  = "early-stopped" // ended by the scheduler, with its checkpoint
	TrialStopped    = "stopped"       // ended by a stop criterion
	TrialCompleted  = "completed"
	TrialFailed     = "failed"
	TrialCancelled  = "cancelled" // its search was cancelled: it closed with its checkpoints, or never started
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
	// Score is the value the search ranks the trial by, under its scope
	// (TuneResults.Scope); Mean and Recent are what "avg" and "last-N-avg"
	// need: the mean of every epoch's value, and the newest values (at most
	// MaxScopeWindow), over Values values. Seen is the epoch after the
	// newest observed: an epoch reported again (a trial that rolled back to
	// a checkpoint redoes its epochs, with the same values) is not counted twice.
	Score      *float64       `json:"score,omitempty"`
	Mean       *float64       `json:"mean,omitempty"`
	Recent     []float64      `json:"recent,omitempty"`
	Values     int            `json:"values,omitempty"`
	Seen       int            `json:"seen,omitempty"`
	Checkpoint *CheckpointRef `json:"checkpoint,omitempty"`
	Reason     string         `json:"reason,omitempty"` // why it stopped early, or how it failed
	// Metrics are the trial's latest report's metrics, by name: the
	// searched one, then train_loss, test_loss, test_accuracy, then others
	// by name, at most MaxRowMetrics.
	Metrics map[string]float64 `json:"metrics,omitempty"`
	// Segment counts the trial's exploits (PBT): each continues the trial as
	// a new child workflow, "<workflow_id>-p<segment>", from a clone of a
	// better trial's checkpoint. Lineage lists them, the newest
	// MaxLineage; Config is the config the trial trains with now.
	Segment int       `json:"segment,omitempty"`
	Lineage []Exploit `json:"lineage,omitempty"`
}

// MaxRowMetrics bounds the metrics a row keeps.
const MaxRowMetrics = 16

// MaxLineage bounds the exploits a row lists (Segment counts them all).
const MaxLineage = 32

// Exploit is one step of a trial's lineage under PBT: at Epoch it took
// trial From's checkpoint (Cloned, "run/id") and continued with that
// trial's config, these values changed (Changed, by param_space path).
type Exploit struct {
	Epoch   int                        `json:"epoch"`
	From    int                        `json:"from_trial"`
	Cloned  string                     `json:"cloned,omitempty"`
	Changed map[string]json.RawMessage `json:"changed,omitempty"`
	Reason  string                     `json:"reason,omitempty"` // why the clone did not happen, if it did not
}

// TuneResults is the search as the results query shows it, and its result.
type TuneResults struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	Metric    string `json:"metric"`
	Mode      string `json:"mode"`
	Scope     string `json:"scope,omitempty"` // how a trial's values make its score; "" is "last"
	Scheduler string `json:"scheduler"`
	// Trials are the rows the search keeps, by trial number: every trial's
	// in a search of up to MaxListedTrials; in a bigger one, the trials
	// running, those finished whose rows have not moved to Parts yet, and
	// the next pending ones.
	Trials []TrialStatus `json:"trials"`
	// Best is the number of the best trial by its score (its last value
	// unless Scope says otherwise), or -1 if none; BestTrial is its row.
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
// CloneCheckpointInput asks for a trial's checkpoint to be cloned into a
// run of its own (PBT's exploit): From, as it was reported (or the newest
// verified checkpoint of its run, if that one is gone), into Run at URL.
type CloneCheckpointInput struct {
	From CheckpointRef `json:"from"`
	URL  string        `json:"url"`
	Run  string        `json:"run"`
	// Before bounds the checkpoint cloned when From no longer verifies:
	// the newest verified one of From's run of an epoch below it (a clone
	// must leave the trial epochs to train). 0: any.
	Before int `json:"before,omitempty"`
}

// CloneCheckpointResult is the checkpoint cloned and its clone.
type CloneCheckpointResult struct {
	Source CheckpointRef `json:"source"`
	Clone  CheckpointRef `json:"clone"`
}

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

// Scopes: how a trial's reported values make the score a search ranks it
// by (Ray Tune's scope).
const (
	ScopeLast      = "last"        // the latest value
	ScopeAll       = "all"         // the best value of any epoch, by mode
	ScopeAvg       = "avg"         // the mean of every epoch's value
	ScopeLast5Avg  = "last-5-avg"  // the mean of the newest 5
	ScopeLast10Avg = "last-10-avg" // the mean of the newest 10
)

// MaxScopeWindow is the most values a row keeps for a last-N-avg scope.
const MaxScopeWindow = 10

// Scopes are the scopes a search accepts.
var Scopes = []string{ScopeLast, ScopeAll, ScopeAvg, ScopeLast5Avg, ScopeLast10Avg}

// CheckScope says whether scope is one of Scopes, naming field if not.
func CheckScope(field, scope string) error {
	if slices.Contains(Scopes, scope) {
		return nil
	}
	return fmt.Errorf("%s is %q; want one of %s", field, scope, quoteList(Scopes))
}

// scopeWindow is how many newest values scope averages (0: not a window).
func scopeWindow(scope string) int {
	switch scope {
	case ScopeLast5Avg:
		return 5
	case ScopeLast10Avg:
		return 10
	}
	return 0
}

// Observe records an epoch's value of metric as the trial's last value, as
// its best if it beats the best so far under mode, and in its score under
// scope ("" is "last"); it returns the value.
func (t *TrialStatus) Observe(m EpochMetrics, metric, mode, scope string) float64 {
	v, _ := m.Value(metric)
	t.Last = &v
	if t.Best == nil || Better(mode, v, *t.Best) {
		b := v
		t.Best = &b
	}
	if m.Epoch >= t.Seen { // an epoch not counted yet
		t.Seen = m.Epoch + 1
		t.Values++
		n := float64(t.Values)
		if t.Mean == nil {
			mean := v
			t.Mean = &mean
		} else {
			mean := *t.Mean + (v-*t.Mean)/n
			t.Mean = &mean
		}
		if w := scopeWindow(scope); w > 0 {
			t.Recent = append(t.Recent, v)
			if len(t.Recent) > w {
				t.Recent = append([]float64(nil), t.Recent[len(t.Recent)-w:]...)
			}
		}
	}
	var score float64
	switch scope {
	case ScopeAll:
		score = *t.Best
	case ScopeAvg:
		score = *t.Mean
	case ScopeLast5Avg, ScopeLast10Avg:
		if len(t.Recent) == 0 {
			score = v
			break
		}
		for _, x := range t.Recent {
			score += x
		}
		score /= float64(len(t.Recent))
	default:
		score = v
	}
	t.Score = &score
	return v
}
