package workflows

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// A search's trials: how each is named, started as a child workflow,
// decided about on its reports, continued by PBT, and recorded as it ends.

// trialID is trial i's workflow ID.
func (r *search) trialID(i int) string {
	return fmt.Sprintf(trialSuffix, r.info.WorkflowExecution.ID, i) + r.resetTag
}

// trialRun is trial i's checkpoint run name.
func (r *search) trialRun(i int) string { return trialRunName(r.name+r.resetTag, r.trialID(i), i) }

// runOf is the checkpoint run of trial i's segment (0: the trial's own).
func (r *search) runOf(i, segment int) string {
	if segment == 0 {
		return r.trialRun(i)
	}
	return runName(fmt.Sprintf("%s-p%d", r.trialRun(i), segment))
}

func (r *search) pendingRow(i int) spec.TrialStatus {
	return spec.TrialStatus{Trial: i, WorkflowID: r.trialID(i), Config: r.trials[i].Config, Status: spec.TrialPending}
}

// byID is the trial a workflow ID names: a trial's or a running PBT segment's.
func (r *search) byID(id string) (int, bool) {
	if i, ok := r.segOf[id]; ok {
		return i, true
	}
	var i int
	if n, err := fmt.Sscanf(strings.TrimPrefix(id, r.info.WorkflowExecution.ID), "-trial-%d", &i); err != nil || n != 1 || i < 0 || i >= len(r.trials) || r.trialID(i) != id {
		return 0, false
	}
	return i, true
}

// list makes sure trial i has a row (rows are listed up to spec.MaxListedTrials ahead).
func (r *search) list(i int) *spec.TrialStatus {
	if t := r.res.Row(i); t != nil {
		return t
	}
	r.res.Trials = append(r.res.Trials, r.pendingRow(i))
	return &r.res.Trials[len(r.res.Trials)-1]
}

// ended records that trial i is over, whatever ended it.
func (r *search) ended(i int) {
	r.done++
	row := r.res.Row(i)
	if r.searcher != nil && row.Status != spec.TrialFailed && row.Status != spec.TrialCancelled {
		if v := trialScore(*row); v != nil {
			r.searcher.Observe(i, row.Config, *v)
		}
	}
	delete(r.byCriterion, i)
	tune.Forget(r.sched, i)
}

// start starts trial i, choosing its config first where a model-based searcher does.
func (r *search) start(i int) {
	t := r.list(i)
	if r.searcher != nil && r.trials[i].Config == nil {
		cfg := r.searcher.Suggest(i)
		sp, err := tune.Apply(r.s.Train, cfg)
		r.trials[i], t.Config = tune.Trial{Index: i, Config: cfg, Spec: sp}, cfg
		if err != nil { // a value the spec refuses: the trial fails, the search goes on
			t.Status, t.Reason = spec.TrialFailed, err.Error()
			r.res.Started = max(r.res.Started, i+1)
			return
		}
	}
	sp := r.trials[i].Spec
	switch {
	case r.owned:
		sp.Name = r.trialRun(i)
	case sp.Name == "":
		sp.Name = legacyRunName(t.WorkflowID)
	}
	// A row carried across continue-as-new into a reset run was listed
	// under the base run's trial ID: a pending trial takes this run's.
	t.WorkflowID = r.trialID(i)
	r.launch(i, t.WorkflowID, sp)
}

// launch starts trial i (or a segment of it) as a child workflow and
// records its end when it closes.
func (r *search) launch(i int, workflowID string, sp spec.Training) {
	ctx, s := r.ctx, r.s
	t := r.res.Row(i)
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
	r.children[i] = f
	t.Status = spec.TrialRunning
	r.res.Started = max(r.res.Started, i+1)
	r.sel.AddFuture(f, func(f workflow.Future) {
		var p *spec.Progress
		err := f.Get(ctx, &p)
		delete(r.children, i)
		delete(r.segOf, workflowID)
		row := r.res.Row(i)
		if plan := r.plans[i]; plan != nil {
			delete(r.plans, i)
			if err == nil && p != nil && p.State == spec.StateStopped && ctx.Err() == nil {
				absorb(row, p, s.Metric, s.Mode, s.Scope)
				switch {
				case plan.Pause && r.timeShared && row.Epochs >= r.lastEpoch(i):
					// It trained on to its stop.training_iteration before the
					// pause reached it: it ends there, as a trial stopped by it.
					row.Status, row.Reason, r.byCriterion[i] = spec.TrialStopping, stopCriterion(s.Stop, row.Epochs, spec.EpochMetrics{}), true
					finish(row, p, nil, true, s.Metric, s.Mode, s.Scope)
					r.ended(i)
				case plan.Pause:
					r.queue(pendingSegment{Trial: i, Config: row.Config, ResumeFrom: r.runOf(i, row.Segment), Epochs: row.Epochs})
				case r.timeShared:
					plan.childDone = true
					if plan.cloneDone {
						r.exploited(i, plan)
					}
				default:
					r.exploit(i, plan)
				}
				return
			}
			plan.abandoned = true
			row.Status = spec.TrialRunning // the stop came too late: it ended as it ended
		}
		finish(row, p, err, r.byCriterion[i], s.Metric, s.Mode, s.Scope)
		r.ended(i)
	})
}

