package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/testdata"
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

// TestAResetSearchRunsItsTrialsAgain: a search reset to its first workflow
// task once it has completed, and while its trials train (Temporal
// terminates the running execution, and its trials are asked to cancel by
// their parent close policy, but may still be closing): each reset search
// runs its trials again as workflows of their own, apart from its base
// run's (whose IDs may still be taken, and whose checkpoint run names they
// own), and ends completed with every trial completed and its numbers
// exactly those of the search untouched.
func TestAResetSearchRunsItsTrialsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-reset-tune"
	startWorker(t, "rt-ctl", "workflows", queue)
	startWorker(t, "rt-a", "agent", queue)
	startWorker(t, "rt-b", "agent", queue)
	c := dial(t)
	search := func(id string) client.WorkflowRun {
		raw, _ := json.Marshal(map[string]any{
			"train": map[string]any{
				"dataset":    map[string]any{"url": testdata.FashionMNISTSmall()},
				"hyper":      map[string]any{"epochs": 2, "batch_size": 32},
				"scaling":    map[string]any{"workers": 1, "task_queue": queue},
				"checkpoint": map[string]any{"url": bloburl.FromPath(t.TempDir()) + "?metadata=skip"},
				"failure":    map[string]any{"heartbeat_timeout": "3s"},
			},
			"param_space":           map[string]any{"hyper.lr": map[string]any{"grid_search": []float64{1e-3, 3e-3, 1e-2, 3e-2}}},
			"metric":                "test_accuracy",
			"mode":                  "max",
			"max_concurrent_trials": 2,
		})
		run, err := c.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{ID: id, TaskQueue: queue + "-control"}, spec.WorkflowTune, json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		return run
	}
	await := func(what string, run client.WorkflowRun) spec.TuneResults {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		var res spec.TuneResults
		if err := run.Get(ctx, &res); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		for _, tr := range res.Trials {
			t.Logf("%s: trial %d %s epochs %d last %.4f %s", what, tr.Trial, tr.Status, tr.Epochs, deref(tr.Last), tr.Reason)
		}
		return res
	}
	untouched := await("untouched", search("it-reset-tune-done"))
	same := func(what string, got spec.TuneResults) {
		t.Helper()
		if len(got.Trials) != len(untouched.Trials) || got.Best != untouched.Best {
			t.Fatalf("%s: %d trials, best %d; the search untouched had %d, best %d", what, len(got.Trials), got.Best, len(untouched.Trials), untouched.Best)
		}
		for i, tr := range got.Trials {
			u := untouched.Trials[i]
			if what != "untouched" && (tr.WorkflowID == u.WorkflowID || !strings.Contains(tr.WorkflowID, "-reset-")) {
				t.Fatalf("%s: trial %d ran as %s; its base run's trial was %s", what, i, tr.WorkflowID, u.WorkflowID)
			}
			if tr.Status != spec.TrialCompleted || tr.Epochs != u.Epochs || deref(tr.Last) != deref(u.Last) {
				t.Fatalf("%s: trial %d %s after %d epochs at %.4f (%s); untouched, %s after %d at %.4f", what, i, tr.Status, tr.Epochs, deref(tr.Last), tr.Reason, u.Status, u.Epochs, deref(u.Last))
			}
		}
	}
	same("untouched", untouched)
	same("reset once completed", await("reset once completed", resetToFirstTask(t, c, "it-reset-tune-done")))

	search("it-reset-tune-running")
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var r *spec.TuneResults
		if v, err := c.QueryWorkflow(t.Context(), "it-reset-tune-running", "", spec.QueryResults); err == nil && v.Get(&r) == nil && r != nil {
			ended := 0
			for _, tr := range r.Trials {
				if tr.Status == spec.TrialCompleted {
					ended++
				}
			}
			if ended >= 1 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no trial of it-reset-tune-running ended in 2 minutes")
		}
	}
	same("reset while its trials train", await("reset while its trials train", resetToFirstTask(t, c, "it-reset-tune-running")))
}
