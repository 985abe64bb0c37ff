package workflows

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// Run states shown by the progress query and the Temporal UI.
const (
	StateFormingGang = "forming-gang"
	StateTraining    = "training"
	StateRecovering  = "recovering"
	StateCompleted   = "completed"
	StateStopped     = "stopped"
	StateFailed      = "failed"
)

// Progress is the run as the progress query shows it; it is also the state
// that continue-as-new carries and the workflow's result.
type Progress struct {
	State       string              `json:"state"`
	Run         string              `json:"run"`   // checkpoint run name
	Epoch       int                 `json:"epoch"` // epochs done
	Epochs      int                 `json:"epochs"`
	Generation  int                 `json:"generation"` // gangs formed so far
	Workers     int                 `json:"workers"`    // ranks asked for (scaling.workers)
	World       int                 `json:"world"`      // ranks of the current gang: fewer while degraded (scaling.min_workers)
	Attempts    int                 `json:"attempts"`   // epochs started, failed ones included
	Gang        []spec.Placement    `json:"gang,omitempty"`
	Metrics     []spec.EpochMetrics `json:"metrics,omitempty"`
	Failures    int                 `json:"failures"`
	Preemptions int                 `json:"preemptions"`
	Incidents   []Incident          `json:"incidents,omitempty"`
	Latest      *spec.CheckpointRef `json:"latest_checkpoint,omitempty"`
	Stopping    bool                `json:"stopping,omitempty"`
}

// Incident records a failure, a preemption, or a checkpoint skipped as corrupt.
type Incident struct {
	Generation int    `json:"generation"`
	Epoch      int    `json:"epoch"`
	Kind       string `json:"kind"` // "failure", "preemption", "gang-timeout", "corrupt-checkpoint"
	Detail     string `json:"detail"`
}

// input is what the workflow decodes: a spec, and on continue-as-new the state.
const continuedKey = "continued"

// ContinueAsNewAfterEvents bounds the history of one run (Temporal caps it at
// 51,200 events): past it, at an epoch boundary, the run continues as new.
var ContinueAsNewAfterEvents = 10000

var (
	gangBackoffBase = 5 * time.Second
	gangBackoffMax  = 2 * time.Minute
)

// TrainingWorkflow runs one training run. Its input is the JSON spec (see
// package spec): `temporal workflow start --type TrainingWorkflow --input '{...}'`.
func TrainingWorkflow(ctx workflow.Context, input json.RawMessage) (*Progress, error) {
	s, p, err := decodeInput(input)
	if err == nil {
		s = s.WithDefaults()
		err = s.Validate()
	}
	if err != nil {
		return nil, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	info := workflow.GetInfo(ctx)
	if p == nil {
		p = &Progress{Run: s.Name, Epochs: s.Hyper.Epochs, Workers: s.Scaling.Workers}
		if p.Run == "" {
			p.Run = runName(info.WorkflowExecution.ID)
		}
	}
	r := &run{spec: s, p: p, stop: workflow.NewBufferedChannel(ctx, 1),
		grants: workflow.GetSignalChannel(ctx, spec.SignalSlotGranted)}
	if err := workflow.SetQueryHandler(ctx, spec.QueryProgress, func() (*Progress, error) { return r.p, nil }); err != nil {
		return nil, err
	}
	// Stop arrives as a signal (fire and forget) or as an update, which is
	// answered when the run has ended, with its last checkpoint.
	workflow.Go(ctx, func(ctx workflow.Context) {
		signals := workflow.GetSignalChannel(ctx, spec.SignalStop)
		for signals.Receive(ctx, nil) {
			r.requestStop()
		}
	})
	// Damaged checkpoints a restore passed over, reported at once by rank 0.
	workflow.Go(ctx, func(ctx workflow.Context) {
		signals := workflow.GetSignalChannel(ctx, spec.SignalCheckpointSkipped)
		var c spec.CheckpointsSkipped
		for signals.Receive(ctx, &c) {
			for _, s := range c.Skipped {
				r.skipped(c.Generation, c.Epoch, s)
			}
		}
	})
	if err := workflow.SetUpdateHandlerWithOptions(ctx, spec.UpdateStop, func(ctx workflow.Context) (spec.StopResult, error) {
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
	}}); err != nil {
		return nil, err
	}
	r.elastic = workflow.GetVersion(ctx, "elastic-gangs", workflow.DefaultVersion, 1) >= 1
	p, err = r.train(ctx)
	r.ended = true
	// Answer the stop updates before the run closes.
	workflow.Await(ctx, func() bool { return workflow.AllHandlersFinished(ctx) })
	return p, err
}

