package activities

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tensorboard"
	"github.com/durabletrain/durabletrain/trainer"
)

// maxStepEvents bounds the step events kept per epoch: a long epoch keeps
// every k-th step's loss, so an event file stays small.
const maxStepEvents = 500

// epochEvents collects what rank 0 writes to the run's TensorBoard event
// file for one epoch: the loss every stride steps, then the epoch's metrics.
type epochEvents struct {
	epoch  int
	events []tensorboard.Event
}

// step keeps the step's loss if it falls on the stride.
func (e *epochEvents) step(p trainer.Progress) {
	if e.epoch != p.Epoch {
		e.epoch, e.events = p.Epoch, e.events[:0]
	}
	stride := max(1, (p.Steps+maxStepEvents-1)/maxStepEvents)
	if p.NoLoss || p.Step%stride != 0 && p.Step != p.Steps {
		return
	}
	e.events = append(e.events, tensorboard.Event{WallTime: unixSeconds(time.Now()), Step: globalStep(p.Epoch, p.Step, p.Steps),
		Scalars: map[string]float64{"loss": p.Loss}})
}

func globalStep(epoch, step, steps int) int64 { return int64(epoch)*int64(steps) + int64(step) }

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// writeEpochEvents writes rank 0's event file of an epoch that ended: its
// step losses and, at its last step, every metric it reported. A failure
// is logged: the run's training does not depend on it.
func (a *Agent) writeEpochEvents(ctx context.Context, rep *replica, in spec.EpochInput, m spec.EpochMetrics) {
	if in.Rank != 0 || rep.events == nil {
		return
	}
	events := append([]tensorboard.Event(nil), rep.events.events...)
	scalars := m.Map()
	if _, reported := scalars["epoch"]; !reported { // a program's own epoch counter stands
		scalars["epoch"] = float64(m.Epoch)
	}
	now := time.Now()
	// At the epoch's last step: on the same event as that step's loss, if it was kept.
	end := globalStep(m.Epoch+1, 0, m.Steps)
	if n := len(events); n > 0 && events[n-1].Step == end {
		for k, v := range scalars {
			events[n-1].Scalars[k] = v
		}
	} else {
		events = append(events, tensorboard.Event{WallTime: unixSeconds(now), Step: end, Scalars: scalars})
	}
	// Named by epoch alone: TensorBoard reads a directory's files in name
	// order, and an epoch that ends again (a gang that failed after writing
	// it, and the epoch run again) replaces its file instead of writing its
	// steps twice.
	name := fmt.Sprintf("events.out.tfevents.e%06d.durabletrain", m.Epoch)
	if err := rep.store.WriteEvents(ctx, in.Run, name, tensorboard.Encode(unixSeconds(now), events)); err != nil {
		a.Log.Warn("TensorBoard event file not written", zap.String("run", in.Run), zap.Int("epoch", m.Epoch), zap.Error(err))
	}
	rep.events.events = rep.events.events[:0]
}
