package workflows

import (
	"encoding/json"
	"fmt"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// trialSuffix names a search's trials after it (up to 4 digits: MaxTrials is 2,000).
const trialSuffix = "%s-trial-%03d"

// TuneWorkflow runs a hyperparameter search: each trial is a child
// TrainingWorkflow with its own gang; trials report every epoch; the
// scheduler (FIFO, ASHA, median stopping) and the stop criteria stop trials
// early through the trial's stop signal, so they end gracefully and keep
// their checkpoints. Its input is the JSON of tune.Spec.
func TuneWorkflow(ctx workflow.Context, input converter.RawValue) (*spec.TuneResults, error) {
	raw, err := inputBytes(input)
	var s tune.Spec
	if err == nil {
		s, err = tune.ParseSpec(raw)
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	trials, err := tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError("tune spec: "+err.Error(), spec.ErrUser, nil)
	}
	// Trials are named after the search: an ID the server would refuse for
	// a child would fail every workflow task, so it is refused here.
	if err := spec.CheckWorkflowID("the search's workflow ID", workflow.GetInfo(ctx).WorkflowExecution.ID, len("-trial-0000")); err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	sched, _ := tune.New(s.Scheduler, s.Mode)
	info := workflow.GetInfo(ctx)
	// Trials own their checkpoint run names (run-ownership): each is named
	// after the search and its number, never the train spec's one name.
	owned := workflow.GetVersion(ctx, "run-ownership", workflow.DefaultVersion, 1) >= 1
	name := s.Name
	if name == "" && owned {
		name = runName(info.WorkflowExecution.ID)
	} else if name == "" {
		name = legacyRunName(info.WorkflowExecution.ID)
	}
	res := &spec.TuneResults{Name: name, State: spec.TuneRunning, Metric: s.Metric, Mode: s.Mode, Scheduler: schedulerName(s.Scheduler), Best: -1}
	byID := map[string]int{}
	for i, tr := range trials {
		id := fmt.Sprintf(trialSuffix, info.WorkflowExecution.ID, i)
		byID[id] = i
		res.Trials = append(res.Trials, spec.TrialStatus{Trial: i, WorkflowID: id, Config: tr.Config, Status: spec.TrialPending})
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
		switch {
		case owned:
			sp.Name = trialRunName(name, t.WorkflowID, i)
		case sp.Name == "":
			sp.Name = legacyRunName(t.WorkflowID)
		}
		in, _ := json.Marshal(sp)
		// A trial lives no longer than its search: cancelling the search
		// cancels it and waits until it has closed (so its slots are free
		// when the search closes); terminating the search asks it to cancel
		// (REQUEST_CANCEL), and it closes as a cancelled run does, with
		// its checkpoints.
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:          t.WorkflowID,
			ParentClosePolicy:   enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL,
			WaitForCancellation: true,
		})
		f := workflow.ExecuteChildWorkflow(cctx, spec.WorkflowTraining, json.RawMessage(in))
		children[i] = f
		t.Status = spec.TrialRunning
		sel.AddFuture(f, func(f workflow.Future) {
			var p *spec.Progress
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
		if t.Status != spec.TrialRunning {
			return // already stopping or ended: nothing more to decide
		}
		v := observe(t, r, s.Metric, s.Mode)
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
			t.Status, t.Reason = spec.TrialStopping, reason
			children[i].SignalChildWorkflow(ctx, spec.SignalStop, nil)
		}
	})
	for done < next {
		sel.Select(ctx)
		for ctx.Err() == nil && next < len(trials) && next-done < s.MaxConcurrentTrials {
			start(next)
			next++
		}
	}
	res.State = searchState(res.Trials)
	if ctx.Err() != nil {
		// Cancelled: the running trials have closed; the rest never start.
		for i := next; i < len(trials); i++ {
			res.Trials[i].Status = spec.TrialCancelled
		}
		res.State = spec.TuneCancelled
	}
	res.Best = bestTrial(res.Trials, s.Mode)
	url := s.ResultsURL
	if url == "" && len(trials) > 0 {
		url = trials[0].Spec.WithDefaults().Checkpoint.URL
	}
	// The results are written even for a cancelled search, on a context of
	// their own, bounded by the activity's timeouts.
	wctx, _ := workflow.NewDisconnectedContext(ctx)
	actx := workflow.WithActivityOptions(wctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 5}})
	if err := workflow.ExecuteActivity(actx, spec.ActivityWriteTuneResults, spec.WriteTuneResultsInput{URL: url, Name: name, Results: res}).Get(wctx, &res.ResultsCSV); err != nil {
		workflow.GetLogger(ctx).Warn("the results CSV was not written", "error", err)
	}
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, nil
}