// requestStop asks the run to stop after its current epoch.
func (r *run) requestStop() { r.stop.SendAsync(struct{}{}) }

type run struct {
	spec   spec.Training
	p      *Progress
	stop   workflow.Channel // stop requests, by signal or update
	grants workflow.ReceiveChannel
	gang   *gang
	probe  *probe // while the gang has fewer ranks than scaling.workers
	ended  bool
	// elastic: this run's history has the elastic-gangs version (each slot
	// held on its own context). Runs started before it replay without.
	elastic bool
}

// gang is a reserved set of slots, one per rank, held by HoldSlot activities.
type gang struct {
	generation int
	placements []spec.Placement
	holds      []workflow.Future
	release    workflow.CancelFunc
	secret     []byte
}

func (r *run) train(ctx workflow.Context) (*Progress, error) {
	logger := workflow.GetLogger(ctx)
	for r.p.Epoch < r.p.Epochs {
		r.checkStop()
		if r.p.Stopping {
			break
		}
		if r.gang == nil {
			r.setState(ctx, StateFormingGang)
			if err := r.formGang(ctx); err != nil {
				if errors.Is(err, errStopped) {
					break
				}
				return r.fail(ctx, err)
			}
		}
		r.setState(ctx, StateTraining)
		epoch := r.p.Epoch
		out := r.runEpoch(ctx, epoch)
		if out.result != nil {
			r.record(ctx, *out.result)
		}
		r.p.Latest = newer(r.p.Latest, out.latest)
		if out.err == nil {
			r.growGang(ctx)
		}
		if err := out.err; err != nil {
			r.releaseGang()
			if budgetErr := r.countFailure(ctx, epoch, err); budgetErr != nil {
				return r.fail(ctx, budgetErr)
			}
			r.setState(ctx, StateRecovering)
			logger.Warn("epoch failed; forming a new gang", "epoch", epoch, "error", err)
			continue
		}
		if n := workflow.GetInfo(ctx).GetCurrentHistoryLength(); r.p.Epoch < r.p.Epochs && !r.p.Stopping &&
			(n >= ContinueAsNewAfterEvents || workflow.GetInfo(ctx).GetContinueAsNewSuggested()) {
			r.releaseGang()
			next, err := encodeInput(r.spec, r.p)
			if err != nil {
				return nil, err
			}
			return nil, workflow.NewContinueAsNewError(ctx, spec.WorkflowTraining, next)
		}
	}
	r.checkStop()
	if r.p.Stopping && r.gang != nil && (r.p.Latest == nil || r.p.Latest.Epoch < r.p.Epoch) && r.p.Epoch > 0 {
		if err := r.saveCheckpoint(ctx); err != nil {
			logger.Warn("final checkpoint on stop failed", "error", err)
		}
	}
	r.releaseGang()
	if r.p.Stopping && r.p.Epoch < r.p.Epochs {
		r.setState(ctx, StateStopped)
	} else {
		r.setState(ctx, StateCompleted)
	}
	return r.p, nil
}

func (r *run) checkStop() {
	for r.stop.ReceiveAsync(nil) {
		r.p.Stopping = true
	}
}

