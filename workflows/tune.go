package workflows

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// trialSuffix names a search's trials after it (up to 5 digits: MaxTrials is 10,000).
const trialSuffix = "%s-trial-%03d"

// A search continues as new before its history grows too long (every
// trial's start, end and reports are events; Temporal caps a history at
// 51,200). Trials are child workflows, and a parent's close policy applies
// at continue-as-new: the search stops starting trials, lets the running
// ones finish (draining), and continues with what it carries (tuneCarried).
const (
	TuneContinueAsNewAfterEvents  = 10000
	TuneContinueAsNewAfterSignals = 5000
)

// tuneCarried is what a search carries through continue-as-new, beside its spec.
type tuneCarried struct {
	Results   *spec.TuneResults `json:"results"`
	Scheduler json.RawMessage   `json:"scheduler,omitempty"`
	Searcher  json.RawMessage   `json:"searcher,omitempty"`
	// Segments are PBT continuations cloned but not started when the
	// search drained: the next execution starts them first.
	Segments []pendingSegment `json:"segments,omitempty"`
	// ResetTag sets apart the trials' workflow IDs and run names of a
	// search that was reset (TuneWorkflow says why); empty if never reset.
	ResetTag string `json:"reset_tag,omitempty"`
}

// exploitPlan is a trial PBT told to exploit another: once it has stopped,
// From is cloned and it continues with Config.
type exploitPlan struct {
	Donor  int
	From   spec.CheckpointRef
	Config map[string]json.RawMessage
	Epoch  int
}

// pendingSegment is a trial's next segment: its config and the run it resumes from.
type pendingSegment struct {
	Trial      int                        `json:"trial"`
	Config     map[string]json.RawMessage `json:"config"`
	ResumeFrom string                     `json:"resume_from"`
}

