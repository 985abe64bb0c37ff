package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
)

// restore brings a cold replica to where its run stands: the run's latest
// verified checkpoint once the run has trained before (Resume, or a known
// checkpoint), else spec.resume_from's, else fresh weights.
func (a *Agent) restore(ctx context.Context, rep *replica, in spec.EpochInput) (*spec.RestoreReport, error) {
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
		c, err := rep.store.RestoreLatest(sctx, from, func(c *checkpoint.Checkpoint) error { return rep.tr.Restore(sctx, c) })
		endSpan(span, err)
		switch {
		case err == nil:
			rep.metrics.checkpoint("restore", c.Manifest.Bytes(), time.Since(start))
			report := &spec.RestoreReport{From: refOf(c, rep.storeURL)}
			for _, s := range c.Skipped {
				report.Skipped = append(report.Skipped, spec.SkippedCheckpoint{ID: s.ID, Reason: s.Reason})
			}
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

// reportSkipped tells the run at once which checkpoints a restore passed over
// as damaged: the epoch may yet fail and its result be lost.
func (a *Agent) reportSkipped(ctx context.Context, generation int, c *checkpoint.Checkpoint, skipped []spec.SkippedCheckpoint) {
	info := activity.GetInfo(ctx)
	if err := activity.GetClient(ctx).SignalWorkflow(ctx, info.WorkflowExecution.ID, info.WorkflowExecution.RunID, spec.SignalCheckpointSkipped,
		spec.CheckpointsSkipped{Generation: generation, Epoch: c.Manifest.Epoch, Step: c.Manifest.Step, Skipped: skipped}); err != nil {
		a.Log.Warn("could not report the skipped checkpoints", zap.String("run", c.Manifest.Run), zap.Error(err))
	}
}

// refOf is a restored checkpoint's reference, with the spec's URL (see replica.storeURL).
func refOf(c *checkpoint.Checkpoint, url string) spec.CheckpointRef {
	r := c.Ref()
	return spec.CheckpointRef{URL: url, Run: r.Run, ID: r.ID, Epoch: c.Manifest.Epoch, Step: c.Manifest.Step}
}
