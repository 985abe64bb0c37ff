package activities

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

var errShuttingDown = errors.New("the worker is shutting down")

// classify turns an error into what the workflow's failure policy reads
// (spec.ErrUser, spec.ErrPreempted, or a plain error: infrastructure), and
// drops the replica: after a failed step its gang is gone. Its state, whole
// at the last step the gang completed, is kept for the next gang unless the
// worker is stopping or the error is the user's (survivors.go).
func (a *Agent) classify(ctx context.Context, key replicaKey, slot int, err error, leave <-chan struct{}) error {
	stopping := errors.Is(err, errShuttingDown) || errors.Is(context.Cause(ctx), errShuttingDown) || isClosed(leave)
	if !stopping {
		a.keepSurvivor(ctx, a.replicas.get(key), err)
	}
	a.replicas.drop(key)
	var app *temporal.ApplicationError
	switch {
	case stopping:
		return a.preempted([]Slot{{Index: slot}})
	case errors.As(err, &app):
		return err
	case errors.Is(err, trainer.ErrUser):
		return userError(err) // a bad config, a program that failed by itself, a diverged loss: retrying will not help
	}
	return err
}

func userError(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, err)
}

// preempted is the error of a rank or slot whose worker is stopping, with the
// latest checkpoint its gang committed, if any, as details.
func (a *Agent) preempted(slots []Slot) error {
	var ref *spec.CheckpointRef
	for _, s := range slots {
		if c := a.slots.checkpoint(s.Index); c != nil && (ref == nil || c.Epoch > ref.Epoch || c.Epoch == ref.Epoch && c.Step > ref.Step) {
			ref = c
		}
	}
	return preemption(fmt.Sprintf("worker %s is shutting down", a.Identity), ref)
}

// preemption is a spec.ErrPreempted error; ref, if any, rides in its details.
func preemption(msg string, ref *spec.CheckpointRef) error {
	if ref != nil {
		return temporal.NewApplicationError(fmt.Sprintf("%s; checkpointed at epoch %d step %d", msg, ref.Epoch, ref.Step), spec.ErrPreempted, *ref)
	}
	return temporal.NewApplicationError(msg, spec.ErrPreempted)
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
