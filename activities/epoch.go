package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// RunEpoch trains the epoch the rank's state is at, on this rank's shard.
//
// When the worker is told to shut down (SIGTERM, a preemption) the rank does
// not drop out: it votes to leave in the next step's all-reduce, the whole
// gang stops after that same step, rank 0 checkpoints there (mid-epoch), and
// every rank returns a preemption that carries the checkpoint's reference.
// Only if that takes longer than LeaveTimeout is the rank cut off.
//
// The input is one host's: its local ranks train side by side in this
// process, in one activity, so Temporal sees one activity per host and
// epoch however many GPUs the host has.
func (a *Agent) RunEpoch(ctx context.Context, in spec.EpochInput) (spec.EpochResult, error) {
	a.init()
	ranks, places, err := in.RankInputs()
	if err != nil {
		return spec.EpochResult{}, temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, nil)
	}
	beat := startHeartbeat(ctx, a.gpuStats(ranks[0].Slot))
	defer beat.stop()
	if len(ranks) == 1 {
		res, err := a.runRank(ctx, ranks[0], places[0], beat)
		return res, hostError(err, ranks[0], places[0])
	}
	// A rank that fails breaks the gang's collective, so the others fail
	// with it; the host reports the most telling of its ranks' ends.
	results := make([]spec.EpochResult, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for l := range ranks {
		wg.Go(func() { results[l], errs[l] = a.runRank(ctx, ranks[l], places[l], beat) })
	}
	wg.Wait()
	res, err := hostEnd(results, errs)
	return res, hostError(err, ranks[0], places[0])
}

// hostEnd is how a host's epoch ended, from its ranks' ends: the first
// rank's result if every rank finished; else a user error before a
// preemption that carries a checkpoint before any preemption before a
// rank's own failure before the lowest rank's error (a rank's own failure
// is any error but a collective's blaming a peer: blame tells the run
// whether this host is to blame).
func hostEnd(results []spec.EpochResult, errs []error) (spec.EpochResult, error) {
	var first error
	for _, err := range errs {
		if err != nil && first == nil {
			first = err
		}
	}
	if first == nil {
		res := results[0]
		for _, r := range results[1:] {
			if res.Checkpoint == nil {
				res.Checkpoint = r.Checkpoint
			}
			if res.Restored == nil {
				res.Restored = r.Restored
			}
		}
		return res, nil
	}
	firstOf := func(pick func(*temporal.ApplicationError) bool) error {
		for _, err := range errs {
			var app *temporal.ApplicationError
			if errors.As(err, &app) && pick(app) {
				return err
			}
		}
		return nil
	}
	for _, pick := range []func(*temporal.ApplicationError) bool{
		func(app *temporal.ApplicationError) bool { return app.Type() == spec.ErrUser },
		func(app *temporal.ApplicationError) bool { return app.Type() == spec.ErrPreempted && app.HasDetails() },
		func(app *temporal.ApplicationError) bool { return app.Type() == spec.ErrPreempted },
	} {
		if err := firstOf(pick); err != nil {
			return spec.EpochResult{}, err
		}
	}
	for _, err := range errs {
		var pe *collective.PeerError
		if err != nil && !errors.As(err, &pe) {
			return spec.EpochResult{}, err
		}
	}
	return spec.EpochResult{}, first
}

