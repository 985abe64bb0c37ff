package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// checkpointTogether has rank 0 save and commit, then tells every rank
// whether the commit succeeded, so each can report the same reference (the
// workflow learns it from whichever rank answers first). metrics is nil for
// a mid-epoch checkpoint.
func (a *Agent) checkpointTogether(ctx context.Context, rep *replica, in spec.EpochInput, metrics *spec.EpochMetrics) (*spec.CheckpointRef, error) {
	if in.Spec.Checkpoint.Sharded {
		if err := a.saveShard(ctx, rep, in); err != nil {
			return nil, err
		}
	}
	ok := []float32{0}
	var saveErr error
	if in.Rank == 0 {
		switch _, saveErr = a.save(ctx, rep, in.Run, in.Spec, len(in.Peers), metrics); {
		case saveErr == nil:
			ok[0] = 1
		case errors.Is(saveErr, trainer.ErrNoCheckpoint):
			ok[0], saveErr = 2, nil // the program reported this epoch without one, on purpose
		}
	}
	if err := rep.group.AllReduce(ctx, ok); err != nil {
		return nil, errors.Join(saveErr, err)
	}
	switch {
	case saveErr == nil && ok[0] == 2:
		return nil, nil
	case saveErr != nil:
		return nil, saveErr
	case ok[0] == 0:
		return nil, errors.New("rank 0 could not commit the checkpoint")
	}
	c := rep.tr.Cursor()
	ref := &spec.CheckpointRef{URL: rep.storeURL, Run: in.Run, ID: checkpoint.ID(c.Epoch, c.Step), Epoch: c.Epoch, Step: c.Step}
	a.slots.setCheckpoint(in.Slot, ref)
	return ref, nil
}

// saveShard has every rank write its own part of a sharded checkpoint,
// and says whether every rank did: rank 0 then adopts them all (save).
func (a *Agent) saveShard(ctx context.Context, rep *replica, in spec.EpochInput) error {
	c := rep.tr.Cursor()
	sw, err := rep.store.BeginShard(ctx, in.Run, c.Epoch, c.Step, in.Rank)
	if err == nil {
		if err = rep.tr.Save(ctx, sw); err == nil {
			err = sw.Close(ctx)
		}
		if err != nil {
			a.abort(ctx, in.Run, sw)
		}
	}
	done := []float32{0}
	if err == nil {
		done[0] = 1
	}
	if aerr := rep.group.AllReduce(ctx, done); aerr != nil {
		return errors.Join(err, aerr)
	}
	switch world := len(in.Peers); {
	case err != nil:
		return fmt.Errorf("rank %d could not save its part of the checkpoint at epoch %d step %d: %w", in.Rank, c.Epoch, c.Step, err)
	case int(done[0]) != world:
		return fmt.Errorf("%d of the gang's %d ranks could not save their part of the checkpoint at epoch %d step %d", world-int(done[0]), world, c.Epoch, c.Step)
	}
	return nil
}

// SaveCheckpoint checkpoints rank 0's warm replica now (on stop).
func (a *Agent) SaveCheckpoint(ctx context.Context, in spec.SaveCheckpointInput) (spec.CheckpointRef, error) {
	a.init()
	if in.Spec.Checkpoint.Sharded { // refused by the spec: every_epochs is 1, so a stop never needs one
		return spec.CheckpointRef{}, errors.New("a sharded run's state is every rank's: rank 0 alone cannot checkpoint it")
	}
	rep := a.replicas.get(keyOf(ctx, in.Generation, 0))
	if rep == nil {
		return spec.CheckpointRef{}, fmt.Errorf("no warm replica of rank 0 for generation %d on %s", in.Generation, a.Identity)
	}
	ref, err := a.save(ctx, rep, in.Run, in.Spec, in.Spec.Scaling.Workers, &in.Metrics)
	if err != nil {
		return spec.CheckpointRef{}, err
	}
	return *ref, nil
}

// save writes the replica's state, commits it with its manifest, and applies
// the spec's retention, once the replica's checkpoint in flight, if any, is done.
func (a *Agent) save(ctx context.Context, rep *replica, run string, s spec.Training, world int, m *spec.EpochMetrics) (*spec.CheckpointRef, error) {
	if err := rep.finishBackground(); err != nil { // superseded by this one
		a.Log.Warn("the previous checkpoint, written in the background, failed; saving this one in the foreground", zap.String("run", run), zap.Error(err))
	}
	return a.commit(ctx, rep, run, s, world, m, rep.tr.Cursor(), func(ctx context.Context, w trainer.StateWriter) error {
		if s.Checkpoint.Sharded {
			return w.(*checkpoint.Writer).AdoptShards(ctx, world) // every rank wrote its part (saveShard)
		}
		return rep.tr.Save(ctx, w)
	})
}

// commit writes the checkpoint of run at cursor c (write puts its objects),
// commits it with its manifest, and applies the spec's retention.
func (a *Agent) commit(ctx context.Context, rep *replica, run string, s spec.Training, world int, m *spec.EpochMetrics, c trainer.Cursor,
	write func(context.Context, trainer.StateWriter) error) (_ *spec.CheckpointRef, err error) {
	start := time.Now()
	ctx, span := tracer.Start(ctx, "checkpoint.save", trace.WithAttributes(attribute.String("run", run), attribute.Int("epoch", c.Epoch), attribute.Int("step", c.Step)))
	defer func() { endSpan(span, err) }()
	w, err := rep.store.Begin(ctx, run, c.Epoch, c.Step)
	if err != nil {
		return nil, err
	}
	if err := write(ctx, w); err != nil {
		a.abort(ctx, run, w)
		return nil, err
	}
	info := checkpoint.Info{WorldSize: world, Meta: map[string]string{"trainer": s.Trainer, "worker": a.Identity}}
	if s.Checkpoint.Sharded && s.Checkpoint.MergeShards {
		info.Meta[checkpoint.MetaShards] = checkpoint.ShardsMerged // every rank restores every part, merged
	}
	if m != nil { // a mid-epoch checkpoint has no evaluation to rank it by
		info.Metrics = m.Map()
	}
	manifest, err := w.Commit(ctx, info)
	if err != nil {
		a.abort(ctx, run, w)
		return nil, err
	}
	rep.metrics.checkpoint("save", manifest.Bytes(), time.Since(start))
	cp := s.Checkpoint
	if deleted, err := rep.store.Prune(ctx, run, checkpoint.Retention{KeepLast: cp.KeepLastN(), KeepBest: cp.KeepBest, Score: cp.Score, Mode: cp.Mode}); err != nil {
		a.Log.Warn("checkpoint retention failed", zap.String("run", run), zap.Error(err))
	} else if len(deleted) > 0 {
		a.Log.Info("checkpoints pruned", zap.String("run", run), zap.Strings("deleted", deleted))
	}
	return &spec.CheckpointRef{URL: rep.storeURL, Run: run, ID: manifest.ID, Epoch: manifest.Epoch, Step: manifest.Step}, nil
}

// abort removes what a failed save wrote (checkpoint.Writer.Abort): on a
// full disk, its objects would fail the next save too.
func (a *Agent) abort(ctx context.Context, run string, w interface{ Abort(context.Context) error }) {
	if err := w.Abort(ctx); err != nil {
		a.Log.Warn("removing a failed checkpoint's objects failed; the next commit's retention removes them", zap.String("run", run), zap.Error(err))
	}
}
