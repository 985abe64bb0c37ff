package activities

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/collective"
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
	if !stopping && ctx.Err() == nil {
		// A stopping worker's rank reports its preemption at once: its
		// grace is short, and the run must hear it before the worker exits.
		err = gangBrokeFirst(ctx, a.replicas.get(key), err, gangBreakGrace)
	}
	if !stopping {
		a.keepSurvivor(ctx, a.replicas.get(key), err)
	}
	a.replicas.drop(key)
	var app *temporal.ApplicationError
	switch {
	case stopping:
		// The rank left without saving at the stop: it was cut off when the
		// grace ran out mid-save, its save failed, or it had not trained yet.
		return a.preemptedUnsaved([]Slot{{Index: slot}}, stopCause(ctx, err))
	case errors.As(err, &app):
		return err
	case errors.Is(err, trainer.ErrUser):
		return userError(err) // a bad config, a program that failed by itself, a diverged loss: retrying will not help
	}
	return err
}

// gangBreakGrace is how long a rank whose program failed by itself waits
// for its gang's collective to say whether the gang broke first.
const gangBreakGrace = 2 * time.Second

// gangBrokeFirst is err, a rank's own user error (its program exited by
// itself, say), unless the rank's gang broke meanwhile, within grace: then
// it is the gang's failure, with err in its text. A program talking to its
// peers directly (torch.distributed's gloo or NCCL) fails by itself as soon
// as a peer's worker dies and the link resets, at the moment the worker's
// own collective hears of the same death: reported as the user's error, it
// ended a run that a new gang would have carried on. A program that fails
// for a reason of its own leaves its gang whole, and waits out the grace.
func gangBrokeFirst(ctx context.Context, rep *replica, err error, grace time.Duration) error {
	if rep == nil || !errors.Is(err, trainer.ErrUser) {
		return err
	}
	g, ok := rep.group.(interface{ Err() error })
	if !ok {
		return err
	}
	for deadline := time.Now().Add(grace); ; {
		if gerr := g.Err(); gerr != nil && !errors.Is(gerr, collective.ErrClosed) {
			return &gangBrokeError{gang: gerr, own: err}
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-ctx.Done():
			return err
		}
	}
}

// gangBrokeError is a rank's failure after its gang broke: the gang's
// failure (a *collective.PeerError naming the culprit, for blame) with the
// rank's own error beside it, not wrapped (it is not the user's).
type gangBrokeError struct {
	gang, own error
}

func (e *gangBrokeError) Error() string {
	return fmt.Sprintf("%v; the rank's own failure came after its gang broke: %v", e.gang, e.own)
}
func (e *gangBrokeError) Unwrap() error { return e.gang }

// blame tells the run when a host's epoch ended only because a rank of
// another host broke the gang (a *collective.PeerError naming it): the error
// becomes an ErrPeerFailed carrying spec.BrokenBy, so the run keeps this
// host, alive and still held, for its next gang. Any other end, and a
// failure blamed on this host's own ranks, is returned as it is.
func blame(err error, in spec.EpochInput, place spec.LocalPlace) error {
	var pe *collective.PeerError
	var app *temporal.ApplicationError
	if err == nil || errors.As(err, &app) || !errors.As(err, &pe) || pe.Rank < 0 {
		return err
	}
	if ofHost(in, place)(pe.Rank) {
		return err
	}
	return temporal.NewApplicationError(err.Error(), spec.ErrPeerFailed, spec.BrokenBy{Rank: pe.Rank, Reason: pe.Reason, Stalled: pe.Stalled()})
}

// ofHost says whether a rank of the gang is one of this host's ranks.
func ofHost(in spec.EpochInput, place spec.LocalPlace) func(rank int) bool {
	first := in.Rank - place.LocalRank
	return func(rank int) bool { return rank >= first && rank < first+max(1, place.LocalWorld) }
}

// stallHeard is what a host tells its run when its epoch ended because a
// rank of another host declared one of this host's ranks stalled, and that
// rank heard it (collective.PeerError.Silence): nil for any other end, and
// for an error already classified (a user error, a preemption).
func stallHeard(err error, in spec.EpochInput, place spec.LocalPlace) *spec.StallHeard {
	var pe *collective.PeerError
	var app *temporal.ApplicationError
	if err == nil || errors.As(err, &app) || !errors.As(err, &pe) || !pe.Stalled() || pe.Silence <= 0 {
		return nil
	}
	if ours := ofHost(in, place); !ours(pe.Rank) || ours(pe.Reporter) {
		return nil
	}
	return &spec.StallHeard{Generation: in.Generation, Rank: pe.Rank, Reporter: pe.Reporter, Silence: spec.Duration(pe.Silence)}
}

