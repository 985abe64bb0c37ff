package workflows

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"

	"github.com/durabletrain/durabletrain/spec"
)

// fakeTracker stands for the tracking server's activity: it fails while
// down says so, and records what it was given.
type fakeTracker struct {
	mu    sync.Mutex
	calls []spec.TrackInput
	down  func(call int, in spec.TrackInput) bool
}

func (f *fakeTracker) register(h *harness) {
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in spec.TrackInput) (spec.TrackResult, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.calls = append(f.calls, in)
		if f.down(len(f.calls), in) {
			return spec.TrackResult{}, errors.New("dial tcp 127.0.0.1:5000: connection refused")
		}
		return spec.TrackResult{RunID: "mlflow-run-1", ExperimentID: "7"}, nil
	}, activity.RegisterOptions{Name: spec.ActivityTrackMLflow})
}

// letHoldsEnd makes the fake holds return once cancelled: the test
// environment does not cancel an activity's context, and skips time only
// while no activity runs (the run's end waits on timers).
func letHoldsEnd(h *harness) {
	cancelled := make(chan struct{})
	var once sync.Once
	h.env.SetOnActivityCanceledListener(func(info *activity.Info) {
		if info.ActivityType.Name == spec.ActivityHoldSlot {
			once.Do(func() { close(cancelled) })
		}
	})
	h.hold = func(ctx context.Context, _ spec.HoldSlotInput) error {
		select {
		case <-ctx.Done():
		case <-cancelled:
		}
		return context.Canceled
	}
}

// logged are the iterations the fake logged, and whether it logged the end.
func (f *fakeTracker) logged() (iterations []int, end *spec.TrackerEnd) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, in := range f.calls {
		if f.down(i+1, in) {
			continue
		}
		for _, r := range in.Reports {
			iterations = append(iterations, r.Iteration)
		}
		if in.End != nil {
			end = in.End
		}
	}
	return iterations, end
}

const trackedSpec = `{"name": "tracked", "hyper": {"epochs": 4}, "scaling": {"workers": 1},
	"mlflow": {"tracking_uri": "http://127.0.0.1:5000"}}`

func trackerIncidents(p *spec.Progress) []string {
	var out []string
	for _, inc := range p.Incidents {
		if inc.Kind == spec.IncidentTracker {
			out = append(out, inc.Detail)
		}
	}
	return out
}

// A server that is down from the start until after the run's last epoch
// (its first call after the end answers): the end waits for it, and every
// report is logged once, in order, with the end.
func TestTheRunsEndWaitsForATrackerThatIsDown(t *testing.T) {
	var ended bool
	f := &fakeTracker{down: func(call int, in spec.TrackInput) bool {
		if in.End != nil {
			ended = true
		}
		return !ended || call < 30 && in.End != nil && call%3 != 0 // fails a few times after the end, too
	}}
	h := newHarness(t, f.register)
	h.grant(1, 1, time.Second)
	letHoldsEnd(h)
	p, err := h.start(trackedSpec)
	if err != nil {
		t.Fatal(err)
	}
	iters, end := f.logged()
	if p.State != spec.StateCompleted || end == nil || end.State != spec.StateCompleted || !p.MLflow.Ended || len(p.MLflow.Pending) != 0 {
		t.Fatalf("state %s, logged end %+v, tracker %+v", p.State, end, p.MLflow)
	}
	if len(iters) != 4 || iters[0] != 1 || iters[3] != 4 {
		t.Fatalf("logged iterations %v; want 1..4 once each", iters)
	}
	inc := trackerIncidents(p)
	if len(inc) != 2 || !strings.Contains(inc[0], "the run trains on") || !strings.Contains(inc[1], "answers again") {
		t.Fatalf("tracker incidents %q", inc)
	}
}

// A server that never answers: the run ends after trackerEndWait, with a
// bounded number of calls, keeps its reports in its progress, and says so.
func TestATrackerThatNeverAnswersDelaysTheEndBoundedly(t *testing.T) {
	f := &fakeTracker{down: func(int, spec.TrackInput) bool { return true }}
	h := newHarness(t, f.register)
	h.grant(1, 1, time.Second)
	letHoldsEnd(h)
	p, err := h.start(trackedSpec)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.MLflow.Ended || len(p.MLflow.Pending) != 4 {
		t.Fatalf("state %s, tracker %+v", p.State, p.MLflow)
	}
	if n := len(f.calls); n > 2+int(trackerEndWait/trackerEndBackoff)+8 {
		t.Fatalf("%d calls of a server that is down; want them bounded by the end's backoff", n)
	}
	inc := trackerIncidents(p)
	if len(inc) != 2 || !strings.Contains(inc[0], "the run trains on") || !strings.Contains(inc[1], "4 reports were not logged") {
		t.Fatalf("tracker incidents %q", inc)
	}
}
