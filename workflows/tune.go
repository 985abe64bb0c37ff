package workflows

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// Trial states in spec.TuneResults.
const (
	TrialPending     = "pending"
	TrialRunning     = "running"
	TrialStopping    = "stopping"      // the scheduler or a stop criterion stopped it; it finishes its epoch
	TrialEarlyStop   = "early-stopped" // ended by the scheduler, with its checkpoint
	TrialStopped     = "stopped"       // ended by a stop criterion
	TrialCompleted   = "completed"
	TrialFailed      = "failed"
	TuneRunning      = "running"
	TuneCompleted    = "completed"
	TuneFailedTrials = "completed-with-failures"
)

// TuneWorkflow runs a hyperparameter search: each trial is a child
// TrainingWorkflow with its own gang; trials report every epoch; the
// scheduler (FIFO, ASHA, median stopping) and the stop criteria stop trials
// early through the trial's stop signal, so they end gracefully and keep
// their checkpoints. Its input is the JSON of tune.Spec.
func TuneWorkflow(ctx workflow.Context, input json.RawMessage) (*spec.TuneResults, error) {
	s, err := tune.ParseSpec(input)
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	trials, err := tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError("tune spec: "+err.Error(), spec.ErrUser, nil)
	}
	sched, _ := tune.New(s.Scheduler, s.Mode)
	info := workflow.GetInfo(ctx)
	name := s.Name
	if name == "" {
		name = runName(info.WorkflowExecution.ID)
	}
	res := &spec.TuneResults{Name: name, State: TuneRunning, Metric: s.Metric, Mode: s.Mode, Scheduler: schedulerName(s.Scheduler), Best: -1}
	byID := map[string]int{}
	for i, tr := range trials {
		id := fmt.Sprintf("%s-trial-%03d", info.WorkflowExecution.ID, i)
		byID[id] = i
		res.Trials = append(res.Trials, spec.TrialStatus{Trial: i, WorkflowID: id, Config: tr.Config, Status: TrialPending})
	}
	if err := workflow.SetQueryHandler(ctx, spec.QueryResults, func() (*spec.TuneResults, error) { return res, nil }); err != nil {
		return nil, err
	}
	reports := workflow.GetSignalChannel(ctx, spec.SignalTrialReport)
	children := map[int]workflow.ChildWorkflowFuture{}
	byCriterion := map[int]bool{} // stopped by a stop criterion, not the scheduler
	next, done := 0, 0
	sel := workflow.NewSelector(ctx)
	start := func(i int) {
		t := &res.Trials[i]
		sp := trials[i].Spec
		if sp.Name == "" {
			sp.Name = runName(t.WorkflowID)
		}
		in, _ := json.Marshal(sp)
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:        t.WorkflowID,
			ParentClosePolicy: enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL,
		})
		f := workflow.ExecuteChildWorkflow(cctx, spec.WorkflowTraining, json.RawMessage(in))
		children[i] = f
		t.Status = TrialRunning
		sel.AddFuture(f, func(f workflow.Future) {
			var p *Progress
			err := f.Get(ctx, &p)
			done++
			finish(t, p, err, byCriterion[i], s.Metric, s.Mode)
		})
	}
	for next < len(trials) && next < s.MaxConcurrentTrials {
		start(next)
		next++
	}
	sel.AddReceive(reports, func(c workflow.ReceiveChannel, _ bool) {
		var r spec.TrialReport
		c.Receive(ctx, &r)
		i, ok := byID[r.WorkflowID]
		if !ok {
			return
		}
		t := &res.Trials[i]
		if t.Status != TrialRunning {
			return // already stopping or ended: nothing more to decide
		}
		v := tune.Value(s.Metric, r.Metrics.TestAccuracy, r.Metrics.TestLoss, r.Metrics.TrainLoss)
		t.Epochs = r.Metrics.Epoch + 1
		t.Last = &v
		if t.Best == nil || better(s.Mode, v, *t.Best) {
			b := v
			t.Best = &b
		}
		if r.Checkpoint != nil {
			t.Checkpoint = r.Checkpoint
		}
		if t.Epochs >= trials[i].Spec.WithDefaults().Hyper.Epochs {
			return // its last epoch: it ends anyway
		}
		reason := ""
		if why := stopCriterion(s.Stop, t.Epochs, r.Metrics); why != "" {
			reason, byCriterion[i] = why, true
		} else if sched.OnResult(tune.Result{Trial: i, Iteration: t.Epochs, Value: v}) == tune.Stop {
			reason = fmt.Sprintf("%s stopped it at epoch %d (%s %.4f)", res.Scheduler, t.Epochs, s.Metric, v)
		}
		if reason != "" {
			t.Status, t.Reason = TrialStopping, reason
			children[i].SignalChildWorkflow(ctx, spec.SignalStop, nil)
		}
	})
	for done < len(trials) {
		sel.Select(ctx)
		for next < len(trials) && next-done < s.MaxConcurrentTrials {
			start(next)
			next++
		}
	}
	res.State = TuneCompleted
	for _, t := range res.Trials {
		if t.Status == TrialFailed {
			res.State = TuneFailedTrials
		}
	}
	res.Best = bestTrial(res.Trials, s.Mode)
	url := s.ResultsURL
	if url == "" && len(trials) > 0 {
		url = trials[0].Spec.WithDefaults().Checkpoint.URL
	}
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 5}})
	if err := workflow.ExecuteActivity(actx, spec.ActivityWriteTuneResults, spec.WriteTuneResultsInput{URL: url, Name: name, Results: res}).Get(ctx, &res.ResultsCSV); err != nil {
		workflow.GetLogger(ctx).Warn("the results CSV was not written", "error", err)
	}
	return res, nil
}

