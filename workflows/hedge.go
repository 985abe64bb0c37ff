package workflows

import (
	"context"
	"errors"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// Hedged holds. A HoldSlot task that a SIGSTOPped (or hung) worker's open
// long poll took counts as started: nothing tells the run until that hold's
// heartbeat times out, and the gang waits for it. A gang still missing hosts
// after hedgeAfter therefore asks for as many more, once, if the GPU queue
// has no backlog: then every hold it lacks was taken by a worker that has
// not granted it, and a free slot would take a hedge at once. With a
// backlog (the gang waits for capacity) it asks for nothing more, so the
// queue's backlog, the autoscaler's demand (durabletrain_slots_wanted), is
// never inflated by hedges. A hedge must be taken within hedgeAfter, and
// the gang takes the first hosts that grant.

// hedgeAfter is how long a forming gang waits for its holds' grants before
// it considers a hedge. A free slot is granted within a round trip; a
// swallowed hold is noticed only at its heartbeat timeout, so the hedge
// comes at a quarter of that.
func hedgeAfter(s spec.Training) time.Duration {
	return time.Duration(s.Failure.HeartbeatTimeout) / 4
}

// queueBacklog is a local activity: the approximate backlog of the activity
// task queue, as DescribeTaskQueue reports it; an error where the server
// reports no statistics.
func queueBacklog(ctx context.Context, queue string) (int64, error) {
	c := activity.GetClient(ctx)
	if c == nil {
		return 0, errors.New("no client to describe the task queue with")
	}
	resp, err := c.WorkflowService().DescribeTaskQueue(ctx, &workflowservice.DescribeTaskQueueRequest{
		Namespace:     activity.GetInfo(ctx).WorkflowNamespace,
		TaskQueue:     &taskqueuepb.TaskQueue{Name: queue, Kind: enumspb.TASK_QUEUE_KIND_NORMAL},
		TaskQueueType: enumspb.TASK_QUEUE_TYPE_ACTIVITY, ReportStats: true})
	if err != nil {
		return 0, err
	}
	if resp.GetStats() == nil {
		return 0, errors.New("the server reports no task queue statistics")
	}
	return resp.GetStats().GetApproximateBacklogCount(), nil
}

// queueIsDrained reports whether the run's GPU queue has no backlog now; false
// when that cannot be told.
func (r *run) queueIsDrained(ctx workflow.Context) bool {
	lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		ScheduleToCloseTimeout: 5 * time.Second,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1},
	})
	var backlog int64
	if err := workflow.ExecuteLocalActivity(lctx, queueBacklog, r.spec.Scaling.TaskQueue).Get(ctx, &backlog); err != nil {
		workflow.GetLogger(ctx).Info("not hedging: cannot read the GPU queue's backlog", "task_queue", r.spec.Scaling.TaskQueue, "error", err)
		return false
	}
	return backlog == 0
}