// startSegment continues a PBT trial as a new child workflow.
func (r *search) startSegment(seg pendingSegment) {
	i, row := seg.Trial, r.res.Row(seg.Trial)
	row.Segment++
	sp, err := tune.Apply(r.s.Train, seg.Config)
	row.Config = seg.Config
	if err != nil {
		row.Status, row.Reason = spec.TrialFailed, "its explored config: "+err.Error()
		r.ended(i)
		return
	}
	sp.Name, sp.ResumeFrom = r.runOf(i, row.Segment), seg.ResumeFrom
	r.trials[i].Spec, r.trials[i].Config = sp, seg.Config
	wid := fmt.Sprintf("%s-p%d", r.trialID(i), row.Segment)
	r.segOf[wid] = i
	r.launch(i, wid, sp)
}

// cloneRun is the run a trial's exploit clones its donor's checkpoint into.
func (r *search) cloneRun(i int) string {
	return runName(fmt.Sprintf("%s-p%d-clone", r.trialRun(i), r.res.Row(i).Segment+1))
}

// clone starts copying plan's donor checkpoint into trial i's clone run;
// done runs with the outcome.
func (r *search) clone(i int, plan *exploitPlan, done func(*spec.CloneCheckpointResult, error)) {
	ctx := r.ctx
	sp := r.trials[i].Spec.WithDefaults()
	// It heartbeats: a worker killed mid-copy is noticed within the trial's
	// heartbeat timeout, and the copy made again (a clone commits whole or not at all).
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{StartToCloseTimeout: time.Hour,
		HeartbeatTimeout: time.Duration(sp.Failure.HeartbeatTimeout), RetryPolicy: &temporal.RetryPolicy{MaximumAttempts: 3}})
	f := workflow.ExecuteActivity(actx, spec.ActivityCloneCheckpoint, spec.CloneCheckpointInput{
		From: plan.From, URL: sp.Checkpoint.URL, Run: r.cloneRun(i), Before: r.lastEpoch(i)})
	r.clones++
	r.sel.AddFuture(f, func(f workflow.Future) {
		r.clones--
		var out *spec.CloneCheckpointResult
		err := f.Get(ctx, &out)
		done(out, err)
	})
}

// exploit clones a stopped trial's donor checkpoint, then continues it (a
// search recorded before pbt-time-share).
func (r *search) exploit(i int, plan *exploitPlan) {
	r.clone(i, plan, func(out *spec.CloneCheckpointResult, err error) {
		plan.cloned, plan.cloneErr, plan.cloneDone, plan.childDone = out, err, true, true
		r.exploited(i, plan)
	})
}

// cloneAtDecision starts the clone of a time-shared search's exploit as it
// is decided; the trial continues once it has also stopped.
func (r *search) cloneAtDecision(i int, plan *exploitPlan) {
	r.clone(i, plan, func(out *spec.CloneCheckpointResult, err error) {
		plan.cloned, plan.cloneErr, plan.cloneDone = out, err, true
		if plan.childDone && !plan.abandoned {
			r.exploited(i, plan)
		}
	})
}

// exploited continues trial i, stopped and its donor's checkpoint cloned
// (or not: then from its own checkpoint and config, rather than nothing).
func (r *search) exploited(i int, plan *exploitPlan) {
	row := r.res.Row(i)
	if r.ctx.Err() != nil {
		row.Status, row.Reason = spec.TrialCancelled, "the search was cancelled while it exploited trial "+fmt.Sprint(plan.Donor)
		r.ended(i)
		return
	}
	out, err := plan.cloned, plan.cloneErr
	step := spec.Exploit{Epoch: plan.Epoch, From: plan.Donor, Changed: changedValues(row.Config, plan.Config)}
	seg := pendingSegment{Trial: i, Config: plan.Config, ResumeFrom: r.cloneRun(i)}
	if err != nil || out == nil {
		step.Changed, step.Reason = nil, "the clone failed, so it went on from its own checkpoint: "+shortError(err)
		seg = pendingSegment{Trial: i, Config: row.Config, ResumeFrom: r.runOf(i, row.Segment), Epochs: row.Epochs}
	} else {
		step.Cloned = out.Source.Run + "/" + out.Source.ID
		seg.Epochs = out.Clone.Epoch
	}
	addLineage(row, step)
	r.queue(seg)
}

