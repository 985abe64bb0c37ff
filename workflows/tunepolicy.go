package workflows

// TuneWorkflow's decisions about trials, as pure functions (see policy.go).

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// observe records a trial's report in its row and returns the metric's value.
func observe(t *spec.TrialStatus, r spec.TrialReport, metric, mode, scope string) float64 {
	t.Epochs = r.Metrics.Epoch + 1
	t.Metrics = rowMetrics(r.Metrics, metric)
	v := t.Observe(r.Metrics, metric, mode, scope)
	if r.Checkpoint != nil {
		t.Checkpoint = r.Checkpoint
	}
	return v
}

// absorb records what a trial's workflow (or segment) did: its epochs,
// checkpoint and every epoch's value (its last report may still be in
// flight; its own history is complete).
func absorb(t *spec.TrialStatus, p *spec.Progress, metric, mode, scope string) {
	if p == nil {
		return
	}
	t.Epochs = p.Epoch
	if p.Latest != nil {
		t.Checkpoint = p.Latest
	}
	for _, m := range p.Metrics {
		t.Observe(m, metric, mode, scope)
	}
	if n := len(p.Metrics); n > 0 {
		t.Metrics = rowMetrics(p.Metrics[n-1], metric)
	}
}

// rowMetrics is what a row keeps of a report: the searched metric, the
// three every backend may report, then others by name, spec.MaxRowMetrics
// in all (a search's rows travel in one payload).
func rowMetrics(m spec.EpochMetrics, metric string) map[string]float64 {
	all := m.Map()
	out := map[string]float64{}
	for _, name := range append([]string{metric}, append(slices.Clone(spec.Metrics), slices.Sorted(maps.Keys(all))...)...) {
		if v, ok := all[name]; ok && len(out) < spec.MaxRowMetrics {
			out[name] = v
		}
	}
	return out
}

// changedValues are the values of next that differ from cur, by path.
func changedValues(cur, next map[string]json.RawMessage) map[string]json.RawMessage {
	out := map[string]json.RawMessage{}
	for k, v := range next {
		if !bytes.Equal(cur[k], v) {
			out[k] = v
		}
	}
	return out
}

// addLineage appends a PBT exploit to a trial's lineage, keeping the newest spec.MaxLineage.
func addLineage(t *spec.TrialStatus, e spec.Exploit) {
	t.Lineage = append(t.Lineage, e)
	if len(t.Lineage) > spec.MaxLineage {
		t.Lineage = append([]spec.Exploit(nil), t.Lineage[len(t.Lineage)-spec.MaxLineage:]...)
	}
}

// finish records how a trial's workflow ended.
func finish(t *spec.TrialStatus, p *spec.Progress, err error, byCriterion bool, metric, mode, scope string) {
	absorb(t, p, metric, mode, scope)
	stopped := p != nil && p.State == spec.StateStopped
	var canceled *temporal.CanceledError
	switch {
	case errors.As(err, &canceled):
		t.Status, t.Reason = spec.TrialCancelled, "the search was cancelled"
	case err != nil:
		t.Status, t.Reason = spec.TrialFailed, shortError(err)
	case t.Status == spec.TrialStopping && stopped && byCriterion:
		t.Status = spec.TrialStopped
	case t.Status == spec.TrialStopping && stopped:
		t.Status = spec.TrialEarlyStop
	case t.Status == spec.TrialStopping:
		// The trial finished its epochs before the stop reached it.
		t.Status, t.Reason = spec.TrialCompleted, t.Reason+"; it had finished before the stop reached it"
	default:
		t.Status = spec.TrialCompleted
	}
}

// stopCriterion says which stop criterion a report meets (Ray's stop dict:
// a value at or above the threshold), or "".
func stopCriterion(stop map[string]float64, epochs int, m spec.EpochMetrics) string {
	if th, ok := stop[tune.TrainingIteration]; ok && float64(epochs) >= th {
		return fmt.Sprintf("stop.%s: %v reached %v", tune.TrainingIteration, epochs, th)
	}
	for _, k := range slices.Sorted(maps.Keys(stop)) {
		if v, ok := m.Value(k); ok && v >= stop[k] {
			return fmt.Sprintf("stop.%s: %v reached %v", k, v, stop[k])
		}
	}
	return ""
}

// missingMetric names the first metric a search needs (its metric, its
// stop criteria's) that a trial's report does not have.
func missingMetric(s tune.Spec, m spec.EpochMetrics) error {
	if err := m.MissingMetric("the search's metric", s.Metric); err != nil {
		return err
	}
	for _, k := range slices.Sorted(maps.Keys(s.Stop)) {
		if k != tune.TrainingIteration {
			if err := m.MissingMetric("stop."+k, k); err != nil {
				return err
			}
		}
	}
	return nil
}

// trialScore is what ranks a trial: its score under the search's scope,
// or its last value (rows recorded before scores had only that); nil for
// none yet.
func trialScore(t spec.TrialStatus) *float64 {
	if t.Score != nil {
		return t.Score
	}
	return t.Last
}

// bestTrial is the number of the trial with the best score (its last
// value under the default scope; rows recorded before scores had only
// that), or -1; rows are by trial number.
func bestTrial(trials []spec.TrialStatus, mode string) int {
	score := trialScore
	best := -1
	for i, t := range trials {
		if v := score(t); v == nil || math.IsNaN(*v) || t.Status == spec.TrialFailed {
			continue
		}
		if best < 0 || spec.Better(mode, *score(t), *score(trials[best])) {
			best = i
		}
	}
	if best < 0 {
		return -1
	}
	return trials[best].Trial
}

// bestTrialOf sets the search's best trial from its rows and the best of
// the rows it moved out (BestTrial).
func bestTrialOf(res *spec.TuneResults) {
	rows := res.Trials
	if res.BestTrial != nil && res.Row(res.BestTrial.Trial) == nil {
		rows = append([]spec.TrialStatus{*res.BestTrial}, rows...)
	}
	res.Best, res.BestTrial = -1, nil
	if b := bestTrial(rows, res.Mode); b >= 0 {
		for _, t := range rows {
			if t.Trial == b {
				row := t
				res.Best, res.BestTrial = b, &row
			}
		}
	}
}

// trialEnded says whether a trial's status is final.
func trialEnded(status string) bool {
	switch status {
	case spec.TrialCompleted, spec.TrialEarlyStop, spec.TrialStopped, spec.TrialFailed, spec.TrialCancelled:
		return true
	}
	return false
}

// searchState is a finished search's state: completed, or completed with failures.
func searchState(res *spec.TuneResults) string {
	if res.Unlisted[spec.TrialFailed] > 0 {
		return spec.TuneFailedTrials
	}
	for _, t := range res.Trials {
		if t.Status == spec.TrialFailed {
			return spec.TuneFailedTrials
		}
	}
	return spec.TuneCompleted
}

func schedulerName(c tune.SchedulerConfig) string {
	if c.Type == "" {
		return "fifo"
	}
	return c.Type
}

// trialRunName is a trial's checkpoint run name: the search's name and the
// trial's number, or a name made from its workflow ID where that is too long.
func trialRunName(search, workflowID string, trial int) string {
	if n := fmt.Sprintf(trialSuffix, search, trial); len(n) <= 200 {
		return n
	}
	return runName(workflowID)
}
