package workflows

import (
	"errors"
	"fmt"

	"go.temporal.io/sdk/converter"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// TrainingWorkflow runs one training run. Its input is the JSON spec (see
// package spec): `temporal workflow start --type TrainingWorkflow --input '{...}'`.
// Its result, and the answer of its progress query, is a spec.Progress.
//
// The files of this package split the run by what each part owns:
// training.go the run's life (handlers, the epoch loop, how it ends),
// gang.go gang formation, elastic.go growing a degraded gang back, epoch.go
// one epoch of a gang, stall.go the ring's stall timeout the run chooses,
// policy.go the decisions as pure functions, input.go the input and what
// continue-as-new carries.
//
// The input is taken raw (converter.RawValue; callers pass json.RawMessage),
// so that malformed JSON fails the run as a user error naming its position.
func TrainingWorkflow(ctx workflow.Context, input converter.RawValue) (*spec.Progress, error) {
	info := workflow.GetInfo(ctx)
	raw, err := inputBytes(input)
	var s spec.Training
	var p *spec.Progress
	var kept *keptGang
	if err == nil {
		s, p, kept, err = decodeInput(raw, info.ContinuedExecutionRunID != "")
	}
	stallLeftOut := s.Failure.StallTimeout == 0 // the run chooses it (stall.go)
	fresh := p == nil                           // the first execution: nothing carried
	if err == nil {
		s = s.WithDefaults()
		err = s.Validate()
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	// The run owns its checkpoint run name (checkpoint.Store.Claim), and a
	// name made from the workflow ID is that ID's alone.
	owned := workflow.GetVersion(ctx, "run-ownership", workflow.DefaultVersion, 1) >= 1
	if p == nil {
		p = &spec.Progress{Run: s.Name, Epochs: s.Hyper.Epochs, Workers: s.Scaling.Workers}
		if p.Run == "" && owned {
			p.Run = runName(info.WorkflowExecution.ID)
		} else if p.Run == "" {
			p.Run = legacyRunName(info.WorkflowExecution.ID)
		}
	}
	r := &run{spec: s, p: p, stop: workflow.NewBufferedChannel(ctx, 1),
		grants:      workflow.GetSignalChannel(ctx, spec.SignalSlotGranted),
		stallsHeard: workflow.GetSignalChannel(ctx, spec.SignalStallHeard)}
	if owned {
		r.owner = info.WorkflowExecution.ID + " (first run " + info.FirstRunID + ")"
	}
	if err := r.handle(ctx); err != nil {
		return nil, err
	}
	r.startTracking(ctx) // spec.mlflow: a field no earlier run's history holds
	r.elastic = workflow.GetVersion(ctx, "elastic-gangs", workflow.DefaultVersion, 1) >= 1
	// Ranks authenticate with keys of their own slots (no secret in history);
	// runs recorded before that drew a shared secret in a SideEffect.
	r.rankKeys = workflow.GetVersion(ctx, "rank-keys", workflow.DefaultVersion, 1) >= 1
	// A hold refused for want of free slots (a host's, several at once) is
	// asked for again; runs recorded before hosts counted it as no slot.
	r.hostHolds = workflow.GetVersion(ctx, "host-holds", workflow.DefaultVersion, 1) >= 1
	// The gang crosses continue-as-new (handover.go); runs recorded before
	// released it there and formed a new one.
	r.keepGang = workflow.GetVersion(ctx, "keep-gang", workflow.DefaultVersion, 1) >= 1
	// A hold that ends before its grant for any cause but the gang timeout
	// is asked for again; runs recorded before asked again only for ErrNoSlot.
	r.askAgain = workflow.GetVersion(ctx, "ask-again", workflow.DefaultVersion, 1) >= 1
	// A run lets go of the holds it gives up at once, through each host's
	// queue (release.go); runs recorded before only cancelled them.
	r.releaseByHost = workflow.GetVersion(ctx, "release-by-host", workflow.DefaultVersion, 1) >= 1
	// A broken gang's surviving hosts stay held for the next gang
	// (breakGang); runs recorded before let every host go.
	r.reuseHolds = workflow.GetVersion(ctx, "reuse-holds", workflow.DefaultVersion, 1) >= 1 && r.elastic && r.releaseByHost
	// Releases sent without waiting (a broken gang's lost hosts) are waited
	// for before the run closes or continues as new; runs recorded before
	// dropped those still pending.
	r.awaitReleases = workflow.GetVersion(ctx, "await-releases", workflow.DefaultVersion, 1) >= 1 && r.releaseByHost
	// A gang still missing hosts after hedgeAfter asks once for as many
	// more (reserve); runs recorded before waited for the holds they asked.
	r.hedgeHolds = workflow.GetVersion(ctx, "hedge-holds", workflow.DefaultVersion, 1) >= 1
	// Grants and restore reports that name another run are not this run's
	// (a reset run receives its base run's signals again); runs recorded
	// before took them by generation and request alone.
	r.ownSignals = workflow.GetVersion(ctx, "own-signals", workflow.DefaultVersion, 1) >= 1
	// A run whose spec leaves failure.stall_timeout out chooses it, and
	// raises it after a stall that proved false (stall.go); runs recorded
	// before kept the default. A run continued as new carries its choice.
	if workflow.GetVersion(ctx, "false-stalls", workflow.DefaultVersion, 1) >= 1 && fresh && stallLeftOut {
		p.StallTimeout = s.Failure.StallTimeout
	}
	if kept != nil && r.keepGang {
		r.takeOverGang(ctx, *kept)
	}
	p, err = r.train(ctx)
	r.ended = true
	// Answer the stop updates before the run closes.
	workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
	return p, err
}

type run struct {
	spec spec.Training
	p    *spec.Progress
	// published is what publish last wrote (memo, state and epoch), so
	// that an unchanged progress adds no command to the history.
	published string
	stop      workflow.Channel // stop requests, by signal or update
	grants    workflow.ReceiveChannel
	// stallsHeard: ranks' word that they heard their ring declare them
	// stalled (stall.go).
	stallsHeard workflow.ReceiveChannel
	gang        *gang
	probe       *probe // while the gang has fewer ranks than scaling.workers
	// survivors: the hosts of the last broken gang kept for the next one.
	survivors *survivingHosts
	ended     bool
	// elastic: this run's history has the elastic-gangs version (each slot
	// held on its own context). Runs started before it replay without.
	elastic bool
	// rankKeys: ranks authenticate with their slots' keys, not a gang secret.
	rankKeys bool
	// hostHolds: a hold refused with ErrNoSlot is started again.
	hostHolds bool
	// keepGang: the gang crosses continue-as-new.
	keepGang bool
	// askAgain: a hold lost before its grant is started again whatever ended it.
	askAgain bool
	// releaseByHost: holds given up are let go of through their hosts' queues.
	releaseByHost bool
	// reuseHolds: a broken gang's surviving hosts are kept for the next gang.
	reuseHolds bool
	// awaitReleases: releases sent without waiting are waited for at the end.
	awaitReleases bool
	// hedgeHolds: a gang still missing hosts after hedgeAfter asks for more.
	hedgeHolds bool
	// ownSignals: grants and restore reports of other runs are dropped (ofAnotherRun).
	ownSignals bool
	// releasing: those releases, while not answered (letGo).
	releasing []workflow.Future
	// heard: the latest rank's word that it heard its ring declare it
	// stalled, until the failure it is about is charged (reviewStall).
	heard *spec.StallHeard
	// stalled: the rank declared stalled when the last gang broke, if one was.
	stalled stallCharged
	// owner claims the run's checkpoint name for this workflow (EpochInput.Owner).
	owner string
	// signals counts the signals this execution has received (Temporal
	// bounds them per execution).
	signals int
	// track logs the run to its MLflow tracking server (tracker.go), if its spec names one.
	track *tracker
}

// handle sets up the query, signal and update handlers of a run.
func (r *run) handle(ctx workflow.Context) error {
	if err := workflow.SetQueryHandler(ctx, spec.QueryProgress, func() (*spec.Progress, error) { return r.p, nil }); err != nil {
		return err
	}
	// Stop arrives as a signal (fire and forget) or as an update, which is
	// answered when the run has ended, with its last checkpoint.
	workflow.Go(ctx, func(ctx workflow.Context) {
		signals := workflow.GetSignalChannel(ctx, spec.SignalStop)
		for signals.Receive(ctx, nil) {
			r.signals++
			r.requestStop()
		}
	})
	// Damaged checkpoints a restore passed over, reported at once by rank 0.
	workflow.Go(ctx, func(ctx workflow.Context) {
		signals := workflow.GetSignalChannel(ctx, spec.SignalCheckpointSkipped)
		var c spec.CheckpointsSkipped
		for signals.Receive(ctx, &c) {
			r.signals++
			for _, s := range c.Skipped {
				r.skipped(c.Generation, c.Epoch, s)
			}
		}
	})
	// Where a new gang's state came from, reported by rank 0 once the gang
	// agreed on it (the epoch's result reports it too, if the gang lasts).
	workflow.Go(ctx, func(ctx workflow.Context) {
		signals := workflow.GetSignalChannel(ctx, spec.SignalGangRestored)
		for {
			var g spec.GangRestored
			if !signals.Receive(ctx, &g) {
				return
			}
			r.signals++
			if g.Generation >= 1 && g.Generation <= r.p.Generation && !r.ofAnotherRun(ctx, g.RunID) {
				r.restored(g.Generation, g.Epoch, g.Report)
				if publishesProgress(ctx) {
					r.publish(ctx) // the UI's memo counts the incident while the epoch goes on
				}
			}
		}
	})
	// A rank its ring declared stalled heard the verdict: it was alive.
	// (The epoch loop also takes those waiting when it charges a failure.)
	workflow.Go(ctx, func(ctx workflow.Context) {
		for {
			var h spec.StallHeard
			if !r.stallsHeard.Receive(ctx, &h) {
				return
			}
			r.signals++
			r.heardStall(ctx, h)
		}
	})
	return workflow.SetUpdateHandlerWithOptions(ctx, spec.UpdateStop, func(ctx workflow.Context) (spec.StopResult, error) {
		r.requestStop()
		if err := workflow.Await(ctx, func() bool { return r.ended }); err != nil {
			return spec.StopResult{}, err
		}
		return spec.StopResult{State: r.p.State, Epoch: r.p.Epoch, Latest: r.p.Latest}, nil
	}, workflow.UpdateHandlerOptions{Validator: func() error {
		if r.ended {
			return fmt.Errorf("run %s has already ended (%s)", r.p.Run, r.p.State)
		}
		return nil
	}})
}

// ofAnotherRun says whether a grant or a restore report was sent to
// another run of this workflow: the one a reset run was reset from, whose
// signals Temporal applies again to the reset run. Its generations and
// requests are numbered as this run's are, so they cannot tell. Senders
// before SlotGranted.RunID name no run, and are taken as this run's.
func (r *run) ofAnotherRun(ctx workflow.Context, runID string) bool {
	return r.ownSignals && runID != "" && runID != workflow.GetInfo(ctx).WorkflowExecution.RunID
}

// takeGrant receives the next slot grant c holds, if it holds one, and
// counts the signal. It returns the grant only if it is this run's: one
// that did not decode (the SDK logs and drops it) is not received, and one
// sent to another run (ofAnotherRun) is received but returned as nil.
func (r *run) takeGrant(ctx workflow.Context, c workflow.ReceiveChannel) (_ *spec.SlotGranted, received bool) {
	var s spec.SlotGranted
	if !c.ReceiveAsync(&s) {
		return nil, false
	}
	r.signals++
	if r.ofAnotherRun(ctx, s.RunID) {
		return nil, true
	}
	return &s, true
}

// requestStop asks the run to stop after its current epoch.
func (r *run) requestStop() { r.stop.SendAsync(struct{}{}) }

func (r *run) checkStop() {
	for r.stop.ReceiveAsync(nil) {
		r.p.Stopping = true
	}
}

// train is the epoch loop: form a gang, run epochs on it, re-form it after a
// failure, continue as new before the history grows too long.
func (r *run) train(ctx workflow.Context) (*spec.Progress, error) {
	logger := workflow.GetLogger(ctx)
	for r.p.Epoch < r.p.Epochs {
		if ctx.Err() != nil {
			return r.cancelled(ctx)
		}
		r.checkStop()
		if r.p.Stopping {
			break
		}
		if r.gang == nil {
			r.setState(ctx, spec.StateFormingGang)
			if err := r.formGang(ctx); err != nil {
				if errors.Is(err, errStopped) {
					break
				}
				if ctx.Err() != nil {
					return r.cancelled(ctx)
				}
				return r.fail(ctx, err)
			}
		}
		r.setState(ctx, spec.StateTraining)
		epoch := r.p.Epoch
		out := r.runEpoch(ctx, epoch)
		if ctx.Err() != nil {
			// Cancelled: what the ranks finished still counts, nothing is charged.
			if out.result != nil && out.err == nil {
				r.record(ctx, *out.result)
			}
			r.p.Latest = newer(r.p.Latest, out.latest)
			return r.cancelled(ctx)
		}
		if out.result != nil {
			r.record(ctx, *out.result)
		}
		r.p.Latest = newer(r.p.Latest, out.latest)
		if out.err != nil {
			r.breakGang(ctx, out.survivors)
			inc, fatal := charge(r.p, r.spec.Failure, epoch, out.err)
			countFailure(ctx, inc)
			if inc != nil {
				r.p.AddIncident(*inc)
			}
			r.stalled = stallCharged{generation: r.p.Generation, rank: out.stalled}
			if out.heard != nil && r.p.StallTimeout != 0 {
				r.heard = out.heard // from the activity's own result: this run's
			}
			if r.reviewStall(ctx) || fatal != nil && r.awaitStallWord(ctx) {
				fatal = nil // not charged after all: no budget exhausted
			}
			if fatal != nil {
				return r.fail(ctx, fatal)
			}
			r.setState(ctx, spec.StateRecovering)
			logger.Warn("epoch failed; forming a new gang", "epoch", epoch, "error", out.err)
			continue
		}
		r.growGang(ctx)
		info := workflow.GetInfo(ctx)
		if continueAsNew(r.p, info.GetCurrentHistoryLength(), r.signals, info.GetContinueAsNewSuggested()) {
			r.flushTracking(ctx, false) // what is left crosses in Progress.MLflow
			kept := r.keepForNext(ctx)
			next, err := encodeInput(r.spec, r.p, kept)
			if err != nil {
				return nil, err
			}
			return nil, workflow.NewContinueAsNewError(ctx, spec.WorkflowTraining, next)
		}
	}
	r.checkStop()
	if r.p.Stopping && r.gang != nil && (r.p.Latest == nil || r.p.Latest.Epoch < r.p.Epoch) && r.p.Epoch > 0 {
		r.setState(ctx, spec.StateCheckpointing)
		if err := r.saveCheckpoint(ctx); err != nil {
			logger.Warn("final checkpoint on stop failed", "error", err)
		}
	}
	if ctx.Err() != nil {
		return r.cancelled(ctx)
	}
	r.releaseGang(ctx, true)
	if r.p.Stopping && r.p.Epoch < r.p.Epochs {
		r.setState(ctx, spec.StateStopped)
	} else {
		r.setState(ctx, spec.StateCompleted)
	}
	r.endTracking(ctx)
	return r.p, nil
}

// cancelled ends a cancelled run: the holds of its slots were cancelled with
// the workflow's context (their workers free the slots at once), its
// checkpoints stay, and the workflow closes as cancelled.
func (r *run) cancelled(ctx workflow.Context) (*spec.Progress, error) {
	r.releaseGang(ctx, true)
	r.setState(ctx, spec.StateCancelled)
	r.endTracking(ctx)
	workflow.GetLogger(ctx).Info("run cancelled", "epoch", r.p.Epoch, "latest", r.p.Latest)
	return r.p, ctx.Err()
}

func (r *run) fail(ctx workflow.Context, err error) (*spec.Progress, error) {
	r.releaseGang(ctx, true)
	r.setState(ctx, spec.StateFailed)
	r.endTracking(ctx)
	return r.p, runFailure(err)
}

// setState updates the state, the text the Temporal UI shows for the run,
// and (when the spec asks) its search attributes.
func (r *run) setState(ctx workflow.Context, state string) {
	r.p.State = state
	switch state {
	case spec.StateCompleted, spec.StateStopped, spec.StateFailed, spec.StateCancelled:
		workflow.GetMetricsHandler(ctx).WithTags(map[string]string{"state": state}).Counter(metricname.RunsEnded).Inc(1)
	}
	workflow.SetCurrentDetails(ctx, details(r.p))
	if publishesProgress(ctx) {
		r.publish(ctx)
		return
	}
	r.upsertSearchAttributes(ctx)
}

// countFailure counts a charged failure, preemption or forged grant by its
// incident kind (a user error, which ends the run, has none).
func countFailure(ctx workflow.Context, inc *spec.Incident) {
	kind := "user-error"
	if inc != nil {
		kind = inc.Kind
	}
	h := workflow.GetMetricsHandler(ctx)
	if kind == spec.IncidentPreemption {
		h.Counter(metricname.Preemptions).Inc(1)
	}
	h.WithTags(map[string]string{"kind": kind}).Counter(metricname.Failures).Inc(1)
}

var (
	stateAttribute = temporal.NewSearchAttributeKeyKeyword(spec.SearchAttributeState)
	epochAttribute = temporal.NewSearchAttributeKeyInt64(spec.SearchAttributeEpoch)
)