// TuneWorkflow runs a hyperparameter search: each trial is a child
// TrainingWorkflow with its own gang; trials report every epoch; the
// scheduler (FIFO, ASHA, median stopping) and the stop criteria stop trials
// early through the trial's stop signal, so they end gracefully and keep
// their checkpoints. Its input is the JSON of tune.Spec.
//
// A search of more than spec.MaxListedTrials trials keeps only that many
// rows: its finished rows move to blob storage in parts (WriteTuneRows),
// and the results CSV merges them back.
func TuneWorkflow(ctx workflow.Context, input converter.RawValue) (*spec.TuneResults, error) {
	info := workflow.GetInfo(ctx)
	raw, err := inputBytes(input)
	var s tune.Spec
	var carried *tuneCarried
	if err == nil {
		s, carried, err = decodeTuneInput(raw, info.ContinuedExecutionRunID != "")
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	// The random searcher's trials are expanded (and validated) ahead; a
	// model-based searcher's config is chosen as each trial starts, from
	// the trials that ended before.
	searcher, err := tune.NewSearcher(s.SearchAlg, s.ParamSpace, s.Mode, s.Seed)
	var trials []tune.Trial
	switch {
	case err != nil:
	case searcher == nil:
		trials, err = tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
	default:
		trials = make([]tune.Trial, s.NumSamples)
		for i := range trials {
			trials[i].Index = i
		}
		_, err = tune.Apply(s.Train, searcher.Suggest(0)) // a random draw: the space fits the spec
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError("tune spec: "+err.Error(), spec.ErrUser, nil)
	}
	// A reset search (Temporal's Reset: a new run that replays its base
	// run's history up to the point chosen; the base run is terminated and
	// its trials asked to cancel) starts its trials again as new workflows.
	// The base run's trials may still be closing under their workflow IDs,
	// and own their checkpoint run names (checkpoint.Store.Claim), so a
	// reset run names its trials apart, IDs and run names, with a tag of its
	// own that it carries across continue-as-new; the reports of the base
	// run's trials, which Temporal applies again to the reset run, name
	// none of its trials. A run that was never reset has the run ID its
	// start event was written with.
	resetTag := ""
	if carried != nil {
		resetTag = carried.ResetTag
	}
	if workflow.GetVersion(ctx, "reset-trial-names", workflow.DefaultVersion, 1) >= 1 &&
		info.OriginalRunID != "" && info.OriginalRunID != info.WorkflowExecution.RunID {
		sum := sha256.Sum256([]byte(info.WorkflowExecution.RunID))
		resetTag = "-reset-" + hex.EncodeToString(sum[:4])
	}
	// Trials are named after the search: an ID the server would refuse for
	// a child would fail every workflow task, so it is refused here.
	if err := spec.CheckWorkflowID("the search's workflow ID", info.WorkflowExecution.ID, len("-trial-00000")+len(resetTag)); err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	sched, _ := s.NewScheduler()
	pbt, _ := sched.(*tune.PBT)
	// Trials own their checkpoint run names (run-ownership): each is named
	// after the search and its number, never the train spec's one name.
	owned := workflow.GetVersion(ctx, "run-ownership", workflow.DefaultVersion, 1) >= 1
	// Big searches move finished rows out and continue as new; searches
	// recorded before kept every row and never did.
	bounded := workflow.GetVersion(ctx, "tune-continue-as-new", workflow.DefaultVersion, 1) >= 1
	name := s.Name
	if name == "" && owned {
		name = runName(info.WorkflowExecution.ID)
	} else if name == "" {
		name = legacyRunName(info.WorkflowExecution.ID)
	}
	url := s.ResultsURL
	if url == "" && len(trials) > 0 {
		url = trials[0].Spec.WithDefaults().Checkpoint.URL
	}
	trialID := func(i int) string { return fmt.Sprintf(trialSuffix, info.WorkflowExecution.ID, i) + resetTag }
	// trialRun is trial i's checkpoint run name.
	trialRun := func(i int) string { return trialRunName(name+resetTag, trialID(i), i) }
	pendingRow := func(i int) spec.TrialStatus {
		return spec.TrialStatus{Trial: i, WorkflowID: trialID(i), Config: trials[i].Config, Status: spec.TrialPending}
	}
	var res *spec.TuneResults
	if carried != nil {
		res = carried.Results
		if err := tune.SetState(sched, carried.Scheduler); err != nil {
			return nil, temporal.NewNonRetryableApplicationError("the carried scheduler state: "+err.Error(), spec.ErrUser, nil)
		}
		if err := tune.SetSearcherState(searcher, carried.Searcher); err != nil {
			return nil, temporal.NewNonRetryableApplicationError("the carried searcher state: "+err.Error(), spec.ErrUser, nil)
		}
	} else {
		res = &spec.TuneResults{Name: name, State: spec.TuneRunning, Metric: s.Metric, Mode: s.Mode, Scope: s.Scope, Scheduler: schedulerName(s.Scheduler), Best: -1}
		listed := len(trials)
		if bounded {
			res.Total = len(trials)
			listed = min(listed, spec.MaxListedTrials)
		}
		for i := range listed {
			res.Trials = append(res.Trials, pendingRow(i))
		}
	}
	if err := workflow.SetQueryHandler(ctx, spec.QueryResults, func() (*spec.TuneResults, error) { return res, nil }); err != nil {
		return nil, err
	}
	segOf := map[string]int{} // running PBT segments' workflow IDs -> trial
	byID := func(id string) (int, bool) {
		if i, ok := segOf[id]; ok {
			return i, true
		}
		var i int
		if n, err := fmt.Sscanf(strings.TrimPrefix(id, info.WorkflowExecution.ID), "-trial-%d", &i); err != nil || n != 1 || i < 0 || i >= len(trials) || trialID(i) != id {
			return 0, false
		}
		return i, true
	}
	reports := workflow.GetSignalChannel(ctx, spec.SignalTrialReport)
	children := map[int]workflow.ChildWorkflowFuture{}
	byCriterion := map[int]bool{} // stopped by a stop criterion, not the scheduler
	next, done := res.Started, 0
	signals := 0
	draining := false
	plans := map[int]*exploitPlan{} // PBT: trials told to stop for an exploit
	clones := 0                     // PBT: clone activities in flight
	var carry []pendingSegment      // PBT: segments for the next execution
	var badMetric error             // a report without a metric the search needs: the search fails
	sel := workflow.NewSelector(ctx)
	// list makes sure trial i has a row (rows are listed up to spec.MaxListedTrials ahead).
	list := func(i int) *spec.TrialStatus {
		if t := res.Row(i); t != nil {
			return t
		}
		res.Trials = append(res.Trials, pendingRow(i))
		return &res.Trials[len(res.Trials)-1]
	}
	var launch func(i int, workflowID string, sp spec.Training)
	// runOf is the checkpoint run of trial i's segment (0: the trial's own).
	runOf := func(i, segment int) string {
		if segment == 0 {
			return trialRun(i)
		}
		return runName(fmt.Sprintf("%s-p%d", trialRun(i), segment))
	}
	// ended records that trial i is over, whatever ended it.
	ended := func(i int) {
		done++
		row := res.Row(i)
		if searcher != nil && row.Status != spec.TrialFailed && row.Status != spec.TrialCancelled {
			if v := trialScore(*row); v != nil {
				searcher.Observe(i, row.Config, *v)
			}
		}
		delete(byCriterion, i)
		tune.Forget(sched, i)
	}
	// startSegment continues a PBT trial as a new child workflow.
	startSegment := func(seg pendingSegment) {
		i, row := seg.Trial, res.Row(seg.Trial)
		row.Segment++
		sp, err := tune.Apply(s.Train, seg.Config)
		row.Config = seg.Config
		if err != nil {
			row.Status, row.Reason = spec.TrialFailed, "its explored config: "+err.Error()
			ended(i)
			return
		}
		sp.Name, sp.ResumeFrom = runOf(i, row.Segment), seg.ResumeFrom
		trials[i].Spec, trials[i].Config = sp, seg.Config
		wid := fmt.Sprintf("%s-p%d", trialID(i), row.Segment)
		segOf[wid] = i
		launch(i, wid, sp)
	}
	// exploit clones a stopped trial's donor checkpoint, then continues it.
	exploit := func(i int, plan *exploitPlan) {
		row := res.Row(i)
		clone := runName(fmt.Sprintf("%s-p%d-clone", trialRun(i), row.Segment+1))
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Hour,
			RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3}})
		f := workflow.ExecuteActivity(actx, spec.ActivityCloneCheckpoint, spec.CloneCheckpointInput{
			From: plan.From, URL: trials[i].Spec.WithDefaults().Checkpoint.URL, Run: clone})
		clones++
		sel.AddFuture(f, func(f workflow.Future) {
			clones--
			var out *spec.CloneCheckpointResult
			err := f.Get(ctx, &out)
			if ctx.Err() != nil {
				row.Status, row.Reason = spec.TrialCancelled, "the search was cancelled while it exploited trial "+fmt.Sprint(plan.Donor)
				ended(i)
				return
			}
			step := spec.Exploit{Epoch: plan.Epoch, From: plan.Donor, Changed: changedValues(row.Config, plan.Config)}
			seg := pendingSegment{Trial: i, Config: plan.Config, ResumeFrom: clone}
			if err != nil || out == nil {
				// Its own checkpoint and config, rather than nothing.
				step.Changed, step.Reason = nil, "the clone failed, so it went on from its own checkpoint: "+shortError(err)
				seg = pendingSegment{Trial: i, Config: row.Config, ResumeFrom: runOf(i, row.Segment)}
			} else {
				step.Cloned = out.Source.Run + "/" + out.Source.ID
			}
			addLineage(row, step)
			if draining {
				carry = append(carry, seg)
				return
			}
			startSegment(seg)
		})
	}
	launch = func(i int, workflowID string, sp spec.Training) {
		t := res.Row(i)
		in, _ := json.Marshal(sp)
		// A trial lives no longer than its search: cancelling the search
		// cancels it and waits until it has closed (so its slots are free
		// when the search closes); terminating the search asks it to cancel
		// (REQUEST_CANCEL), and it closes as a cancelled run does, with
		// its checkpoints.
		cctx := workflow.WithChildOptions(ctx, workflow.ChildWorkflowOptions{
			WorkflowID:          workflowID,
			ParentClosePolicy:   enumspb.PARENT_CLOSE_POLICY_REQUEST_CANCEL,
			WaitForCancellation: true,
		})
		f := workflow.ExecuteChildWorkflow(cctx, spec.WorkflowTraining, json.RawMessage(in))
		children[i] = f
		t.Status = spec.TrialRunning
		res.Started = max(res.Started, i+1)
		sel.AddFuture(f, func(f workflow.Future) {
			var p *spec.Progress
			err := f.Get(ctx, &p)
			delete(children, i)
			delete(segOf, workflowID)
			row := res.Row(i)
			if plan := plans[i]; plan != nil {
				delete(plans, i)
				if err == nil && p != nil && p.State == spec.StateStopped && ctx.Err() == nil {
					absorb(row, p, s.Metric, s.Mode, s.Scope)
					exploit(i, plan)
					return
				}
				row.Status = spec.TrialRunning // the stop came too late: it ended as it ended
			}
			finish(row, p, err, byCriterion[i], s.Metric, s.Mode, s.Scope)
			ended(i)
		})
	}
	start := func(i int) {
		t := list(i)
		if searcher != nil && trials[i].Config == nil {
			cfg := searcher.Suggest(i)
			sp, err := tune.Apply(s.Train, cfg)
			trials[i], t.Config = tune.Trial{Index: i, Config: cfg, Spec: sp}, cfg
			if err != nil { // a value the spec refuses: the trial fails, the search goes on
				t.Status, t.Reason = spec.TrialFailed, err.Error()
				res.Started = max(res.Started, i+1)
				return
			}
		}
		sp := trials[i].Spec
		switch {
		case owned:
			sp.Name = trialRun(i)
		case sp.Name == "":
			sp.Name = legacyRunName(t.WorkflowID)
		}
		// A row carried across continue-as-new into a reset run was listed
		// under the base run's trial ID: a pending trial takes this run's.
		t.WorkflowID = trialID(i)
		launch(i, t.WorkflowID, sp)
	}
	if carried != nil {
		for _, seg := range carried.Segments {
			if seg.Trial >= 0 && seg.Trial < len(trials) && res.Row(seg.Trial) != nil {
				startSegment(seg)
			}
		}
	}
	for next < len(trials) && len(children) < s.MaxConcurrentTrials {
		start(next)
		next++
	}
	sel.AddReceive(reports, func(c workflow.ReceiveChannel, _ bool) {
		var r spec.TrialReport
		if !c.ReceiveAsync(&r) {
			return // it did not decode (the SDK logs and drops it): not a report
		}
		signals++
		i, ok := byID(r.WorkflowID)
		if !ok {
			return
		}
		t := res.Row(i)
		if t == nil || t.Status != spec.TrialRunning {
			return // already stopping or ended: nothing more to decide
		}
		if err := missingMetric(s, r.Metrics); err != nil {
			badMetric = fmt.Errorf("trial %d: %w", i, err)
			return
		}
		v := observe(t, r, s.Metric, s.Mode, s.Scope)
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
			return
		}
		if pbt == nil || draining {
			return
		}
		if donor := pbt.Exploit(tune.Result{Trial: i, Iteration: t.Epochs, Value: v}); donor >= 0 {
			// A donor's checkpoint must leave epochs to train: one at the
			// run's end would end the trial (it cannot train past its epochs).
			if d := res.Row(donor); d != nil && d.Checkpoint != nil && d.Status == spec.TrialRunning &&
				d.Checkpoint.Epoch < trials[i].Spec.WithDefaults().Hyper.Epochs {
				plans[i] = &exploitPlan{Donor: donor, From: *d.Checkpoint, Config: pbt.Explore(i, t.Epochs, d.Config), Epoch: t.Epochs}
				pbt.Cloned(i, donor)
				t.Status = spec.TrialExploiting
				children[i].SignalChildWorkflow(ctx, spec.SignalStop, nil)
			}
		}
	})
	for len(children) > 0 || clones > 0 {
		before := done
		sel.Select(ctx)
		if badMetric != nil {
			// Every trial reports the same metrics: none could be ranked. The
			// trials are cancelled as the search closes (REQUEST_CANCEL),
			// keeping their checkpoints.
			return nil, temporal.NewNonRetryableApplicationError("tune spec: "+badMetric.Error(), spec.ErrUser, nil)
		}
		if bounded {
			if done > before { // rows change status only when a trial ends
				moveRows(ctx, res, url)
			}
			h := workflow.GetInfo(ctx)
			draining = draining || (next < len(trials) || pbt != nil) && (h.GetCurrentHistoryLength() >= TuneContinueAsNewAfterEvents ||
				signals >= TuneContinueAsNewAfterSignals || h.GetContinueAsNewSuggested())
		}
		for ctx.Err() == nil && !draining && next < len(trials) && len(children) < s.MaxConcurrentTrials {
			start(next)
			next++
		}
	}
	if ctx.Err() == nil && (next < len(trials) || len(carry) > 0) {
		// Drained: the next execution starts the rest.
		st, err := tune.State(sched)
		if err != nil {
			return nil, err
		}
		bestTrialOf(res)
		searched, err := tune.SearcherState(searcher)
		if err != nil {
			return nil, err
		}
		next, err := encodeTuneInput(raw, &tuneCarried{Results: res, Scheduler: st, Searcher: searched, Segments: carry, ResetTag: resetTag})
		if err != nil {
			return nil, err
		}
		return nil, workflow.NewContinueAsNewError(ctx, spec.WorkflowTune, next)
	}
	res.State = searchState(res)
	if ctx.Err() != nil {
		// Cancelled: the running trials have closed; the rest never start.
		for i := range res.Trials {
			if st := res.Trials[i].Status; st == spec.TrialPending || st == spec.TrialExploiting {
				res.Trials[i].Status = spec.TrialCancelled
			}
		}
		if unstarted := len(trials) - next - listedFrom(res, next); bounded && unstarted > 0 {
			if res.Unlisted == nil {
				res.Unlisted = map[string]int{}
			}
			res.Unlisted[spec.TrialCancelled] += unstarted
		}
		res.State = spec.TuneCancelled
	}
	bestTrialOf(res)
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