var errStopped = errors.New("stopped while forming a gang")

// formGang reserves every slot at once or none: on timeout it releases what it
// holds and backs off with jitter, so that runs competing for too few slots
// take turns instead of each holding part of a gang.
func (r *run) formGang(ctx workflow.Context) error {
	for attempt := 0; ; attempt++ {
		r.p.Generation++
		gen := r.p.Generation
		g, err := r.reserve(ctx, gen)
		if err == nil {
			r.gang = g
			r.p.Gang, r.p.World = g.placements, len(g.placements)
			if n := len(g.placements); n < r.spec.Scaling.Workers {
				r.p.Incidents = append(r.p.Incidents, Incident{Generation: gen, Epoch: r.p.Epoch, Kind: "resized",
					Detail: fmt.Sprintf("only %d of %d slots within scaling.gang_timeout: going on with %d ranks (scaling.min_workers %d), global batch kept", n, r.spec.Scaling.Workers, n, r.spec.Scaling.MinWorkers)})
			}
			return nil
		}
		if errors.Is(err, errStopped) {
			return err
		}
		r.p.Incidents = append(r.p.Incidents, Incident{Generation: gen, Epoch: r.p.Epoch, Kind: "gang-timeout", Detail: err.Error()})
		var jitter time.Duration
		workflow.SideEffect(ctx, func(workflow.Context) any {
			return time.Duration(time.Now().UnixNano() % int64(gangBackoffBase))
		}).Get(&jitter)
		backoff := min(gangBackoffBase<<min(attempt, 5), gangBackoffMax) + jitter
		workflow.GetLogger(ctx).Info("gang not formed; backing off", "generation", gen, "backoff", backoff, "error", err)
		sel := workflow.NewSelector(ctx)
		sel.AddFuture(workflow.NewTimer(ctx, backoff), func(workflow.Future) {})
		sel.AddReceive(r.stop, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil); r.p.Stopping = true })
		sel.Select(ctx)
		if r.p.Stopping {
			return errStopped
		}
	}
}

