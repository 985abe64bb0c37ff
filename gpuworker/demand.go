package gpuworker

import (
	"context"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	taskqueuepb "go.temporal.io/api/taskqueue/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// demandEvery is how often a workflow worker asks Temporal how many slot
// requests wait on the GPU queue.
const demandEvery = 10 * time.Second

// sampleDemand records durabletrain_slots_wanted: the HoldSlot tasks waiting
// in the GPU task queue's backlog (every rank of a forming gang that no
// agent has taken yet), as Temporal's DescribeTaskQueue reports it. With the
// agents' held slots it is the demand an autoscaler scales agents by
// (deploy/k8s/agents-scaledobject.yaml). It drops to zero while a gang that
// timed out backs off; the autoscaler smooths that (see the README).
func sampleDemand(ctx context.Context, c client.Client, namespace, queue string, h client.MetricsHandler, log *zap.Logger, every time.Duration) {
	gauge := h.WithTags(map[string]string{"task_queue": queue}).Gauge(metricname.SlotsWanted)
	t := time.NewTicker(every)
	defer t.Stop()
	warned := false
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := c.WorkflowService().DescribeTaskQueue(qctx, &workflowservice.DescribeTaskQueueRequest{
			Namespace: namespace, TaskQueue: &taskqueuepb.TaskQueue{Name: queue, Kind: enumspb.TASK_QUEUE_KIND_NORMAL},
			TaskQueueType: enumspb.TASK_QUEUE_TYPE_ACTIVITY, ReportStats: true})
		cancel()
		switch {
		case err == nil:
			gauge.Update(float64(resp.GetStats().GetApproximateBacklogCount()))
			warned = false
		case ctx.Err() == nil && !warned:
			log.Warn("cannot read the GPU queue's backlog for durabletrain_slots_wanted", zap.String("task_queue", queue), zap.Error(err))
			warned = true
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