// moveRows moves a big search's finished rows out of its state, once there
// are half of spec.MaxListedTrials of them, to a part in blob storage; if
// the part cannot be written the rows stay, and it tries again later.
func moveRows(ctx workflow.Context, res *spec.TuneResults, url string) {
	if res.Total <= spec.MaxListedTrials {
		return
	}
	var finished, keep []spec.TrialStatus
	for _, t := range res.Trials {
		if trialEnded(t.Status) {
			finished = append(finished, t)
		} else {
			keep = append(keep, t)
		}
	}
	if len(finished) < spec.MaxListedTrials/2 {
		return
	}
	bestTrialOf(res) // the best row stays, as BestTrial
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Minute,
		RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 5}})
	var key string
	if err := workflow.ExecuteActivity(actx, spec.ActivityWriteTuneRows, spec.WriteTuneRowsInput{URL: url, Name: res.Name, Part: len(res.Parts), Rows: finished}).Get(ctx, &key); err != nil {
		workflow.GetLogger(ctx).Warn("finished trials' rows not moved out; keeping them for now", "rows", len(finished), "error", err)
		return
	}
	res.Parts = append(res.Parts, key)
	if res.Unlisted == nil {
		res.Unlisted = map[string]int{}
	}
	for _, t := range finished {
		res.Unlisted[t.Status]++
	}
	res.Trials = keep
}

// listedFrom counts the listed rows of trials numbered from on.
func listedFrom(res *spec.TuneResults, from int) int {
	n := 0
	for _, t := range res.Trials {
		if t.Trial >= from {
			n++
		}
	}
	return n
}
