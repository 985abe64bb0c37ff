package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// The ring's stall timeout (failure.stall_timeout) is a guess at how long a
// live rank can go without sending: too short for its hosts, and a rank
// starved of CPU or paused for a moment is declared stalled, its gang
// breaks, and the run is charged a failure for a rank that never failed.
// In real time such a rank cannot be told from a hung one (neither sends),
// but afterwards it can: a live rank hears its verdict, and knows how long
// it had been silent (collective.PeerError.Silence); its host tells the run
// (spec.SignalStallHeard). A run whose spec leaves the timeout out chooses
// it (Progress.StallTimeout) and, on that word, takes the failure back and
// raises the timeout for its next gangs (raisedStallTimeout), so a loaded
// host costs one gang, not the run's failure budget. A spec that sets the
// timeout keeps it, and is charged every stall: its author chose.
//
// The word is not authenticated: anyone who may signal the workflow can
// send it. What it can do is bounded: it takes back only the failure the
// run charged last, where a host of that gang declared the rank it names
// stalled, and only while it raises the timeout, which stops at half of
// failure.heartbeat_timeout, so at most a few failures in a run's life,
// and the timeout stays within what the spec allows.

// heardStall takes a rank's word that it heard its ring declare it
// stalled, and settles it (settleStall) if its failure was charged.
func (r *run) heardStall(ctx workflow.Context, h spec.StallHeard) bool {
	if r.p.StallTimeout == 0 || h.RunID != workflow.GetInfo(ctx).WorkflowExecution.RunID || h.Generation < 1 || h.Generation > r.p.Generation || h.Silence <= 0 {
		return false
	}
	r.heard = &h
	return r.settleStall(ctx)
}

// reviewStall is the epoch loop's look, once it charged a failure, for a
// word about it: among the words taken and those still waiting in the
// signal channel (the epoch's end and the word can arrive in one workflow
// task, and the loop may run before the handler that takes words). It
// reports whether it took the failure back.
func (r *run) reviewStall(ctx workflow.Context) bool {
	var h spec.StallHeard
	for r.stallsHeard.ReceiveAsync(&h) {
		r.signals++
		if r.heardStall(ctx, h) {
			return true
		}
	}
	return r.settleStall(ctx)
}

// settleStall takes back the failure charged for the generation a rank
// heard its stall verdict in (r.heard), where that stall proved false, and
// raises the stall timeout (raisedStallTimeout). The word and the failure
// arrive in either order: a word waits for its failure to be charged. It
// reports whether it took a failure back (and counts it: metricname.StallsTakenBack).
func (r *run) settleStall(ctx workflow.Context) bool {
	h := r.heard
	if h == nil || r.p.StallTimeout == 0 {
		return false
	}
	switch {
	case h.Generation > r.stalled.generation:
		return false // its gang's failure is still to be charged
	case h.Generation < r.stalled.generation || r.stalled.settled || h.Rank != r.stalled.rank:
		r.heard = nil // about an older gang, said again, or about a rank no host declared stalled
		return false
	}
	r.heard = nil
	var inc *spec.Incident
	for i := len(r.p.Incidents) - 1; i >= 0 && inc == nil; i-- {
		if c := &r.p.Incidents[i]; c.Generation == h.Generation && c.Kind == spec.IncidentFailure {
			inc = c
		}
	}
	if inc == nil {
		return false // charged as something else (a preemption): not a stall's failure
	}
	r.stalled.settled = true
	was := time.Duration(r.p.StallTimeout)
	raised, ok := raisedStallTimeout(was, time.Duration(r.spec.Failure.HeartbeatTimeout), time.Duration(h.Silence))
	if !ok {
		return false
	}
	inc.Kind = spec.IncidentFalseStall
	inc.Detail = fmt.Sprintf("%s; rank %d heard this verdict, silent for %v (starved of CPU or paused, not hung): not charged, and the ring's stall timeout is raised from %v to %v",
		inc.Detail, h.Rank, time.Duration(h.Silence).Round(time.Millisecond), was, raised)
	r.p.Failures--
	r.p.StallTimeout = spec.Duration(raised)
	r.stalled.takenBack = true
	countTakenBack(ctx)
	return true
}

// countTakenBack counts a stall's failure taken back (metricname.StallsTakenBack).
func countTakenBack(ctx workflow.Context) {
	workflow.GetMetricsHandler(ctx).Counter(metricname.StallsTakenBack).Inc(1)
}

// awaitStallWord waits, where the stall charged last exhausted the run's
// failure budget, for the declared rank's word: it hears its verdict only
// once it runs again, after the rank that declared it has reported. A word
// that takes the failure back lets the run go on. It waits as long as a
// rank's silence could still be taken for brief (3/4 of the most the
// timeout can be raised to), and not at all where there is no room to
// raise the timeout. It reports whether the failure was taken back.
func (r *run) awaitStallWord(ctx workflow.Context) bool {
	stall, hb := time.Duration(r.p.StallTimeout), time.Duration(r.spec.Failure.HeartbeatTimeout)
	if stall == 0 || r.stalled.rank < 0 || r.stalled.settled {
		return r.stalled.takenBack
	}
	if _, room := raisedStallTimeout(stall, hb, stall); !room {
		return false
	}
	workflow.AwaitWithTimeout(ctx, hb/2*3/4, func() bool { return r.stalled.settled })
	return r.stalled.takenBack
}

// stallCharged is the generation whose gang broke last, the rank a host
// of it declared stalled (-1: none did), and whether a word about it was
// settled, and took the failure back.
type stallCharged struct {
	generation, rank   int
	settled, takenBack bool
}

// ringSpec is the spec an epoch's ranks get: the run's, with the stall
// timeout the run chose, where it chooses.
func (r *run) ringSpec() spec.Training {
	s := r.spec
	if r.p.StallTimeout != 0 {
		s.Failure.StallTimeout = r.p.StallTimeout
	}
	return s
}
