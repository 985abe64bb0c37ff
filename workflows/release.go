package workflows

import (
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// A run lets go of the holds it no longer needs at once. Cancelling a
// HoldSlot activity reaches its worker only with the activity's next
// heartbeat (most of the heartbeat timeout later), so the run also tells
// each host's worker, on the queue only that worker polls, to free the
// hold now (ReleaseHold). The slots of a finished, failed or cancelled run,
// of a gang that failed, and of a partial gang that timed out are free for
// the next gang within a round trip; runs waiting for slots no longer wait
// for heartbeats.

// releaseWait bounds how long a run that is about to close waits for its
// hosts to answer: a host that is gone does not, and its hold ends with
// the run's cancellation anyway.
const releaseWait = 10 * time.Second

// heldHost is a hold a host granted, where to tell it to let go, and the
// runs that may hold it now: this one, and the run it continued from while
// the gang has not crossed.
type heldHost struct {
	hold  holdID
	queue string
	runs  []string
}

// letGo tells each host to free its hold. With wait, it waits until every
// host answered or releaseWait passed (a run about to close: its pending
// activities would be dropped with it), for these hosts and for those let
// go of before without waiting (awaitReleases); without, it goes on at once.
func (r *run) letGo(ctx workflow.Context, hosts []heldHost, wait bool) {
	if !r.releaseByHost || len(hosts) == 0 && (!wait || len(r.releasing) == 0) {
		return
	}
	ctx, _ = workflow.NewDisconnectedContext(ctx) // a cancelled run lets go too
	done := make([]workflow.Future, 0, len(hosts))
	for _, h := range hosts {
		if h.queue == "" {
			continue // a placement from before hosts had queues
		}
		actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
			TaskQueue:              h.queue,
			ScheduleToCloseTimeout: releaseWait,
			StartToCloseTimeout:    releaseWait / 2,
			RetryPolicy:            &temporal.RetryPolicy{InitialInterval: 100 * time.Millisecond},
		})
		done = append(done, workflow.ExecuteActivity(actx, spec.ActivityReleaseHold,
			spec.ReleaseHoldInput{Generation: h.hold.Generation, Request: h.hold.Request, RunIDs: h.runs}))
	}
	if r.awaitReleases {
		// Those answered are forgotten: the list holds at most the
		// releases of the last releaseWait.
		r.releasing = slices.DeleteFunc(r.releasing, workflow.Future.IsReady)
		if !wait {
			r.releasing = append(r.releasing, done...)
			return
		}
		done = append(done, r.releasing...)
		r.releasing = nil
	}
	if !wait || len(done) == 0 {
		return
	}
	timerCtx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	timer := workflow.NewTimer(timerCtx, releaseWait)
	timedOut, answered := false, 0
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(timer, func(workflow.Future) { timedOut = true })
	for _, f := range done {
		sel.AddFuture(f, func(workflow.Future) { answered++ })
	}
	for !timedOut && answered < len(done) {
		sel.Select(ctx)
	}
}

// held is the gang's hosts, as run runID holds them.
func (g *gang) held(runID string) []heldHost {
	if len(g.holdIDs) != len(g.placements) {
		return nil // a gang recorded before holds were named
	}
	hosts := make([]heldHost, len(g.placements))
	for i, pl := range g.placements {
		hosts[i] = heldHost{hold: g.holdIDs[i], queue: pl.HostQueue, runs: []string{runID}}
	}
	return hosts
}

// held is the hosts that granted the probe, in request order.
func (pr *probe) held(runID string) []heldHost {
	var hosts []heldHost
	for req, pl := range pr.placements {
		hosts = append(hosts, heldHost{hold: holdID{pr.generation, req}, queue: pl.HostQueue, runs: []string{runID}})
	}
	slices.SortFunc(hosts, func(a, b heldHost) int { return a.hold.Request - b.hold.Request })
	return hosts
}