// holdSlots starts one HoldSlot per request, each cancellable on its own;
// cancelling the returned release cancels them all.
func (r *run) holdSlots(ctx workflow.Context, gen int, requests []int) ([]workflow.Future, []workflow.CancelFunc, workflow.CancelFunc) {
	holdCtx, release := workflow.WithCancel(ctx)
	holdCtx = workflow.WithActivityOptions(holdCtx, workflow.ActivityOptions{
		TaskQueue:              r.spec.Scaling.TaskQueue,
		ScheduleToStartTimeout: time.Duration(r.spec.Scaling.GangTimeout),
		StartToCloseTimeout:    365 * 24 * time.Hour,
		HeartbeatTimeout:       time.Duration(r.spec.Failure.HeartbeatTimeout),
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	info := workflow.GetInfo(ctx)
	holds := make([]workflow.Future, len(requests))
	cancels := make([]workflow.CancelFunc, len(requests))
	for i, req := range requests {
		c, cancel := holdCtx, workflow.CancelFunc(func() {})
		if r.elastic {
			c, cancel = workflow.WithCancel(holdCtx)
		}
		cancels[i] = cancel
		holds[i] = workflow.ExecuteActivity(c, spec.ActivityHoldSlot, spec.HoldSlotInput{
			WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID, Generation: gen, Request: req})
	}
	return holds, cancels, release
}

// reserve starts one HoldSlot per rank and waits until each has signalled its
// placement, one of them fails, the gang timeout passes, or a stop arrives.
// At the timeout a gang of at least scaling.min_workers ranks is taken.
func (r *run) reserve(ctx workflow.Context, gen int) (*gang, error) {
	workers := r.spec.Scaling.Workers
	requests := make([]int, workers)
	for i := range requests {
		requests[i] = i
	}
	holds, cancels, release := r.holdSlots(ctx, gen, requests)
	var secret []byte
	workflow.SideEffect(ctx, func(workflow.Context) any { return newSecret() }).Get(&secret)

	placements := make([]spec.Placement, workers)
	granted := make([]bool, workers)
	ended := make([]bool, workers) // a hold that ended before it was granted: no slot came
	timedOut := false
	var holdErr error
	timerCtx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	timer := workflow.NewTimer(timerCtx, time.Duration(r.spec.Scaling.GangTimeout))
	count, gone := 0, 0
	for count < workers && count+gone < workers && !timedOut && holdErr == nil && !r.p.Stopping {
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(r.grants, func(c workflow.ReceiveChannel, _ bool) {
			var s spec.SlotGranted
			c.Receive(ctx, &s)
			if s.Generation != gen || s.Request < 0 || s.Request >= workers || granted[s.Request] || ended[s.Request] {
				return // a slot of an older gang, or a duplicate
			}
			granted[s.Request] = true
			placements[s.Request] = s.Placement
			count++
		})
		sel.AddFuture(timer, func(workflow.Future) { timedOut = true })
		sel.AddReceive(r.stop, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil); r.p.Stopping = true })
		for i, h := range holds {
			if ended[i] {
				continue
			}
			sel.AddFuture(h, func(f workflow.Future) {
				err := f.Get(ctx, nil)
				ended[i] = true
				if granted[i] {
					holdErr = fmt.Errorf("slot %d ended before the gang formed: %v", i, err)
				} else {
					gone++
				}
			})
		}
		sel.Select(ctx)
	}
	if r.p.Stopping {
		release()
		return nil, errStopped
	}
	if holdErr != nil {
		release()
		return nil, holdErr
	}
	if count < workers && count < r.spec.Scaling.MinWorkers {
		release()
		return nil, fmt.Errorf("only %d of %d slots on task queue %q within scaling.gang_timeout %v", count, workers, r.spec.Scaling.TaskQueue, r.spec.Scaling.GangTimeout)
	}
	// The whole gang, or at least min_workers of it: the ungranted holds go.
	g := &gang{generation: gen, release: release, secret: secret}
	for i := range workers {
		if granted[i] {
			g.placements = append(g.placements, placements[i])
			g.holds = append(g.holds, holds[i])
		} else {
			cancels[i]()
		}
	}
	for i := range g.placements {
		g.placements[i].Rank = i
	}
	return g, nil
}

// probe asks for the slots a degraded gang lacks, as the next generation's
// extra ranks; the slots it gets are held until the gang grows at an epoch
// boundary (grow), or released with the gang.
type probe struct {
	generation int
	requests   []int
	holds      []workflow.Future
	release    workflow.CancelFunc
	placements map[int]spec.Placement
	failed     bool
}

