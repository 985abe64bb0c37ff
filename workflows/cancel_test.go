package workflows

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

// Cancelling a run closes it as cancelled, in every state, without forming
// another gang, charging a budget, or touching its checkpoints; every slot's
// hold is cancelled.
func TestCancelClosesTheRunInEveryState(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spec  string
		setup func(h *harness, holdsLive *atomic.Int32)
		// the run's state when cancelled, and the epochs it had finished
		state  string
		epochs int
	}{
		{name: "forming a gang (no slot free)", spec: `{"hyper": {"epochs": 3}, "scaling": {"workers": 2, "gang_timeout": "1s"}}`,
			setup: func(h *harness, _ *atomic.Int32) {}, state: spec.StateFormingGang},
		{name: "forming a gang (half a gang held)", spec: `{"hyper": {"epochs": 3}, "scaling": {"workers": 2, "gang_timeout": "1m"}}`,
			setup: func(h *harness, _ *atomic.Int32) { h.grant(1, 1, 0) }, state: spec.StateFormingGang},
		{name: "training", spec: `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}}`,
			setup: func(h *harness, _ *atomic.Int32) {
				h.grant(1, 2, 0)
				h.blockEpoch = func(in spec.EpochInput) bool { return in.Epoch == 1 }
			}, state: spec.StateTraining, epochs: 1},
		{name: "recovering (no slot for the new gang)", spec: `{"hyper": {"epochs": 3}, "scaling": {"workers": 2, "gang_timeout": "1s"}}`,
			setup: func(h *harness, _ *atomic.Int32) {
				h.grant(1, 2, 0)
				h.epoch = func(in spec.EpochInput) error {
					if in.Epoch == 1 {
						return errors.New("rank lost")
					}
					return nil
				}
			}, state: spec.StateFormingGang, epochs: 1},
		{name: "stopping (a stop asked for, the epoch still running)", spec: `{"hyper": {"epochs": 5}}`,
			setup: func(h *harness, _ *atomic.Int32) {
				h.grant(1, 1, 0)
				h.blockEpoch = func(in spec.EpochInput) bool {
					if in.Epoch == 1 {
						h.env.SignalWorkflow(spec.SignalStop, nil)
						return true
					}
					return false
				}
			}, state: spec.StateTraining, epochs: 1},
		{name: "checkpointing on stop", spec: `{"hyper": {"epochs": 5}, "checkpoint": {"every_epochs": 5}}`,
			setup: func(h *harness, _ *atomic.Int32) {
				h.grant(1, 1, 0)
				h.epoch = func(in spec.EpochInput) error {
					if in.Epoch == 0 {
						h.env.SignalWorkflow(spec.SignalStop, nil)
					}
					return nil
				}
				h.blockSave = true
			}, state: spec.StateCheckpointing, epochs: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			var live atomic.Int32
			// A fake agent heartbeats as the real one does: a hold learns
			// of its cancellation from the heartbeat's answer.
			h.hold = func(ctx context.Context, in spec.HoldSlotInput) error {
				live.Add(1)
				defer live.Add(-1)
				for {
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(50 * time.Millisecond):
						activity.RecordHeartbeat(ctx)
					}
				}
			}
			tc.setup(h, &live)
			var at *spec.Progress
			h.env.RegisterDelayedCallback(func() {
				at = h.query()
				h.env.CancelWorkflow()
			}, 3*time.Second)
			p, err := h.start(strings.Replace(tc.spec, "{", `{"failure": {"heartbeat_timeout": "1s"}, `, 1))
			var canceled *temporal.CanceledError
			if !errors.As(err, &canceled) {
				t.Fatalf("got %v, %+v; want the run cancelled", err, p)
			}
			if at == nil || at.State != tc.state || at.Epoch != tc.epochs {
				t.Fatalf("when cancelled the run was %+v; want state %s after %d epochs", at, tc.state, tc.epochs)
			}
			end := h.query()
			if end.State != spec.StateCancelled || end.Failures != at.Failures || end.Epoch != tc.epochs {
				t.Fatalf("after the cancel: %+v", end)
			}
			if end.Generation > at.Generation {
				t.Fatalf("a cancelled run formed generation %d after generation %d", end.Generation, at.Generation)
			}
			// The fake agents saw every hold cancelled (the test environment
			// waits for cancelled activities to return).
			deadline := time.Now().Add(5 * time.Second)
			for live.Load() != 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := live.Load(); n != 0 {
				t.Fatalf("%d slots still held after the run closed", n)
			}
		})
	}
}