// runRank trains one rank's epoch; the host's heartbeat carries its progress.
func (a *Agent) runRank(ctx context.Context, in spec.EpochInput, place spec.LocalPlace, beat *heartbeat) (spec.EpochResult, error) {
	key := keyOf(ctx, in.Generation, in.Rank)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer a.slots.running(in.Slot, cancel)()
	leave := a.watchStop(ctx, cancel, in)
	// Between epochs, the slot's GPU must still be healthy: one that is not
	// is withdrawn, and the run goes on without it.
	if s, ok := a.slotAt(in.Slot); ok {
		a.checkHealth([]Slot{s})
		if reason := a.slotProblem(in.Slot); reason != "" {
			return spec.EpochResult{}, a.classify(ctx, key, in.Slot, healthError(s, reason), leave)
		}
	}

	rep, restored, err := a.replica(ctx, key, in, place, beat)
	if err == nil && isClosed(leave) {
		err = errShuttingDown // joined or restored while stopping: nothing trained, nothing to save
	}
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	rep.metrics.heartbeat()
	beat.onBeat(rep.metrics.heartbeat)
	if c := rep.tr.Cursor(); restored != nil && c.Epoch >= in.Spec.Hyper.Epochs {
		return a.nothingLeft(ctx, key, rep, in, restored)
	}
	epoch := rep.tr.Cursor().Epoch
	tctx, span := tracer.Start(ctx, "epoch.train", trace.WithAttributes(attribute.String("run", in.Run), attribute.Int("rank", in.Rank), attribute.Int("epoch", epoch)))
	m, err := a.trainEpoch(tctx, rep, in, leave, beat)
	endSpan(span, err)
	if errors.Is(err, trainer.ErrFinished) {
		a.Log.Info("the program finished its training", zap.String("run", in.Run), zap.Int("rank", in.Rank), zap.Int("before_epoch", epoch))
		return spec.EpochResult{Rank: in.Rank, Finished: true, Metrics: spec.EpochMetrics{Epoch: epoch}}, nil
	}
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	if m.Left {
		return spec.EpochResult{}, a.leaveGang(ctx, key, rep, in, leave, beat)
	}
	ectx, span := tracer.Start(ctx, "epoch.evaluate", trace.WithAttributes(attribute.String("run", in.Run), attribute.Int("rank", in.Rank), attribute.Int("epoch", epoch)))
	e, err := rep.tr.Evaluate(ectx)
	endSpan(span, err)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	res := spec.EpochResult{Rank: in.Rank, Restored: restored, Metrics: spec.EpochMetrics{
		Epoch: epoch, Steps: m.Steps, TrainLoss: m.TrainLoss, TestLoss: e.TestLoss, TestAccuracy: e.TestAccuracy,
		SamplesPerSecond: m.SamplesPerSecond, Seconds: m.Seconds, Other: e.Other, Absent: e.Absent}}
	if c := in.Spec.Checkpoint; c.KeepBest > 0 {
		// keep_best ranks checkpoints by a metric the run must report.
		if err := res.Metrics.MissingMetric("checkpoint.score", c.Score); err != nil {
			return spec.EpochResult{}, a.classify(ctx, key, in.Slot, userError(err), leave)
		}
	}
	a.logEpoch(in, res.Metrics)
	rep.metrics.epoch(res.Metrics.SamplesPerSecond, res.Metrics.Map())
	a.writeEpochEvents(ctx, rep, in, res.Metrics)
	// A rank whose worker began stopping during the epoch's last step or the
	// evaluation asks for a checkpoint now, so its gang's successor loses nothing.
	leaving, err := anyLeaving(ctx, rep, leave)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	if in.Checkpoint || leaving || epochCheckpointDue(in.Spec, epoch) {
		beat.set(map[string]any{"epoch": epoch, "checkpointing": true})
		ref, err := a.checkpointTogether(ctx, rep, in, &res.Metrics)
		if err != nil {
			return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
		}
		res.Checkpoint = ref
	}
	return res, nil
}

// epochCheckpointDue says whether the spec asks for a checkpoint after epoch.
func epochCheckpointDue(s spec.Training, epoch int) bool {
	every := max(1, s.Checkpoint.EveryEpochs)
	return (epoch+1)%every == 0 || epoch+1 >= s.Hyper.Epochs
}

