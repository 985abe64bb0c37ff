package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Checkpoints in the background (checkpoint.async): at a mid-epoch
// checkpoint, rank 0 copies its state in memory (trainer.Snapshotter) and
// the gang trains on while the copy is written, hashed and committed. At
// most one is in flight per replica: the next checkpoint of any kind, and
// the replica's close, wait for it first. A checkpoint still exists only
// once its manifest is written, after every object: a crash while one is in
// flight leaves the previous one as the latest, as a crash during a
// foreground save does.

// backgroundSave is one checkpoint being written from a snapshot.
type backgroundSave struct {
	done   chan struct{}
	cancel context.CancelFunc
	ref    *spec.CheckpointRef
	err    error
}

// backgroundCloseWait bounds how long closing a replica waits for its
// checkpoint in flight before abandoning it (uncommitted: never loaded).
const backgroundCloseWait = 2 * time.Minute

// wait returns once the save is done, with its error.
func (b *backgroundSave) wait() error {
	if b == nil {
		return nil
	}
	<-b.done
	return b.err
}

// finishBackground waits for the replica's checkpoint in flight, if any,
// and forgets it.
func (rep *replica) finishBackground() error {
	b := rep.pending
	rep.pending = nil
	return b.wait()
}

// canSaveInBackground says whether this checkpoint may be saved while training goes on.
func canSaveInBackground(rep *replica, in spec.EpochInput) bool {
	_, ok := rep.tr.(trainer.Snapshotter)
	return ok && in.Spec.Checkpoint.AsyncSteps()
}

// checkpointInBackground is the gang's mid-epoch checkpoint with
// checkpoint.async: rank 0 waits for its previous background save, copies
// its state and starts writing the copy; every rank learns in one
// all-reduce that it did, and the gang trains on. A background save that
// failed fails the gang here, at the next checkpoint, as a foreground save
// fails it at once.
func (a *Agent) checkpointInBackground(ctx context.Context, rep *replica, in spec.EpochInput) error {
	ok := []float32{0}
	var err error
	if in.Rank == 0 {
		if err = rep.finishBackground(); err != nil {
			err = fmt.Errorf("the previous checkpoint, written in the background, failed: %w", err)
		} else {
			start := time.Now()
			c := rep.tr.Cursor()
			var snap trainer.MemState
			if snap, err = rep.tr.(trainer.Snapshotter).Snapshot(ctx); err == nil {
				rep.metrics.checkpoint("snapshot", snap.Bytes(), time.Since(start))
				rep.pending = a.startBackgroundSave(ctx, rep, in, c, snap)
				ok[0] = 1
			}
		}
	}
	if aerr := rep.group.AllReduce(ctx, ok); aerr != nil {
		return errors.Join(err, aerr)
	}
	switch {
	case err != nil:
		return err
	case ok[0] == 0:
		return errors.New("rank 0 could not start the checkpoint")
	}
	return nil
}

// startBackgroundSave writes snap as the checkpoint at cursor c, outside
// the activity's context: a gang that fails meanwhile does not abort a
// checkpoint of the state it had (the replica's close waits for it).
func (a *Agent) startBackgroundSave(ctx context.Context, rep *replica, in spec.EpochInput, c trainer.Cursor, snap trainer.MemState) *backgroundSave {
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b := &backgroundSave{done: make(chan struct{}), cancel: cancel}
	recycler, _ := rep.tr.(trainer.SnapshotRecycler)
	go func() {
		defer close(b.done)
		defer cancel()
		b.ref, b.err = a.commit(bctx, rep, in.Run, in.Spec, len(in.Peers), nil, c, snap.WriteTo)
		if recycler != nil {
			recycler.Recycle(snap) // written (or failed): the next snapshot may copy into its memory
		}
		if b.err != nil {
			a.Log.Warn("a checkpoint written in the background failed", zap.String("run", in.Run), zap.Int("epoch", c.Epoch), zap.Int("step", c.Step), zap.Error(b.err))
			return
		}
		a.slots.setCheckpoint(in.Slot, b.ref)
	}()
	return b
}

// close waits for a checkpoint in flight when its replica closes,
// for at most backgroundCloseWait; then it is cancelled, uncommitted.
func (b *backgroundSave) close() {
	if b == nil {
		return
	}
	select {
	case <-b.done:
	case <-time.After(backgroundCloseWait):
		b.cancel()
		<-b.done
	}
}
