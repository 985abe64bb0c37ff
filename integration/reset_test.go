package integration

import (
	"fmt"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/spec"
)

// resetToFirstTask resets a workflow's current run to its first workflow
// task, as the Temporal UI's "Reset" and `temporal workflow reset --type
// FirstWorkflowTask` do, and returns the new run.
func resetToFirstTask(t *testing.T, c client.Client, id string) client.WorkflowRun {
	t.Helper()
	d, err := c.DescribeWorkflowExecution(t.Context(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	runID := d.WorkflowExecutionInfo.Execution.RunId
	var finished int64
	for it := c.GetWorkflowHistory(t.Context(), id, runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT); it.HasNext() && finished == 0; {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if e.EventType == enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED {
			finished = e.EventId
		}
	}
	resp, err := c.ResetWorkflowExecution(t.Context(), &workflowservice.ResetWorkflowExecutionRequest{
		Namespace:                 "default",
		WorkflowExecution:         &commonpb.WorkflowExecution{WorkflowId: id, RunId: runID},
		Reason:                    "integration test: reset to the first workflow task",
		WorkflowTaskFinishEventId: finished,
		RequestId:                 fmt.Sprintf("%s-%d", id, time.Now().UnixNano()),
	})
	if err != nil {
		t.Fatal(err)
	}
	return c.GetWorkflow(t.Context(), id, resp.RunId)
}

// TestAResetRunTrainsAgain: a user resets a run to its first workflow task
// (the Temporal UI's "Reset"): once it has completed, and once while its
// ranks train (Temporal terminates the running execution under them, and
// they learn it only from their heartbeats). Each reset run trains again on
// the checkpoints its earlier execution left under the same name and ends
// completed with every epoch's numbers exactly those of the run untouched.
func TestAResetRunTrainsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-reset"
	startWorker(t, "rs-ctl", "workflows", queue)
	startWorker(t, "rs-a", "agent", queue)
	startWorker(t, "rs-b", "agent", queue)
	c := dial(t)
	const epochs = 3
	s := subsetSpec(t, queue, 2, epochs)
	s.Hyper.BatchSize = 32
	same := func(what string, want, got *spec.Progress) {
		t.Helper()
		t.Logf("%s: %s at epoch %d, generation %d, %d failures, latest %+v, %d epochs' metrics", what, got.State, got.Epoch, got.Generation, got.Failures, got.Latest, len(got.Metrics))
		if got.State != spec.StateCompleted || got.Epoch != epochs || len(got.Metrics) != epochs || got.Failures != 0 {
			t.Fatalf("%s: progress %+v", what, got)
		}
		for e := range epochs {
			a, b := want.Metrics[e], got.Metrics[e]
			if a.TrainLoss != b.TrainLoss || a.TestAccuracy != b.TestAccuracy || a.TestLoss != b.TestLoss {
				t.Fatalf("%s: epoch %d trained to %+v; the run untouched to %+v", what, e, b, a)
			}
		}
	}

	untouched := awaitRun(t, startRun(t, c, "it-reset-done", queue, s), 2*time.Minute)
	same("untouched", untouched, untouched)
	same("reset once completed", untouched, awaitRun(t, resetToFirstTask(t, c, "it-reset-done"), 2*time.Minute))

	// The same spec under another name: its own checkpoints.
	s.Checkpoint.URL = subsetSpec(t, queue, 2, epochs).Checkpoint.URL
	startRun(t, c, "it-reset-running", queue, s)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if p := progress(t, c, "it-reset-running"); p != nil && p.Epoch >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("it-reset-running trained no epoch in 2 minutes")
		}
	}
	same("reset while training", untouched, awaitRun(t, resetToFirstTask(t, c, "it-reset-running"), 3*time.Minute))
}