// growGang, at an epoch boundary of a degraded gang, starts a probe for the
// missing slots or, once the probe holds them all, makes the next gang: the
// current ranks and the probe's, which restore from the checkpoint just taken.
func (r *run) growGang(ctx workflow.Context) {
	g, workers := r.gang, r.spec.Scaling.Workers
	if g == nil || len(g.placements) >= workers || !r.elastic {
		return
	}
	if r.probe == nil || r.probe.failed {
		if r.probe != nil {
			r.probe.release()
		}
		r.p.Generation++
		pr := &probe{generation: r.p.Generation, placements: map[int]spec.Placement{}}
		for i := len(g.placements); i < workers; i++ {
			pr.requests = append(pr.requests, i)
		}
		pr.holds, _, pr.release = r.holdSlots(ctx, pr.generation, pr.requests)
		for _, h := range pr.holds {
			workflow.Go(ctx, func(ctx workflow.Context) {
				h.Get(ctx, nil)
				pr.failed = true // a probe's slot that ends (no slot in time, a lost worker) spoils the probe
			})
		}
		r.probe = pr
		return
	}
	pr := r.probe
	for {
		var s spec.SlotGranted
		if !r.grants.ReceiveAsync(&s) {
			break
		}
		if s.Generation == pr.generation {
			pr.placements[s.Request] = s.Placement
		}
	}
	if len(pr.placements) < len(pr.requests) {
		return
	}
	grown := &gang{generation: pr.generation, secret: nil,
		placements: append([]spec.Placement{}, g.placements...), holds: append([]workflow.Future{}, g.holds...)}
	for i, req := range pr.requests {
		pl := pr.placements[req]
		pl.Rank = len(grown.placements)
		grown.placements = append(grown.placements, pl)
		grown.holds = append(grown.holds, pr.holds[i])
	}
	oldRelease, probeRelease := g.release, pr.release
	grown.release = func() { oldRelease(); probeRelease() }
	workflow.SideEffect(ctx, func(workflow.Context) any { return newSecret() }).Get(&grown.secret)
	r.p.Incidents = append(r.p.Incidents, Incident{Generation: grown.generation, Epoch: r.p.Epoch, Kind: "resized",
		Detail: fmt.Sprintf("grew from %d to %d ranks", len(g.placements), len(grown.placements))})
	r.gang, r.probe = grown, nil
	r.p.Gang, r.p.World = grown.placements, len(grown.placements)
}

func (r *run) releaseGang() {
	if r.probe != nil {
		r.probe.release()
		r.probe = nil
	}
	if r.gang != nil {
		r.gang.release()
		r.gang = nil
		r.p.Gang = nil
		r.p.World = 0
	}
}

// epochOutcome is what one epoch of a gang came to.
type epochOutcome struct {
	result *spec.EpochResult   // a rank's full result, if any rank finished the epoch
	latest *spec.CheckpointRef // the newest checkpoint any rank reported, even in an error
	err    error               // why the gang ended, if it did
}