// watchStop returns a channel closed once the worker begins to stop; if the
// gang has not left LeaveTimeout later, the rank is cut off (cancel).
func (a *Agent) watchStop(ctx context.Context, cancel context.CancelCauseFunc, in spec.EpochInput) <-chan struct{} {
	leave := make(chan struct{})
	go func() {
		select {
		case <-activity.GetWorkerStopChannel(ctx):
			close(leave)
			a.Log.Info("worker stopping: the gang leaves at the next step", zap.String("run", in.Run),
				zap.Int("generation", in.Generation), zap.Int("rank", in.Rank), zap.Duration("leave_timeout", a.leaveTimeout()))
			select {
			case <-time.After(a.leaveTimeout()):
				cancel(errShuttingDown)
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	return leave
}

func (a *Agent) logEpoch(in spec.EpochInput, m spec.EpochMetrics) {
	fields := []zap.Field{zap.String("run", in.Run), zap.Int("generation", in.Generation), zap.Int("rank", in.Rank),
		zap.Int("epoch", m.Epoch), zap.Float64("train_loss", m.TrainLoss), zap.Float64("test_accuracy", m.TestAccuracy),
		zap.Float64("samples_per_second", m.SamplesPerSecond)}
	if gpu := a.gpuStats(in.Slot); gpu != nil {
		if g, ok := gpu(); ok {
			fields = append(fields, zap.Int("gpu_utilization_percent", g.UtilizationPercent), zap.Uint64("gpu_memory_used_bytes", g.MemoryUsedBytes))
		}
	}
	a.Log.Info("epoch done", fields...)
}

// trainEpoch trains the rest of the replica's epoch, stopping every
// checkpoint.every_steps steps for a mid-epoch checkpoint, and returns the
// metrics of all the steps it ran.
func (a *Agent) trainEpoch(ctx context.Context, rep *replica, in spec.EpochInput, leave <-chan struct{}, beat *heartbeat) (trainer.EpochMetrics, error) {
	epoch := rep.tr.Cursor().Epoch
	every := in.Spec.Checkpoint.EverySteps
	var total trainer.EpochMetrics
	var lossSum float64
	ran := 0
	for {
		rep.metrics.pause()
		from := rep.tr.Cursor().Step
		opts := trainer.EpochOptions{Leave: leave, Progress: func(p trainer.Progress) {
			detail := map[string]any{"epoch": p.Epoch, "step": p.Step, "steps": p.Steps}
			if !p.NoLoss {
				detail["loss"] = p.Loss
			}
			beat.set(detail)
			rep.metrics.step(p, in.BatchSize)
			if rep.events != nil {
				rep.events.step(p)
			}
		}}
		if every > 0 {
			opts.UntilStep = (from/every + 1) * every
		}
		m, err := rep.tr.TrainEpoch(ctx, epoch, opts)
		if err != nil {
			return m, err
		}
		c := rep.tr.Cursor()
		n := m.Steps - from // steps run when the epoch ended
		if c.Epoch == epoch {
			n = c.Step - from
		}
		total.Epoch, total.Steps, total.Left = epoch, m.Steps, m.Left
		total.Samples += m.Samples
		total.Seconds += m.Seconds
		lossSum += m.TrainLoss * float64(n)
		ran += n
		if ran > 0 {
			total.TrainLoss = lossSum / float64(ran)
		}
		if total.Seconds > 0 {
			total.SamplesPerSecond = float64(total.Samples) / total.Seconds
		}
		if m.Left || c.Epoch != epoch {
			return total, nil
		}
		// Stopped at an every_steps boundary: checkpoint there and go on.
		beat.set(map[string]any{"epoch": epoch, "step": c.Step, "checkpointing": true})
		if canSaveInBackground(rep, in) {
			err = a.checkpointInBackground(ctx, rep, in)
		} else {
			_, err = a.checkpointTogether(ctx, rep, in, nil)
		}
		if err != nil {
			return total, err
		}
	}
}

// leaveGang ends an epoch the gang voted to leave: checkpoint where every
// rank stopped, then report the preemption with that checkpoint.
func (a *Agent) leaveGang(ctx context.Context, key replicaKey, rep *replica, in spec.EpochInput, leave <-chan struct{}, beat *heartbeat) error {
	c := rep.tr.Cursor()
	beat.set(map[string]any{"epoch": c.Epoch, "step": c.Step, "checkpointing": true, "leaving": true})
	ref, err := a.checkpointTogether(ctx, rep, in, nil)
	msg, end := fmt.Sprintf("worker %s is shutting down", a.Identity), preemption
	if !isClosed(leave) {
		// This rank's worker stays: its state, the one just checkpointed,
		// is kept for the next gang, which then reads nothing from storage.
		msg, end = "stopped with its gang: another rank's worker is shutting down", leftWithGang
		a.keepSurvivor(ctx, rep, nil)
	}
	a.replicas.drop(key)
	if err != nil {
		a.Log.Warn("leaving without a checkpoint", zap.String("run", in.Run), zap.Int("rank", in.Rank), zap.Error(err))
		return end(msg+"; the checkpoint on leaving failed: "+err.Error(), nil)
	}
	a.Log.Info("left the gang after a checkpoint", zap.String("run", in.Run), zap.Int("rank", in.Rank), zap.String("checkpoint", ref.ID))
	return end(msg, ref)
}

// anyLeaving asks the gang whether any rank's worker is stopping (one float all-reduce).
func anyLeaving(ctx context.Context, rep *replica, leave <-chan struct{}) (bool, error) {
	vote := []float32{0}
	if isClosed(leave) {
		vote[0] = 1
	}
	if err := rep.group.AllReduce(ctx, vote); err != nil {
		return false, err
	}
	return vote[0] > 0, nil
}

// nothingLeft answers an epoch whose gang restored a checkpoint at the
// run's end: resume_from a run that had finished, or the last epoch's
// result lost after its checkpoint committed. Nothing is trained: the
// result is the last epoch's metrics as the checkpoint recorded them, and
// the checkpoint, the run's own (a copy, saved by this gang, if it came
// from another run).
func (a *Agent) nothingLeft(ctx context.Context, key replicaKey, rep *replica, in spec.EpochInput, restored *spec.RestoreReport) (spec.EpochResult, error) {
	c := rep.tr.Cursor()
	m := spec.MetricsFromMap(c.Epoch-1, rep.restoredMetrics)
	ref := restored.From
	if ref.Run != in.Run {
		saved, err := a.checkpointTogether(ctx, rep, in, &m)
		if err != nil {
			return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, nil)
		}
		ref = *saved
	}
	a.Log.Info("nothing left to train: the checkpoint restored is at the run's end", zap.String("run", in.Run), zap.Int("rank", in.Rank),
		zap.String("restored", restored.From.Run+"/"+restored.From.ID), zap.Int("epochs", in.Spec.Hyper.Epochs))
	return spec.EpochResult{Rank: in.Rank, Restored: restored, Checkpoint: &ref, Metrics: m}, nil
}
