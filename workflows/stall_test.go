package workflows

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

func TestRaisedStallTimeout(t *testing.T) {
	const s = time.Second
	for _, c := range []struct {
		current, heartbeat, silence time.Duration
		want                        time.Duration // 0: no raise
	}{
		{2 * s, 10 * s, 2400 * time.Millisecond, 4800 * time.Millisecond}, // twice the silence
		{2 * s, 10 * s, 1500 * time.Millisecond, 4 * s},                   // at least twice the timeout
		{2 * s, 10 * s, 3 * s, 5 * s},                                     // at most half the heartbeat timeout
		{2 * s, 10 * s, 3750 * time.Millisecond, 0},                       // 5s would have declared it too
		{2 * s, 10 * s, 30 * s, 0},                                        // paused for long: a real stall
		{4800 * time.Millisecond, 10 * s, 2 * s, 5 * s},                   // raised again, to the cap
		{5 * s, 10 * s, 2 * s, 0},                                         // at the cap already
		{2 * s, 4 * s, 2 * s, 0},                                          // the default is the cap
		{0, 10 * s, 2 * s, 0},                                             // the spec sets it: the run does not choose
		{2 * s, 10 * s, 0, 0},                                             // no silence measured
	} {
		got, ok := raisedStallTimeout(c.current, c.heartbeat, c.silence)
		if ok != (c.want != 0) || got != c.want {
			t.Errorf("raisedStallTimeout(%v, %v, %v) = %v, %v; want %v", c.current, c.heartbeat, c.silence, got, ok, c.want)
		}
	}
}

// stallOfRank0 makes rank 0 of generation 1's first epoch stall in the
// eyes of rank 1: rank 1's host blames it (activities.blame), and rank 0's
// host, which heard the verdict after silence, says so by signal, before
// its own error reaches the run (heardFirst) or once the next gang trains.
func stallOfRank0(h *harness, runID func() string, silence time.Duration, heardFirst bool) {
	heard := func() {
		h.env.SignalWorkflow(spec.SignalStallHeard, spec.StallHeard{RunID: runID(), Generation: 1, Rank: 0, Reporter: 1, Silence: spec.Duration(silence)})
	}
	h.epoch = func(in spec.EpochInput) error {
		if !heardFirst && in.Generation == 2 && in.Epoch == 0 && in.Rank == 0 {
			heard() // the word comes late: the next gang trains already
		}
		if in.Generation != 1 || in.Epoch != 0 {
			return nil
		}
		if in.Rank == 1 {
			return temporal.NewApplicationError("collective: rank 0 (10.0.0.0:7070) failed, detected by rank 1: stalled: no data or keepalive for 2s",
				spec.ErrPeerFailed, spec.BrokenBy{Rank: 0, Reason: "stalled: no data or keepalive for 2s"})
		}
		if heardFirst {
			heard()
		}
		return errors.New("collective: rank 0 (10.0.0.0:7070) failed, detected by rank 1: stalled: no data or keepalive for 2s")
	}
}

// A gang broken by a stall of a rank that then heard its verdict after a
// brief silence (its host starved it of CPU): the run takes the failure
// back and raises the stall timeout it chose for its next gangs, whichever
// of the word and the epoch's end came first, even where the failure alone
// would have exhausted failure.max_failures. A spec that sets the timeout,
// a silence too long to be a brief starvation, and a word that names
// another run change nothing: the stall is charged as any failure.
func TestAStallThatProvedFalseIsTakenBackAndRaisesTheTimeout(t *testing.T) {
	for _, c := range []struct {
		name       string
		spec       string
		silence    time.Duration
		heardFirst bool
		otherRun   bool
		want       time.Duration // the next gang's stall timeout; 0: charged, the timeout kept
	}{
		{"word first", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}, "failure": {"max_failures": 0}}`, 2400 * time.Millisecond, true, false, 4800 * time.Millisecond},
		{"word after", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}}`, 2400 * time.Millisecond, false, false, 4800 * time.Millisecond},
		{"timeout set", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}, "failure": {"stall_timeout": "2s"}}`, 2400 * time.Millisecond, true, false, 0},
		{"long silence", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}}`, 30 * time.Second, true, false, 0},
		{"another run", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}}`, 2400 * time.Millisecond, true, true, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t)
			h.grant(1, 2, 0)
			h.grant(2, 2, 0)
			runID := func() string {
				if c.otherRun {
					return "the-base-run"
				}
				h.mu.Lock()
				defer h.mu.Unlock()
				return h.holds[0].RunID
			}
			stallOfRank0(h, runID, c.silence, c.heardFirst)
			p, err := h.start(c.spec)
			if err != nil {
				t.Fatal(err)
			}
			if p.State != spec.StateCompleted || p.Generation != 2 || len(p.Incidents) == 0 {
				t.Fatalf("progress %+v", p)
			}
			inc := p.Incidents[0]
			stalls := map[int]time.Duration{}
			for _, in := range h.inputs() {
				stalls[in.Generation] = time.Duration(in.Spec.Failure.StallTimeout)
			}
			if stalls[1] != 2*time.Second {
				t.Fatalf("generation 1's ranks had a stall timeout of %v; want the default 2s", stalls[1])
			}
			if c.want == 0 {
				if p.Failures != 1 || inc.Kind != spec.IncidentFailure || stalls[2] != 2*time.Second {
					t.Fatalf("failures %d, incident %+v, the next gang's stall timeout %v; want the stall charged and the timeout kept", p.Failures, inc, stalls[2])
				}
				return
			}
			if p.Failures != 0 || inc.Kind != spec.IncidentFalseStall || inc.Generation != 1 || !strings.Contains(inc.Detail, "raised from 2s to 4.8s") {
				t.Fatalf("failures %d, incident %+v; want the stall taken back", p.Failures, inc)
			}
			if stalls[2] != c.want || time.Duration(p.StallTimeout) != c.want {
				t.Fatalf("the next gang's stall timeout %v, the run's %v; want %v", stalls[2], p.StallTimeout, c.want)
			}
		})
	}
}