// finish records how a trial's workflow ended.
func finish(t *spec.TrialStatus, p *Progress, err error, byCriterion bool, metric, mode string) {
	if p != nil {
		t.Epochs = p.Epoch
		if p.Latest != nil {
			t.Checkpoint = p.Latest
		}
		// The trial's own history is complete; its last report may still be in flight.
		for _, m := range p.Metrics {
			v := tune.Value(metric, m.TestAccuracy, m.TestLoss, m.TrainLoss)
			t.Last = &v
			if t.Best == nil || better(mode, v, *t.Best) {
				b := v
				t.Best = &b
			}
		}
	}
	switch {
	case err != nil:
		t.Status, t.Reason = TrialFailed, shortError(err)
	case t.Status == TrialStopping && p != nil && p.State == StateStopped && byCriterion:
		t.Status = TrialStopped
	case t.Status == TrialStopping && p != nil && p.State == StateStopped:
		t.Status = TrialEarlyStop
	case t.Status == TrialStopping:
		// The trial finished its epochs before the stop reached it.
		t.Status, t.Reason = TrialCompleted, t.Reason+"; it had finished before the stop reached it"
	default:
		t.Status = TrialCompleted
	}
}

// stopCriterion says which stop criterion a report meets (Ray's stop dict:
// a value at or above the threshold), or "".
func stopCriterion(stop map[string]float64, epochs int, m spec.EpochMetrics) string {
	keys := []string{"training_iteration", "test_accuracy", "test_loss", "train_loss"}
	values := []float64{float64(epochs), m.TestAccuracy, m.TestLoss, m.TrainLoss}
	for i, k := range keys {
		if th, ok := stop[k]; ok && values[i] >= th {
			return fmt.Sprintf("stop.%s: %v reached %v", k, values[i], th)
		}
	}
	return ""
}

func better(mode string, a, b float64) bool {
	if mode == "min" {
		return a < b
	}
	return a > b
}

// bestTrial is the trial with the best last value, or -1.
func bestTrial(trials []spec.TrialStatus, mode string) int {
	best := -1
	for i, t := range trials {
		if t.Last == nil || math.IsNaN(*t.Last) || t.Status == TrialFailed {
			continue
		}
		if best < 0 || better(mode, *t.Last, *trials[best].Last) {
			best = i
		}
	}
	return best
}

func schedulerName(c tune.SchedulerConfig) string {
	if c.Type == "" {
		return "fifo"
	}
	return c.Type
}
