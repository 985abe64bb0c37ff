package workflows

import (
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// A run continues as new with its gang: the holds of its hosts are not
// released, the gang goes into the next run's input (keptGang), and the
// next run asks each host, on its own host queue, to hand the hold over
// (activities/handover.go). The gang's collective and the ranks' warm
// replicas stay, so the next epoch forms no gang and restores nothing.
// If any host does not hand over within the gang timeout (for which the
// agents keep the holds: HoldSlotInput.KeepFor), the next run releases what
// it took and forms a gang as after a failure.

// keepForNext is what the run continues as new with: the gang, if it can
// cross (its holds stay; a probe for a degraded gang's missing hosts is
// released), or nil after releasing it.
func (r *run) keepForNext(ctx workflow.Context) *keptGang {
	if !r.keepGang || !r.rankKeys || r.gang == nil || len(r.gang.holdIDs) != len(r.gang.placements) {
		r.releaseGang(ctx, true)
		return nil
	}
	if r.probe != nil {
		r.letGo(ctx, r.probe.held(workflow.GetInfo(ctx).WorkflowExecution.RunID), true)
		r.probe.release()
		r.probe = nil
	}
	r.letGo(ctx, nil, true) // releases still pending would be dropped with this execution
	kept := &keptGang{Generation: r.gang.generation}
	for i, pl := range r.gang.placements {
		kept.Hosts = append(kept.Hosts, keptHost{Hold: r.gang.holdIDs[i], Queue: pl.HostQueue})
	}
	return kept
}

// takeOverGang, in a run that continued as new with a gang, asks each of
// the gang's hosts to hand its hold over to this run; it makes the gang
// this run's if all do within the gang timeout, and releases what it got
// otherwise.
func (r *run) takeOverGang(ctx workflow.Context, kept keptGang) bool {
	placements := make([]spec.Placement, len(kept.Hosts))
	info := workflow.GetInfo(ctx)
	wait := time.Duration(r.spec.Scaling.GangTimeout)
	holdCtx, release := workflow.WithCancel(ctx)
	holds := make([]workflow.Future, len(placements))
	pos := make(map[holdID]int, len(placements))
	holdIDs := make([]holdID, len(placements))
	for i, host := range kept.Hosts {
		id := host.Hold
		pos[id], holdIDs[i] = i, id
		placements[i].HostQueue = host.Queue // until the host grants it again: for messages
		actx := workflow.WithActivityOptions(holdCtx, workflow.ActivityOptions{
			TaskQueue:              host.Queue,
			ScheduleToStartTimeout: wait,
			StartToCloseTimeout:    365 * 24 * time.Hour,
			HeartbeatTimeout:       time.Duration(r.spec.Failure.HeartbeatTimeout),
			RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
		})
		holds[i] = workflow.ExecuteActivity(actx, spec.ActivityHoldSlot, spec.HoldSlotInput{
			WorkflowID: info.WorkflowExecution.ID, RunID: info.WorkflowExecution.RunID, Generation: id.Generation, Request: id.Request,
			Slots: slotsPerHold(r.spec), KeepFor: r.spec.Scaling.GangTimeout, Handover: &spec.Handover{PreviousRunID: info.ContinuedExecutionRunID}})
	}
	timerCtx, cancelTimer := workflow.WithCancel(ctx)
	defer cancelTimer()
	timer := workflow.NewTimer(timerCtx, wait)
	granted := make([]bool, len(placements))
	count := 0
	var failed error
	r.waiting(ctx, fmt.Sprintf("taking over gang %d's %d hosts from the run this one continued", kept.Generation, len(placements)))
	for count < len(placements) && failed == nil {
		sel := workflow.NewSelector(ctx)
		sel.AddReceive(r.grants, func(c workflow.ReceiveChannel, _ bool) {
			s, _ := r.takeGrant(ctx, c)
			if s == nil {
				return
			}
			i, ok := pos[holdID{s.Generation, s.Request}]
			if !ok || granted[i] {
				return
			}
			granted[i] = true
			placements[i] = s.Placement
			count++
		})
		sel.AddFuture(timer, func(workflow.Future) {
			failed = fmt.Errorf("%d of %d hosts handed over within %v", count, len(placements), wait)
		})
		for i, h := range holds {
			if granted[i] {
				continue
			}
			sel.AddFuture(h, func(f workflow.Future) {
				if failed == nil {
					failed = fmt.Errorf("host %d (queue %s): %v", i, kept.Hosts[i].Queue, shortError(f.Get(ctx, nil)))
				}
			})
		}
		sel.Select(ctx)
		if ctx.Err() != nil && failed == nil {
			failed = ctx.Err()
		}
	}
	r.waiting(ctx, "")
	if failed != nil {
		release()
		// Let go of every host at once: one that handed over holds for this
		// run, one that did not may still keep the hold for the run before.
		hosts := make([]heldHost, len(placements))
		for i, host := range kept.Hosts {
			hosts[i] = heldHost{hold: host.Hold, queue: host.Queue, runs: []string{info.WorkflowExecution.RunID, info.ContinuedExecutionRunID}}
		}
		r.letGo(ctx, hosts, false)
		workflow.GetLogger(ctx).Warn("the gang did not cross continue-as-new; forming a new one", "generation", kept.Generation, "error", failed)
		return false
	}
	perHost := max(1, r.spec.Scaling.WorkersPerHost)
	for i := range placements {
		placements[i].Rank = i * perHost
	}
	r.gang = &gang{generation: kept.Generation, placements: placements, holdIDs: holdIDs, holds: holds, release: release}
	r.p.Gang, r.p.World = placements, r.gang.world(r.spec)
	return true
}