// runEpoch runs one RunEpoch per rank on the rank's own worker, in parallel.
// The first failure of a rank, or the loss of a slot's lease, cancels the
// rest; what the ranks had already reported still counts: a finished epoch
// and the checkpoint a preempted gang committed on its way out.
func (r *run) runEpoch(ctx workflow.Context, epoch int) epochOutcome {
	g := r.gang
	epochCtx, cancel := workflow.WithCancel(ctx)
	defer cancel()
	peers := make([]string, len(g.placements))
	for i, pl := range g.placements {
		peers[i] = pl.Collective
	}
	world := len(g.placements)
	// A degraded gang checkpoints every epoch, so growing back loses nothing.
	checkpoint := (epoch+1)%r.spec.Checkpoint.EveryEpochs == 0 || epoch+1 == r.p.Epochs || world < r.spec.Scaling.Workers
	// The global batch stays batch_size × workers whatever the gang's size.
	batch := (r.spec.Hyper.BatchSize*r.spec.Scaling.Workers + world - 1) / world
	resume := r.p.Attempts > 0
	r.p.Attempts++
	futures := make([]workflow.Future, len(g.placements))
	for rank, pl := range g.placements {
		actx := workflow.WithActivityOptions(epochCtx, workflow.ActivityOptions{
			TaskQueue:           pl.HostQueue,
			StartToCloseTimeout: 7 * 24 * time.Hour,
			HeartbeatTimeout:    time.Duration(r.spec.Failure.HeartbeatTimeout),
			RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		futures[rank] = workflow.ExecuteActivity(actx, spec.ActivityRunEpoch, spec.EpochInput{
			Run: r.p.Run, Generation: g.generation, Rank: rank, Peers: peers, Secret: g.secret,
			Epoch: epoch, Spec: r.spec, Restore: r.p.Latest, Resume: resume, Checkpoint: checkpoint,
			Slot: pl.Slot, BatchSize: batch,
		})
	}
	results := make([]spec.EpochResult, len(futures))
	errs := make([]error, len(futures))
	settled := make([]bool, len(futures))
	var leftWith []*spec.CheckpointRef // checkpoints the slots of a stopping worker reported
	done := 0
	var firstErr error
	sel := workflow.NewSelector(ctx)
	for rank, f := range futures {
		sel.AddFuture(f, func(f workflow.Future) {
			done++
			settled[rank] = true
			if errs[rank] = f.Get(ctx, &results[rank]); errs[rank] != nil && firstErr == nil {
				firstErr = &rankError{what: fmt.Sprintf("rank %d on %s", rank, g.placements[rank].Worker), err: errs[rank]}
			}
		})
	}
	for i, h := range g.holds {
		sel.AddFuture(h, func(f workflow.Future) {
			err := f.Get(ctx, nil)
			if firstErr == nil {
				firstErr = &rankError{what: fmt.Sprintf("lost the slot of rank %d on %s", i, g.placements[i].Worker), err: leaseErr(err)}
			}
			leftWith = append(leftWith, checkpointIn(err))
		})
	}
	for done < len(futures) && firstErr == nil {
		sel.Select(ctx)
	}
	if firstErr != nil {
		// Cancelled activities settle at once; those that finished keep their results.
		cancel()
		for rank, f := range futures {
			if !settled[rank] {
				errs[rank] = f.Get(ctx, &results[rank])
			}
		}
	}
	// The epoch counts if every rank finished it, or if a rank that finished
	// it committed its checkpoint (the rest failed after the state was safe).
	var out epochOutcome
	for rank := range futures {
		if errs[rank] != nil {
			continue
		}
		out.latest = newer(out.latest, results[rank].Checkpoint)
		if out.result == nil && (firstErr == nil || results[rank].Checkpoint != nil) {
			out.result = &results[rank]
		}
	}
	for _, err := range errs {
		out.latest = newer(out.latest, checkpointIn(err))
	}
	for _, ref := range leftWith {
		out.latest = newer(out.latest, ref)
	}
	if firstErr != nil {
		out.err = firstErr
		// A preemption explains the ranks that failed with it: charge the
		// gang's end to the preemption budget, not to max_failures.
		for rank, err := range errs {
			if err != nil && classify(err) == spec.ErrPreempted && classify(firstErr) != spec.ErrPreempted {
				out.err = &rankError{what: fmt.Sprintf("rank %d on %s", rank, g.placements[rank].Worker), err: err}
				break
			}
		}
	}
	return out
}

// checkpointIn is the checkpoint a preempted rank or slot reported in its error.
func checkpointIn(err error) *spec.CheckpointRef {
	var app *temporal.ApplicationError
	if err == nil || !errors.As(err, &app) || app.Type() != spec.ErrPreempted || !app.HasDetails() {
		return nil
	}
	var ref spec.CheckpointRef
	if app.Details(&ref) != nil || ref.ID == "" {
		return nil
	}
	return &ref
}

// newer is the later of two checkpoints by cursor.
func newer(a, b *spec.CheckpointRef) *spec.CheckpointRef {
	switch {
	case b == nil:
		return a
	case a == nil || b.Epoch > a.Epoch || b.Epoch == a.Epoch && b.Step > a.Step:
		return b
	}
	return a
}

// rankError names where an epoch failed and keeps the activity's error for
// classify, but reads as one line: the SDK's activity and application errors
// repeat their causes and metadata in Error().
type rankError struct {
	what string
	err  error
}

func (e *rankError) Error() string { return e.what + ": " + shortError(e.err) }
func (e *rankError) Unwrap() error { return e.err }

// shortError is the innermost message a person needs: an application error's
// own message, a timeout's kind, or the error as it is.
func shortError(err error) string {
	var app *temporal.ApplicationError
	var timeout *temporal.TimeoutError
	switch {
	case errors.As(err, &app):
		return app.Message()
	case errors.As(err, &timeout):
		return strings.ToLower(strings.TrimPrefix(timeout.TimeoutType().String(), "TIMEOUT_TYPE_")) + " timeout (the worker stopped answering)"
	}
	return err.Error()
}

func leaseErr(err error) error {
	if err == nil {
		return errors.New("the slot was released by its worker")
	}
	return err
}

func (r *run) record(ctx workflow.Context, res spec.EpochResult) {
	r.p.Metrics = append(r.p.Metrics, res.Metrics)
	// The ranks train the epoch their state is at: after a failure that is the
	// latest checkpoint's, which may be behind the epochs counted so far.
	r.p.Epoch = res.Metrics.Epoch + 1
	r.p.Latest = newer(r.p.Latest, res.Checkpoint)
	if res.Restored != nil {
		for _, s := range res.Restored.Skipped {
			r.skipped(r.p.Generation, res.Metrics.Epoch, s)
		}
	}
	workflow.UpsertMemo(ctx, map[string]any{"epoch": r.p.Epoch, "epochs": r.p.Epochs,
		"test_accuracy": res.Metrics.TestAccuracy, "test_loss": res.Metrics.TestLoss})
	// A trial of a search reports to it (fire and forget: a search that has
	// ended has nothing to decide).
	if parent := workflow.GetInfo(ctx).ParentWorkflowExecution; parent != nil {
		workflow.SignalExternalWorkflow(ctx, parent.ID, "", spec.SignalTrialReport,
			spec.TrialReport{WorkflowID: workflow.GetInfo(ctx).WorkflowExecution.ID, Metrics: res.Metrics, Checkpoint: r.p.Latest})
	}
}

// skipped records a checkpoint a restore passed over as damaged, once per gang.
func (r *run) skipped(gen, epoch int, s spec.SkippedCheckpoint) {
	detail := s.ID + ": " + s.Reason
	for _, inc := range r.p.Incidents {
		if inc.Kind == "corrupt-checkpoint" && inc.Generation == gen && inc.Detail == detail {
			return
		}
	}
	r.p.Incidents = append(r.p.Incidents, Incident{Generation: gen, Epoch: epoch, Kind: "corrupt-checkpoint", Detail: detail})
}

// countFailure charges an epoch's failure to the right budget, or returns the
// error that ends the run: a user error, or an exhausted budget.
func (r *run) countFailure(ctx workflow.Context, epoch int, err error) error {
	kind := classify(err)
	inc := Incident{Generation: r.p.Generation, Epoch: epoch, Detail: err.Error()}
	switch kind {
	case spec.ErrUser:
		return err
	case spec.ErrPreempted:
		inc.Kind = "preemption"
		r.p.Preemptions++
		r.p.Incidents = append(r.p.Incidents, inc)
		if r.p.Preemptions > r.spec.Failure.MaxPreemptions {
			return fmt.Errorf("%d preemptions exceed failure.max_preemptions %d; last: %w", r.p.Preemptions, r.spec.Failure.MaxPreemptions, err)
		}
	default:
		inc.Kind = "failure"
		r.p.Failures++
		r.p.Incidents = append(r.p.Incidents, inc)
		if r.p.Failures > r.spec.Failure.MaxFailures {
			return fmt.Errorf("%d failures exceed failure.max_failures %d; last: %w", r.p.Failures, r.spec.Failure.MaxFailures, err)
		}
	}
	return nil
}

// classify tells user errors and preemptions from infrastructure failures.
func classify(err error) string {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		switch app.Type() {
		case spec.ErrUser, spec.ErrPreempted:
			return app.Type()
		}
	}
	return "infrastructure"
}

func (r *run) saveCheckpoint(ctx workflow.Context) error {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		TaskQueue:           r.gang.placements[0].HostQueue,
		StartToCloseTimeout: time.Hour,
		HeartbeatTimeout:    time.Duration(r.spec.Failure.HeartbeatTimeout),
		RetryPolicy:         &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var ref spec.CheckpointRef
	in := spec.SaveCheckpointInput{Run: r.p.Run, Generation: r.gang.generation, Spec: r.spec}
	if n := len(r.p.Metrics); n > 0 {
		in.Metrics = r.p.Metrics[n-1]
	}
	if err := workflow.ExecuteActivity(actx, spec.ActivitySaveCheckpoint, in).Get(ctx, &ref); err != nil {
		return err
	}
	r.p.Latest = &ref
	return nil
}

func (r *run) fail(ctx workflow.Context, err error) (*Progress, error) {
	r.releaseGang()
	r.setState(ctx, StateFailed)
	if classify(err) == spec.ErrUser {
		return r.p, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	// The message says it all; a cause would print the same chain again.
	return r.p, temporal.NewNonRetryableApplicationError(err.Error(), "durabletrain.BudgetExhausted", nil)
}

// setState updates the state and the text the Temporal UI shows for the run.
func (r *run) setState(ctx workflow.Context, state string) {
	r.p.State = state
	var b strings.Builder
	fmt.Fprintf(&b, "**%s** · epoch %d/%d", state, r.p.Epoch, r.p.Epochs)
	if n := len(r.p.Metrics); n > 0 {
		m := r.p.Metrics[n-1]
		fmt.Fprintf(&b, " · test accuracy %.4f · loss %.4f · %.0f samples/s", m.TestAccuracy, m.TrainLoss, m.SamplesPerSecond)
	}
	if len(r.p.Gang) > 0 {
		workers := make([]string, len(r.p.Gang))
		for i, pl := range r.p.Gang {
			workers[i] = pl.Worker
		}
		fmt.Fprintf(&b, " · gang %d on %s", r.p.Generation, strings.Join(workers, ", "))
	}
	if r.p.Failures+r.p.Preemptions > 0 {
		fmt.Fprintf(&b, " · %d failures, %d preemptions", r.p.Failures, r.p.Preemptions)
	}
	workflow.SetCurrentDetails(ctx, b.String())
	if r.spec.SearchAttributes {
		if err := workflow.UpsertTypedSearchAttributes(ctx, stateAttribute.ValueSet(state), epochAttribute.ValueSet(int64(r.p.Epoch))); err != nil {
			workflow.GetLogger(ctx).Warn("search attributes not upserted", "error", err)
		}
	}
}

var (
	stateAttribute = temporal.NewSearchAttributeKeyKeyword(spec.SearchAttributeState)
	epochAttribute = temporal.NewSearchAttributeKeyInt64(spec.SearchAttributeEpoch)
)

var unsafeRunChars = regexp.MustCompile(`[^A-Za-z0-9._=+@-]`)

// runName turns a workflow ID into a checkpoint run name.
func runName(workflowID string) string {
	n := unsafeRunChars.ReplaceAllString(workflowID, "-")
	n = strings.TrimLeft(n, "._=+@-")
	if n == "" {
		n = "run"
	}
	if len(n) > 200 {
		n = n[:200]
	}
	return n
}

// decodeInput reads the spec strictly, and the carried state if this run continues another.
func decodeInput(raw json.RawMessage) (spec.Training, *Progress, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return spec.Training{}, nil, fmt.Errorf("spec: the input is not a JSON object: %v", err)
	}
	var p *Progress
	if c, ok := fields[continuedKey]; ok {
		if err := json.Unmarshal(c, &p); err != nil {
			return spec.Training{}, nil, fmt.Errorf("continued state: %v", err)
		}
		delete(fields, continuedKey)
		raw, _ = json.Marshal(fields)
	}
	s, err := spec.Parse(raw)
	return s, p, err
}

func encodeInput(s spec.Training, p *Progress) (json.RawMessage, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	json.Unmarshal(b, &fields)
	fields[continuedKey], _ = json.Marshal(p)
	return json.Marshal(fields)
}
