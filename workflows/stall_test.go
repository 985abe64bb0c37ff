package workflows

import (
	"errors"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

func TestRaisedStallTimeout(t *testing.T) {
	const s = time.Second
	for _, c := range []struct {
		current, heartbeat, silence time.Duration
		want                        time.Duration // 0: no raise
	}{
		{2 * s, 10 * s, 2400 * time.Millisecond, 4800 * time.Millisecond}, // twice the silence
		{2 * s, 20 * s, 4140400400, 8281 * time.Millisecond},              // to the millisecond
		{2 * s, 10 * s, 1500 * time.Millisecond, 4 * s},                   // at least twice the timeout
		{2 * s, 10 * s, 3 * s, 5 * s},                                     // at most half the heartbeat timeout
		{2 * s, 10 * s, 3750 * time.Millisecond, 0},                       // 5s would have declared it too
		{2 * s, 10 * s, 30 * s, 0},                                        // paused for long: a real stall
		{4800 * time.Millisecond, 10 * s, 4 * s, 0},                       // raised again: 5s would have declared it too
		{4 * s, 10 * s, 3 * s, 5 * s},                                     // raised again, to the cap
		{2 * s, 10 * s, 1499 * time.Millisecond, 0},                       // shorter than the ring could declare: frames lost, not a starved rank
		{4800 * time.Millisecond, 10 * s, 2 * s, 0},                       // as short, after a raise
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

// How rank 0's host tells the run it heard its stall verdict.
const (
	byError       = iota // its epoch's error says so (spec.ErrStalledHeard); rank 1's epoch never ends
	bySignal             // a signal, before rank 1's error; its own epoch is cancelled
	bySignalAfter        // a signal a moment after rank 1's error; its own epoch is cancelled
	bySignalLate         // a signal once the next gang trains; its own epoch is cancelled
	never                // nothing: it never ran again; its epoch is cancelled
	byBoth               // its epoch's error and a signal, as a real worker does: one word, said twice
)

// stallOfRank0 makes rank 0 of generation 1's first epoch stall in the
// eyes of rank 1, whose host blames it (activities.blame; declared: as
// stalled, else as lost), and rank 0's host, which heard the verdict after
// silence, says so (how).
func stallOfRank0(h *harness, runID func() string, silence time.Duration, how int, declared bool) {
	word := spec.StallHeard{Generation: 1, Rank: 0, Reporter: 1, Silence: spec.Duration(silence)}
	signal := func() {
		// Words that do not decode (anyone may signal) are dropped on the way.
		h.env.SignalWorkflow(spec.SignalStallHeard, "not a word")
		h.env.SignalWorkflow(spec.SignalStallHeard, map[string]any{"generation": "one", "silence": []int{1}})
		w := word
		w.RunID = runID()
		h.env.SignalWorkflow(spec.SignalStallHeard, w)
	}
	// Rank 1 reports once rank 0's epoch has started (and, bySignal, told
	// the run): a run cancels an epoch that has not started yet.
	started, reported := make(chan struct{}), make(chan struct{})
	wait := func(c chan struct{}) {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			h.t.Error("rank 0 and 1 waited on each other for 10 s")
		}
	}
	firstEpoch := func(in spec.EpochInput) bool { return in.Generation == 1 && in.Epoch == 0 }
	h.blockEpoch = func(in spec.EpochInput) bool {
		switch {
		case !firstEpoch(in):
			return false
		case in.Rank == 1:
			return how == byError || how == byBoth
		case how == bySignal || how == byBoth:
			signal()
		case how == bySignalAfter:
			defer func() {
				go func() {
					wait(reported)
					time.Sleep(100 * time.Millisecond)
					signal()
				}()
			}()
		}
		close(started)
		return how != byError && how != byBoth
	}
	h.epoch = func(in spec.EpochInput) error {
		if how == bySignalLate && in.Generation == 2 && in.Epoch == 0 && in.Rank == 0 {
			signal() // the word comes late: the next gang trains already
		}
		switch {
		case !firstEpoch(in):
			return nil
		case in.Rank == 0:
			return temporal.NewApplicationError("collective: rank 0 (10.0.0.0:7070) failed, detected by rank 1: stalled: no data or keepalive for 2s",
				spec.ErrStalledHeard, word)
		}
		wait(started)
		defer close(reported)
		if !declared { // rank 0 found dead: its connection reset
			return temporal.NewApplicationError("collective: rank 0 (10.0.0.0:7070) failed, detected by rank 1: connection lost: EOF",
				spec.ErrPeerFailed, spec.BrokenBy{Rank: 0, Reason: "connection lost: EOF"})
		}
		return temporal.NewApplicationError("collective: rank 0 (10.0.0.0:7070) failed, detected by rank 1: stalled: no data or keepalive for 2s",
			spec.ErrPeerFailed, spec.BrokenBy{Rank: 0, Reason: "stalled: no data or keepalive for 2s", Stalled: true})
	}
}

// A gang broken by a stall of a rank that then heard its verdict after a
// brief silence (its host starved it of CPU): the run takes the failure
// back and raises the stall timeout it chose for its next gangs, whichever
// of the word and the epoch's end came first, even where the failure alone
// would have exhausted failure.max_failures. A spec that sets the timeout,
// a silence too long to be a brief starvation, a word that names another
// run, and a word about a rank no host declared stalled (a forged one, with
// a gang that broke otherwise) change nothing: the failure is charged.
func TestAStallThatProvedFalseIsTakenBackAndRaisesTheTimeout(t *testing.T) {
	const base = `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}}`
	for _, c := range []struct {
		name     string
		spec     string
		silence  time.Duration
		how      int
		otherRun bool
		lost     bool          // rank 1 found rank 0 dead, not stalled (the word is forged)
		want     time.Duration // the next gang's stall timeout; 0: charged, the timeout kept
	}{
		{"by error", base, 2400 * time.Millisecond, byError, false, false, 4800 * time.Millisecond},
		{"by both, taken back once", base, 2400 * time.Millisecond, byBoth, false, false, 4800 * time.Millisecond},
		{"by signal", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}, "failure": {"max_failures": 0}}`, 2400 * time.Millisecond, bySignal, false, false, 4800 * time.Millisecond},
		{"by signal after, the budget exhausted", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}, "failure": {"max_failures": 0}}`, 2400 * time.Millisecond, bySignalAfter, false, false, 4800 * time.Millisecond},
		{"by signal late", base, 2400 * time.Millisecond, bySignalLate, false, false, 4800 * time.Millisecond},
		{"timeout set", `{"hyper": {"epochs": 3}, "scaling": {"workers": 2}, "failure": {"stall_timeout": "2s"}}`, 2400 * time.Millisecond, byError, false, false, 0},
		{"long silence", base, 30 * time.Second, bySignal, false, false, 0},
		{"too short a silence", base, 1200 * time.Millisecond, bySignal, false, false, 0},
		{"another run", base, 2400 * time.Millisecond, bySignal, true, false, 0},
		{"not declared stalled", base, 2400 * time.Millisecond, bySignal, false, true, 0},
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
			stallOfRank0(h, runID, c.silence, c.how, !c.lost)
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
			takenBack := h.counted.count(metricname.StallsTakenBack)
			if c.want == 0 {
				if p.Failures != 1 || inc.Kind != spec.IncidentFailure || stalls[2] != 2*time.Second || takenBack != 0 {
					t.Fatalf("failures %d, incident %+v, the next gang's stall timeout %v, %d counted taken back; want the stall charged and the timeout kept", p.Failures, inc, stalls[2], takenBack)
				}
				return
			}
			if p.Failures != 0 || inc.Kind != spec.IncidentFalseStall || inc.Generation != 1 || !strings.Contains(inc.Detail, "raised from 2s to 4.8s") {
				t.Fatalf("failures %d, incident %+v; want the stall taken back", p.Failures, inc)
			}
			if takenBack != 1 {
				t.Fatalf("%s counted %d; want 1", metricname.StallsTakenBack, takenBack)
			}
			if stalls[2] != c.want || time.Duration(p.StallTimeout) != c.want {
				t.Fatalf("the next gang's stall timeout %v, the run's %v; want %v", stalls[2], p.StallTimeout, c.want)
			}
		})
	}
}

// A stall that exhausts the failure budget, whose rank never says it heard
// the verdict (hung, killed, cut off), ends the run as any failure would,
// after the run waited for the word as long as it could matter.
func TestAStallNobodyTakesBackStillEndsTheRun(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, 0)
	stallOfRank0(h, func() string { return "" }, 0, never, true)
	_, err := h.start(`{"hyper": {"epochs": 3}, "scaling": {"workers": 2}, "failure": {"max_failures": 0}}`)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || !strings.Contains(app.Message(), "1 failures exceed failure.max_failures 0") {
		t.Fatalf("the run ended with %v; want its failure budget exhausted", err)
	}
}
