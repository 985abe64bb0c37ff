package activities

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// restore brings a cold replica to where its run stands: a survivor's
// state from the gang before, if one of the gang's ranks holds one at
// least as new as the run's latest checkpoint (survivors.go); else the
// run's latest verified checkpoint once the run has trained before
// (Resume, or a known checkpoint), else spec.resume_from's, else fresh weights.
func (a *Agent) restore(ctx context.Context, rep *replica, in spec.EpochInput) (*spec.RestoreReport, error) {
	peerReport, ok, survivorsAt, err := a.restoreFromPeers(ctx, rep, in)
	if err != nil || ok {
		return peerReport, err
	}
	sources := []string{}
	if in.Restore != nil || in.Resume {
		sources = append(sources, in.Run)
	}
	if in.Spec.ResumeFrom != "" {
		sources = append(sources, in.Spec.ResumeFrom)
	}
	for i, from := range sources {
		start := time.Now()
		sctx, span := tracer.Start(ctx, "checkpoint.restore", trace.WithAttributes(attribute.String("run", from), attribute.Int("rank", in.Rank)))
		c, err := rep.store.RestoreLatest(sctx, from, func(c *checkpoint.Checkpoint) error { return a.load(sctx, rep, in, c) })
		endSpan(span, err)
		switch {
		case err == nil:
			rep.metrics.checkpoint("restore", c.BytesRead(), time.Since(start))
			report := &spec.RestoreReport{From: refOf(c, rep.storeURL), Bytes: c.BytesRead(), SurvivorsAt: survivorsAt}
			for _, s := range c.Skipped {
				report.Skipped = append(report.Skipped, spec.SkippedCheckpoint{ID: s.ID, Reason: s.Reason})
			}
			if in.Spec.Checkpoint.Sharded { // the same on every rank: this is a collective
				// Each rank read its own part: a damaged part may have sent
				// one rank to an older checkpoint than the others.
				restored := c
				if c, err = a.agreeOnCheckpoint(ctx, rep, in, i, from, c); err != nil {
					return nil, err
				}
				if c != restored { // an older one, read as well
					report.Bytes += c.BytesRead()
				}
				report.From = refOf(c, rep.storeURL)
			}
			rep.restoredMetrics = c.Manifest.Metrics
			a.Log.Info("restored", zap.String("run", from), zap.String("checkpoint", c.Manifest.ID), zap.Int("rank", in.Rank), zap.Int("skipped", len(c.Skipped)))
			if len(report.Skipped) > 0 && in.Rank == 0 {
				a.reportSkipped(ctx, in.Generation, c, report.Skipped)
			}
			return report, nil
		case !errors.Is(err, checkpoint.ErrNoCheckpoint):
			return nil, err
		case from == in.Spec.ResumeFrom && i == len(sources)-1:
			return nil, userError(fmt.Errorf("cannot resume from run %s: %w", from, err))
		case in.Restore != nil:
			// The workflow saw this checkpoint committed: its loss is not a fresh start.
			return nil, fmt.Errorf("run %s: checkpoint %s was committed but no verified checkpoint is left: %w", in.Run, in.Restore.ID, err)
		}
		// The run trained before but never committed a checkpoint: go on to the next source.
	}
	return nil, rep.tr.Init(ctx)
}

// load restores the replica from c: from its own part, if c is sharded
// (from every part, merged, with checkpoint.merge_shards).
func (a *Agent) load(ctx context.Context, rep *replica, in spec.EpochInput, c *checkpoint.Checkpoint) error {
	switch shards := c.Manifest.Shards; {
	case shards == 0:
		return rep.tr.Restore(ctx, c)
	case shards != len(in.Peers):
		return userError(fmt.Errorf("checkpoint %s/%s is sharded over %d ranks, and this gang has %d: a sharded checkpoint is restored at the world size that saved it (scaling.workers %d)",
			c.Manifest.Run, c.Manifest.ID, shards, len(in.Peers), shards))
	case c.Manifest.Meta[checkpoint.MetaShards] == checkpoint.ShardsMerged:
		pr, ok := rep.tr.(trainer.PartsRestorer)
		if !ok {
			return userError(fmt.Errorf("checkpoint.merge_shards: trainer %q restores one part of a sharded checkpoint only", in.Spec.Trainer))
		}
		parts := make([]trainer.StateReader, shards)
		for r := range parts {
			parts[r] = c.Shard(r)
		}
		return pr.RestoreParts(ctx, parts)
	default:
		return rep.tr.Restore(ctx, c.Shard(in.Rank))
	}
}

