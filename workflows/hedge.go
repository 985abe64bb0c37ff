package workflows

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// Hedged holds. A HoldSlot task that a SIGSTOPped (or hung) worker's open
// long poll took counts as started: nothing tells the run until that hold's
// heartbeat times out, and the gang would wait for it. So a gang still
// missing hosts after hedgeAfter asks Temporal which of its holds have
// started (a local activity describing the run's pending activities) and,
// for each that started but has not granted, asks once for one more host.
// A hold not yet started waits in the queue for a free slot: it is not
// hedged, so a gang waiting for capacity never adds to the queue's backlog
// (the autoscaler's demand, durabletrain_slots_wanted). The gang takes the
// first hosts that grant and cancels the others.

// hedgeAfter is how long a forming gang waits for its holds' grants before
// it looks for holds to hedge. A free slot's worker grants within a round
// trip; a swallowed hold is noticed only at its heartbeat timeout, so the
// hedge comes at a quarter of that.
func hedgeAfter(s spec.Training) time.Duration {
	return time.Duration(s.Failure.HeartbeatTimeout) / 4
}

// holdActivityID names a hold's activity (runs with hedge-holds) so that the
// run can find it among its pending activities: generation, request, attempt.
func holdActivityID(gen, req, attempt int) string {
	return fmt.Sprintf("hold-%d-%d-%d", gen, req, attempt)
}

// startedHolds is a local activity: the IDs of the run's pending HoldSlot
// activities that a worker has started, as DescribeWorkflowExecution says.
func startedHolds(ctx context.Context) ([]string, error) {
	c := activity.GetClient(ctx)
	if c == nil {
		return nil, errors.New("no client to describe the run with")
	}
	info := activity.GetInfo(ctx)
	resp, err := c.DescribeWorkflowExecution(ctx, info.WorkflowExecution.ID, info.WorkflowExecution.RunID)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, pa := range resp.GetPendingActivities() {
		if pa.GetActivityType().GetName() == spec.ActivityHoldSlot && pa.GetState() == enumspb.PENDING_ACTIVITY_STATE_STARTED {
			ids = append(ids, pa.GetActivityId())
		}
	}
	return ids, nil
}

// holdsToHedge is which of the given hold activities have started; none when
// that cannot be told.
func (r *run) holdsToHedge(ctx workflow.Context, ids []string) []string {
	if len(ids) == 0 {
		return nil
	}
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 5 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var started []string
	if err := workflow.ExecuteLocalActivity(lctx, startedHolds).Get(ctx, &started); err != nil {
		workflow.GetLogger(ctx).Info("not hedging: cannot tell which holds started", "error", err)
		return nil
	}
	return slices.DeleteFunc(slices.Clone(ids), func(id string) bool { return !slices.Contains(started, id) })
}