// queue starts a trial's next segment, or keeps it: for the next execution
// if the search is draining, for a free slot if the search is time-shared.
func (r *search) queue(seg pendingSegment) {
	switch {
	case r.timeShared:
		r.res.Row(seg.Trial).Status = spec.TrialPaused
		r.ready = append(r.ready, seg) // fill starts it, or continueAsNew carries it
	case r.draining:
		r.carry = append(r.carry, seg)
	default:
		r.startSegment(seg)
	}
}

// fill starts trials and segments while there are free slots: the trials
// in order; a time-shared search's waiting segments too, the least trained
// first (a trial not started has trained least), as Ray's PBT chooses.
func (r *search) fill() {
	for r.ctx.Err() == nil && !r.draining && len(r.children) < r.s.MaxConcurrentTrials {
		k := -1
		for j, seg := range r.ready {
			if k < 0 || seg.Epochs < r.ready[k].Epochs {
				k = j
			}
		}
		switch {
		case k >= 0 && (r.next >= len(r.trials) || r.ready[k].Epochs == 0):
			seg := r.ready[k]
			r.ready = append(r.ready[:k], r.ready[k+1:]...)
			r.startSegment(seg)
		case r.next < len(r.trials):
			r.start(r.next)
			r.next++
		default:
			return
		}
	}
}

// waiting says whether a trial waits for a slot: one not started, or a
// time-shared segment.
func (r *search) waiting() bool { return r.next < len(r.trials) || len(r.ready) > 0 }

// lastEpoch is the epoch trial i ends at: its run's epochs, or sooner the
// search's stop.training_iteration (where a time-shared PBT knows it: a
// function trainer's epochs are many, and its program's own end is known
// only once it has returned; a donor paused at that end would leave its
// clone nothing to train).
func (r *search) lastEpoch(i int) int {
	n := r.trials[i].Spec.WithDefaults().Hyper.Epochs
	if th, ok := r.s.Stop[tune.TrainingIteration]; ok && r.timeShared && th >= 1 && th < float64(n) {
		n = int(math.Ceil(th))
	}
	return n
}

// onReport decides about a trial on its epoch's report: a stop criterion
// or the scheduler stops it; PBT may tell it to exploit a better trial.
func (r *search) onReport(rep spec.TrialReport) {
	s := r.s
	r.signals++
	i, ok := r.byID(rep.WorkflowID)
	if !ok {
		return
	}
	t := r.res.Row(i)
	if t == nil || t.Status != spec.TrialRunning {
		return // already stopping or ended: nothing more to decide
	}
	if err := missingMetric(s, rep.Metrics); err != nil {
		r.badMetric = fmt.Errorf("trial %d: %w", i, err)
		return
	}
	v := observe(t, rep, s.Metric, s.Mode, s.Scope)
	if t.Epochs >= r.trials[i].Spec.WithDefaults().Hyper.Epochs {
		return // its last epoch: it ends anyway
	}
	reason := ""
	if why := stopCriterion(s.Stop, t.Epochs, rep.Metrics); why != "" {
		reason, r.byCriterion[i] = why, true
	} else if r.sched.OnResult(tune.Result{Trial: i, Iteration: t.Epochs, Value: v}) == tune.Stop {
		reason = fmt.Sprintf("%s stopped it at epoch %d (%s %.4f)", r.res.Scheduler, t.Epochs, s.Metric, v)
	}
	if reason != "" {
		t.Status, t.Reason = spec.TrialStopping, reason
		r.children[i].SignalChildWorkflow(r.ctx, spec.SignalStop, nil)
		return
	}
	if r.pbt == nil || r.draining {
		return
	}
	due := r.pbt.Due(i, t.Epochs)
	var plan *exploitPlan
	if donor := r.pbt.Exploit(tune.Result{Trial: i, Iteration: t.Epochs, Value: v}); donor >= 0 {
		// A donor's checkpoint must leave epochs to train: one at the
		// run's end would end the trial (it cannot train past its epochs).
		// A paused donor's checkpoint stays (its next segment is a run of
		// its own), as does a running one's until it has saved keep_last more.
		d := r.res.Row(donor)
		if d != nil && d.Checkpoint != nil && (d.Status == spec.TrialRunning || r.timeShared && d.Status == spec.TrialPaused) &&
			d.Checkpoint.Epoch < r.lastEpoch(i) {
			plan = &exploitPlan{Donor: donor, From: *d.Checkpoint, Config: r.pbt.Explore(i, t.Epochs, d.Config), Epoch: t.Epochs}
			r.pbt.Cloned(i, donor)
			t.Status = spec.TrialExploiting
			if r.timeShared {
				r.cloneAtDecision(i, plan)
			}
		}
	}
	if plan == nil && r.timeShared && due && r.waiting() {
		plan = &exploitPlan{Donor: -1, Pause: true}
		t.Status, t.Reason = spec.TrialPaused, ""
	}
	if plan != nil {
		r.plans[i] = plan
		r.children[i].SignalChildWorkflow(r.ctx, spec.SignalStop, nil)
	}
}
