package workflows

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

// peerFailed is the epoch error of a host whose ranks ended because rank
// culprit broke the gang (activities.blame).
func peerFailed(culprit int) error {
	return temporal.NewApplicationError("collective: rank failed", spec.ErrPeerFailed, spec.BrokenBy{Rank: culprit, Reason: "connection lost"})
}

// A host killed mid-epoch: the two hosts that survived say so, keep their
// holds, and the next gang asks only for the one host it lacks.
func TestSurvivingHostsAreKeptForTheNextGang(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 3, 0)
	h.grant(2, 3, 0)
	dead := func(in spec.EpochInput) bool { return in.Generation == 1 && in.Epoch == 1 && in.Rank == 2 }
	h.blockEpoch = dead // killed: it never answers
	h.hold = func(ctx context.Context, in spec.HoldSlotInput) error {
		if in.Generation == 1 && in.Request == 2 {
			// The dead host's hold ends at its heartbeat timeout, long after the survivors spoke.
			select {
			case <-time.After(3 * time.Second):
				return errors.New("activity heartbeat timeout")
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		<-ctx.Done()
		return ctx.Err()
	}
	h.epoch = func(in spec.EpochInput) error {
		if in.Generation == 1 && in.Epoch == 1 {
			return peerFailed(2)
		}
		return nil
	}
	// The run lets go of the dead host without waiting for it to answer,
	// and the answer comes after the next gang has finished the run: the
	// run waits for it before it closes, or the release would be dropped.
	h.releaseDelay = func(in spec.ReleaseHoldInput) time.Duration {
		if in.Generation == 1 && in.Request == 2 {
			return 500 * time.Millisecond
		}
		return 0
	}
	p, err := h.start(`{"hyper": {"epochs": 3}, "scaling": {"workers": 3}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Failures != 1 || p.Generation != 2 {
		t.Fatalf("progress %+v", p)
	}
	var asked []int
	for _, in := range h.holds {
		if in.Generation == 2 {
			asked = append(asked, in.Request)
		}
	}
	if len(asked) != 1 || asked[0] != 2 {
		t.Fatalf("generation 2 asked for hosts %v; want only host 2, the survivors kept", asked)
	}
	queues := map[string]bool{}
	h.mu.Lock()
	for _, in := range h.runs {
		if in.Generation == 2 && in.Epoch == 1 {
			queues[in.Hosts[in.Host].HostQueue] = true
		}
	}
	h.mu.Unlock()
	for _, q := range []string{"q-1-0", "q-1-1", "q-2-2"} {
		if !queues[q] {
			t.Fatalf("generation 2 trained on %v; want the survivors' hosts q-1-0 and q-1-1 and the new q-2-2", queues)
		}
	}
	// Only the dead host was let go of when the gang broke; the survivors at the run's end.
	h.mu.Lock()
	defer h.mu.Unlock()
	let := map[holdID]int{}
	for _, r := range h.releases {
		let[holdID{r.in.Generation, r.in.Request}]++
	}
	if let[holdID{1, 2}] != 1 || let[holdID{1, 0}] != 1 || let[holdID{1, 1}] != 1 || let[holdID{2, 2}] != 1 {
		t.Fatalf("released %v; want each of the three holds of the last gang once, and the dead host's", let)
	}
}

func TestSurvivorsPolicy(t *testing.T) {
	pls := []spec.Placement{{Rank: 0}, {Rank: 2}, {Rank: 4}} // hosts of 2 ranks
	end := func(err error) rankEnd { return rankEnd{err: err} }
	preemptedSurvivor := temporal.NewApplicationError("stopped with its gang", spec.ErrPreempted, spec.CheckpointRef{ID: "c"}, spec.BrokenBy{Rank: -1, Reason: "another rank's worker is shutting down"})
	for name, c := range map[string]struct {
		ranks          []rankEnd
		settled, ended []bool
		want           []int
		awaiting       bool
	}{
		"rank 3 blamed, host 2 still running": {
			[]rankEnd{end(peerFailed(3)), {}, {}}, []bool{true, false, false}, []bool{false, false, false}, []int{0}, true},
		"every survivor heard": {
			[]rankEnd{end(peerFailed(3)), {}, end(peerFailed(2))}, []bool{true, false, true}, []bool{false, false, false}, []int{0, 2}, false},
		"a survivor whose hold ended is not kept": {
			[]rankEnd{end(peerFailed(3)), {}, end(peerFailed(2))}, []bool{true, false, true}, []bool{true, false, false}, []int{2}, false},
		"nobody said it survived": {
			[]rankEnd{end(errors.New("boom")), {}, {}}, []bool{true, false, false}, []bool{false, false, false}, nil, false},
		"a worker stopping: the others stay": {
			[]rankEnd{end(preemptedSurvivor), end(temporal.NewApplicationError("worker is shutting down", spec.ErrPreempted, spec.CheckpointRef{ID: "c"})), end(preemptedSurvivor)},
			[]bool{true, true, true}, []bool{false, true, false}, []int{0, 2}, false},
		"both sides of a partition, both heard": {
			[]rankEnd{end(peerFailed(2)), end(peerFailed(0)), {}}, []bool{true, true, false}, []bool{false, false, false}, nil, true},
		"a plain preemption is no survivor": {
			[]rankEnd{end(temporal.NewApplicationError("worker is shutting down", spec.ErrPreempted, spec.CheckpointRef{ID: "c"})), {}, {}},
			[]bool{true, false, false}, []bool{false, false, false}, nil, false},
	} {
		got := survivors(c.ranks, c.settled, c.ended, pls, 2)
		if len(got) != len(c.want) || len(got) > 0 && !equalInts(got, c.want) {
			t.Errorf("%s: survivors %v; want %v", name, got, c.want)
		}
		if a := awaitingSurvivors(c.ranks, c.settled, c.ended, pls, 2); a != c.awaiting {
			t.Errorf("%s: awaiting %v; want %v", name, a, c.awaiting)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A rank that ends while the run waits for survivors (here a program that
// failed by itself once its peer died: a user error) counts as cancelled:
// the gang's failure is charged and the run goes on, as it did before the wait.
func TestARankEndingInTheSurvivorWaitDoesNotEndTheRun(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 3, 0)
	h.grant(2, 3, 0)
	h.blockEpoch = func(in spec.EpochInput) bool { return in.Generation == 1 && in.Epoch == 1 && in.Rank == 1 } // killed
	h.epoch = func(in spec.EpochInput) error {
		if in.Generation == 1 && in.Epoch == 1 {
			if in.Rank == 0 {
				return peerFailed(1)
			}
			time.Sleep(100 * time.Millisecond)
			return temporal.NewNonRetryableApplicationError("rank 2: the program exited: connection closed by peer", spec.ErrUser, nil)
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 3}, "scaling": {"workers": 3}}`)
	if err != nil {
		t.Fatalf("the run failed: %v", err)
	}
	if p.State != spec.StateCompleted || p.Failures != 1 {
		t.Fatalf("progress %+v", p)
	}
}