// hostError is the error a host's epoch ends with: blame's, or, where a
// rank of this host heard another host's declare it stalled (stallHeard),
// an ErrStalledHeard that says so. (The run is told by signal too, by the
// group's watch, stallWatch: it has often cancelled this epoch already.)
func hostError(err error, in spec.EpochInput, place spec.LocalPlace) error {
	heard := stallHeard(err, in, place)
	if heard == nil {
		return blame(err, in, place)
	}
	return temporal.NewApplicationError(err.Error(), spec.ErrStalledHeard, *heard)
}

// stallWatch is the collective.Options.OnFailure of a rank's group: where
// the group fails because another host's rank declared this rank stalled,
// and this rank heard it (stallHeard), it tells the run at once, whether or
// not an epoch runs then (a rank stopped between epochs hears its verdict
// with no epoch to end), without waiting, for at most reportTimeout. ctx is
// the activity that joined the group: the run's client and IDs are taken
// from it now, for the activity may have ended by then.
func (a *Agent) stallWatch(ctx context.Context, in spec.EpochInput, place spec.LocalPlace) func(error) {
	signal := a.runSignaller(ctx)
	if signal == nil {
		return nil
	}
	var runID string
	if activity.IsActivity(ctx) {
		runID = activity.GetInfo(ctx).WorkflowExecution.RunID
	}
	return func(err error) {
		heard := stallHeard(err, in, place)
		if heard == nil {
			return
		}
		heard.RunID = runID
		a.Log.Warn("a rank of this host was declared stalled, and heard it: telling the run", zap.String("run", in.Run),
			zap.Int("generation", in.Generation), zap.Int("rank", heard.Rank), zap.Int("reporter", heard.Reporter), zap.Duration("silence", time.Duration(heard.Silence)))
		sctx, cancel := context.WithTimeout(context.Background(), reportTimeout)
		defer cancel()
		if err := signal(sctx, spec.SignalStallHeard, *heard); err != nil {
			a.Log.Warn("could not tell the run its rank heard its stall", zap.String("run", in.Run), zap.Error(err))
		}
	}
}

func userError(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, err)
}

// preempted is the error of a rank or slot whose worker is stopping, with the
// latest checkpoint its gang committed, if any, as details.
func (a *Agent) preempted(slots []Slot) error {
	ref := a.latestCheckpoint(slots)
	return preemption(fmt.Sprintf("worker %s is shutting down", a.Identity), ref)
}

// preemptedUnsaved is the preemption of ranks that left without saving at
// the stop: it says so, and where the run resumes (the slots' latest checkpoint).
func (a *Agent) preemptedUnsaved(slots []Slot, cause string) error {
	ref := a.latestCheckpoint(slots)
	msg := fmt.Sprintf("worker %s is shutting down; not saved at the stop (%s)", a.Identity, cause)
	if ref != nil {
		return temporal.NewApplicationError(fmt.Sprintf("%s: resumes from its checkpoint at epoch %d step %d", msg, ref.Epoch, ref.Step), spec.ErrPreempted, *ref)
	}
	return temporal.NewApplicationError(msg+": resumes from the run's latest checkpoint", spec.ErrPreempted)
}

// stopCause says why a stopping rank left without a checkpoint.
func stopCause(ctx context.Context, err error) string {
	switch {
	case errors.Is(context.Cause(ctx), errShuttingDown):
		return "the worker's grace ran out before its ranks had saved"
	case errors.Is(err, errShuttingDown):
		return "it had trained nothing since its checkpoint"
	}
	return err.Error()
}

// preemption is a spec.ErrPreempted error; ref, if any, rides in its details.
func preemption(msg string, ref *spec.CheckpointRef) error {
	if ref != nil {
		return temporal.NewApplicationError(fmt.Sprintf("%s; checkpointed at epoch %d step %d", msg, ref.Epoch, ref.Step), spec.ErrPreempted, *ref)
	}
	return temporal.NewApplicationError(msg, spec.ErrPreempted)
}

// leftWithGang is the error of a rank that left its gang because another
// rank's worker is stopping: a preemption whose second detail says that this
// host stays (spec.BrokenBy with no rank to blame).
func leftWithGang(msg string, ref *spec.CheckpointRef) error {
	if ref != nil {
		msg = fmt.Sprintf("%s; checkpointed at epoch %d step %d", msg, ref.Epoch, ref.Step)
	} else {
		ref = &spec.CheckpointRef{}
	}
	return temporal.NewApplicationError(msg, spec.ErrPreempted, *ref, spec.BrokenBy{Rank: -1, Reason: "another rank's worker is shutting down"})
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