// agreeOnCheckpoint makes every rank of the gang hold the same checkpoint:
// the oldest any rank restored. Two all-reduces: which source and how many
// checkpoints it has, then a vote per checkpoint. A rank that restored a
// newer one than another loads the agreed one instead.
func (a *Agent) agreeOnCheckpoint(ctx context.Context, rep *replica, in spec.EpochInput, source int, run string, c *checkpoint.Checkpoint) (*checkpoint.Checkpoint, error) {
	ids, err := rep.store.IDs(ctx, run)
	if err != nil {
		return nil, err
	}
	head := []float32{0, 0, 0}
	head[source] = 1
	if in.Rank == 0 {
		head[2] = float32(len(ids))
	}
	if err := rep.group.AllReduce(ctx, head); err != nil {
		return nil, fmt.Errorf("agreeing on the checkpoint to resume from: %w", err)
	}
	if int(head[source]) != len(in.Peers) || int(head[2]) != len(ids) {
		return nil, fmt.Errorf("the gang's ranks restored from different runs, or see different checkpoints (rank %d: %s/%s of %d)", in.Rank, run, c.Manifest.ID, len(ids))
	}
	votes := make([]float32, len(ids))
	if i := slices.Index(ids, c.Manifest.ID); i >= 0 {
		votes[i] = 1
	}
	if err := rep.group.AllReduce(ctx, votes); err != nil {
		return nil, fmt.Errorf("agreeing on the checkpoint to resume from: %w", err)
	}
	agreed := slices.IndexFunc(votes, func(v float32) bool { return v > 0 }) // the oldest any rank restored
	if agreed < 0 {
		return nil, fmt.Errorf("no rank of the gang restored a checkpoint %s lists", run)
	}
	if ids[agreed] == c.Manifest.ID {
		return c, nil
	}
	older, err := rep.store.Committed(ctx, run, ids[agreed])
	if err == nil {
		err = a.load(ctx, rep, in, older)
	}
	if err != nil {
		return nil, fmt.Errorf("rank %d restored %s, but another rank's part of it is damaged, and the gang's agreed %s does not load here: %w", in.Rank, c.Manifest.ID, ids[agreed], err)
	}
	a.Log.Warn("resumed from an older checkpoint, as another rank of the gang had to", zap.String("run", run), zap.Int("rank", in.Rank),
		zap.String("restored", c.Manifest.ID), zap.String("agreed", ids[agreed]))
	older.Skipped = c.Skipped
	return older, nil
}

// reportSkipped tells the run at once which checkpoints a restore passed over
// as damaged: the epoch may yet fail and its result be lost.
func (a *Agent) reportSkipped(ctx context.Context, generation int, c *checkpoint.Checkpoint, skipped []spec.SkippedCheckpoint) {
	if err := a.signalRun(ctx, spec.SignalCheckpointSkipped,
		spec.CheckpointsSkipped{Generation: generation, Epoch: c.Manifest.Epoch, Step: c.Manifest.Step, Skipped: skipped}); err != nil {
		a.Log.Warn("could not report the skipped checkpoints", zap.String("run", c.Manifest.Run), zap.Error(err))
	}
}

// reportRestored tells the run, from rank 0, where its new gang's state
// came from, once the gang agreed on it: the gang may break before its
// first epoch ends, and with it the epoch's result that reports it too.
// Training does not wait for it (the server may be restarting); it is
// given up after reportTimeout.
func (a *Agent) reportRestored(ctx context.Context, in spec.EpochInput, report *spec.RestoreReport) {
	if in.Rank != 0 || report == nil {
		return
	}
	msg := spec.GangRestored{Generation: in.Generation, Epoch: in.Epoch, Report: *report}
	if activity.IsActivity(ctx) {
		msg.RunID = activity.GetInfo(ctx).WorkflowExecution.RunID
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTimeout)
	go func() {
		defer cancel()
		if err := a.signalRun(sctx, spec.SignalGangRestored, msg); err != nil {
			a.Log.Warn("could not report the gang's restore", zap.String("run", in.Run), zap.Int("generation", in.Generation), zap.Error(err))
		}
	}()
}

// reportTimeout bounds a report to the run that training does not wait for.
const reportTimeout = 10 * time.Second

// signalRun signals the workflow execution the activity belongs to (in
// tests, a.signalled stands for it).
func (a *Agent) signalRun(ctx context.Context, name string, arg any) error {
	return a.runSignaller(ctx)(ctx, name, arg)
}

// runSignaller is what signals the workflow execution the activity of ctx
// belongs to, once the activity has ended too; nil outside an activity
// (in tests, a.signalled stands for it).
func (a *Agent) runSignaller(ctx context.Context) func(ctx context.Context, name string, arg any) error {
	if a.signalled != nil {
		return func(_ context.Context, name string, arg any) error { return a.signalled(name, arg) }
	}
	if !activity.IsActivity(ctx) {
		return nil
	}
	info, c := activity.GetInfo(ctx), activity.GetClient(ctx)
	return func(ctx context.Context, name string, arg any) error {
		return c.SignalWorkflow(ctx, info.WorkflowExecution.ID, info.WorkflowExecution.RunID, name, arg)
	}
}

// refOf is a restored checkpoint's reference, with the spec's URL (see replica.storeURL).
func refOf(c *checkpoint.Checkpoint, url string) spec.CheckpointRef {
	r := c.Ref()
	return spec.CheckpointRef{URL: url, Run: r.Run, ID: r.ID, Epoch: c.Manifest.Epoch, Step: c.Manifest.Step}
}
