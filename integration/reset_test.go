package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/devserver"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// resetToFirstTask resets a workflow's current run to its first workflow
// task, as the Temporal UI's "Reset" and `temporal workflow reset --type
// FirstWorkflowTask` do (with `--reapply-exclude` for exclude), and returns the new run.
func resetToFirstTask(t *testing.T, c client.Client, id string, exclude ...enumspb.ResetReapplyExcludeType) client.WorkflowRun {
	t.Helper()
	d, err := c.DescribeWorkflowExecution(t.Context(), id, "")
	if err != nil {
		t.Fatal(err)
	}
	return resetRunToFirstTask(t, c, id, d.WorkflowExecutionInfo.Execution.RunId, exclude...)
}

// resetRunToFirstTask is resetToFirstTask of the workflow's run runID.
func resetRunToFirstTask(t *testing.T, c client.Client, id, runID string, exclude ...enumspb.ResetReapplyExcludeType) client.WorkflowRun {
	t.Helper()
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
		ResetReapplyExcludeTypes:  exclude,
	})
	if err != nil {
		t.Fatal(err)
	}
	return c.GetWorkflow(t.Context(), id, resp.RunId)
}

// TestAResetRunTrainsAgain: a user resets a run to its first workflow task
// (the Temporal UI's "Reset"): once it has completed, and once while its
// ranks train (Temporal terminates the running execution under them, and
// they learn it only from their heartbeats). Each reset run trains again
// from the start under the same checkpoint name, writing over what its base
// run left there, with no failure, and ends completed with every epoch's
// numbers exactly those of the run untouched. A run stopped and reset stops
// again before it trains (Temporal applies its stop again), and trains to
// the end reset without the signals and updates it received.
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
	until(t, "it-reset-running to train an epoch", func() bool {
		p := progress(t, c, "it-reset-running")
		return p != nil && p.Epoch >= 1
	})
	same("reset while training", untouched, awaitRun(t, resetToFirstTask(t, c, "it-reset-running"), 3*time.Minute))

	// A run stopped (`starter stop`: the stop update) and reset: Temporal
	// applies the stop again, and the reset run stops as its base run did;
	// reset without the signals and updates it received, it trains to the end.
	s.Checkpoint.URL = subsetSpec(t, queue, 2, epochs).Checkpoint.URL
	stopped := startRun(t, c, "it-reset-stopped", queue, s)
	until(t, "it-reset-stopped to train", func() bool {
		p := progress(t, c, "it-reset-stopped")
		return p != nil && p.State == spec.StateTraining
	})
	h, err := c.UpdateWorkflow(t.Context(), client.UpdateWorkflowOptions{WorkflowID: "it-reset-stopped", UpdateName: spec.UpdateStop,
		WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		t.Fatal(err)
	}
	var res spec.StopResult
	if err := h.Get(t.Context(), &res); err != nil {
		t.Fatal(err)
	}
	if p := awaitRun(t, stopped, 2*time.Minute); p.State != spec.StateStopped {
		t.Fatalf("the stopped run: %+v", p)
	}
	again := awaitRun(t, resetRunToFirstTask(t, c, "it-reset-stopped", stopped.GetRunID()), 2*time.Minute)
	t.Logf("stopped at epoch %d, reset with what it received applied again: %s at epoch %d", res.Epoch, again.State, again.Epoch)
	if again.State != spec.StateStopped || again.Epoch >= epochs {
		t.Fatalf("reset with its stop applied again: %s at epoch %d; want stopped early again", again.State, again.Epoch)
	}
	// The base run, not the reset one: that one holds the stop before its first workflow task.
	same("reset without its signals and updates", untouched, awaitRun(t, resetRunToFirstTask(t, c, "it-reset-stopped", stopped.GetRunID(),
		enumspb.RESET_REAPPLY_EXCLUDE_TYPE_SIGNAL, enumspb.RESET_REAPPLY_EXCLUDE_TYPE_UPDATE), 3*time.Minute))
}

// until polls cond every 20 ms, for up to 2 minutes, and fails saying what
// it waited for if cond never held.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 2 minutes for %s", what)
		}
	}
}

// searchResults is a search's results query, or none while it does not answer.
func searchResults(t *testing.T, c client.Client, id string) spec.TuneResults {
	var r *spec.TuneResults
	if v, err := c.QueryWorkflow(t.Context(), id, "", spec.QueryResults); err != nil || v.Get(&r) != nil || r == nil {
		return spec.TuneResults{}
	}
	return *r
}

// startSearch starts a search of 4 trials, at most concurrent at a time, over the learning rate.
func startSearch(t *testing.T, c client.Client, id, queue string, concurrent int) client.WorkflowRun {
	t.Helper()
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
		"max_concurrent_trials": concurrent,
	})
	run, err := c.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{ID: id, TaskQueue: queue + "-control"}, spec.WorkflowTune, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// awaitSearch waits for a search's results and logs its trials.
func awaitSearch(t *testing.T, what string, run client.WorkflowRun) spec.TuneResults {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var res spec.TuneResults
	if err := run.Get(ctx, &res); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for _, tr := range res.Trials {
		t.Logf("%s: trial %d (%s) %s epochs %d last %.4f %s", what, tr.Trial, tr.WorkflowID, tr.Status, tr.Epochs, deref(tr.Last), tr.Reason)
	}
	return res
}

// resetTrialID is the ID of a trial a reset search started.
var resetTrialID = regexp.MustCompile(`-trial-[0-9]+-reset-[0-9a-f]{8}$`)

// sameSearch fails unless a search ran every trial to the numbers of the
// search untouched, the trials from some k on (k returned) under IDs of a
// reset run, and those before k under their own.
func sameSearch(t *testing.T, what string, untouched, got spec.TuneResults) (k int) {
	t.Helper()
	if len(got.Trials) != len(untouched.Trials) || got.Best != untouched.Best {
		t.Fatalf("%s: %d trials, best %d; the search untouched had %d, best %d", what, len(got.Trials), got.Best, len(untouched.Trials), untouched.Best)
	}
	k = len(got.Trials)
	for i, tr := range got.Trials {
		u := untouched.Trials[i]
		tagged := resetTrialID.MatchString(tr.WorkflowID)
		if tagged && k == len(got.Trials) {
			k = i
		}
		if tagged != (i >= k) || tagged && tr.WorkflowID == u.WorkflowID {
			t.Fatalf("%s: trial %d ran as %s; the search untouched ran it as %s", what, i, tr.WorkflowID, u.WorkflowID)
		}
		if tr.Status != spec.TrialCompleted || tr.Epochs != u.Epochs || deref(tr.Last) != deref(u.Last) {
			t.Fatalf("%s: trial %d %s after %d epochs at %.4f (%s); untouched, %s after %d at %.4f", what, i, tr.Status, tr.Epochs, deref(tr.Last), tr.Reason, u.Status, u.Epochs, deref(u.Last))
		}
	}
	return k
}

// TestAResetSearchRunsItsTrialsAgain: a search reset to its first workflow
// task once it has completed, and while its trials train (Temporal
// terminates the running execution, and its trials are asked to cancel by
// their parent close policy, but may still be closing): each reset search
// runs its trials again as workflows of their own, apart from its base
// run's (whose IDs may still be taken, and whose checkpoint run names they
// own), and ends completed with every trial completed and its numbers
// exactly those of the search untouched. A trial reset alone, while it
// trains, trains again under its own ID, and its search takes the result
// of its new execution.
func TestAResetSearchRunsItsTrialsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-reset-tune"
	startWorker(t, "rt-ctl", "workflows", queue)
	startWorker(t, "rt-a", "agent", queue)
	startWorker(t, "rt-b", "agent", queue)
	c := dial(t)
	untouched := awaitSearch(t, "untouched", startSearch(t, c, "it-reset-tune-done", queue, 2))
	if k := sameSearch(t, "untouched", untouched, untouched); k != len(untouched.Trials) {
		t.Fatalf("the search untouched ran trial %d as a reset search's", k)
	}
	if k := sameSearch(t, "reset once completed", untouched, awaitSearch(t, "reset once completed", resetToFirstTask(t, c, "it-reset-tune-done"))); k != 0 {
		t.Fatalf("reset once completed: trials before %d kept their base run's IDs", k)
	}

	startSearch(t, c, "it-reset-tune-running", queue, 2)
	until(t, "a trial of it-reset-tune-running to complete", func() bool {
		return slices.ContainsFunc(searchResults(t, c, "it-reset-tune-running").Trials, func(tr spec.TrialStatus) bool { return tr.Status == spec.TrialCompleted })
	})
	if k := sameSearch(t, "reset while its trials train", untouched, awaitSearch(t, "reset while its trials train", resetToFirstTask(t, c, "it-reset-tune-running"))); k != 0 {
		t.Fatalf("reset while its trials train: trials before %d kept their base run's IDs", k)
	}

	// One trial reset while it trains, the search left alone: the trial
	// trains again from its start under its own ID and checkpoint name,
	// and the search takes the result of its new execution.
	search := startSearch(t, c, "it-reset-tune-trial", queue, 2)
	var trial string
	until(t, "a trial of it-reset-tune-trial to train an epoch", func() bool {
		for _, tr := range searchResults(t, c, "it-reset-tune-trial").Trials {
			if p := progress(t, c, tr.WorkflowID); tr.Status == spec.TrialRunning && p != nil && p.Epoch >= 1 && p.State == spec.StateTraining {
				trial = tr.WorkflowID
				return true
			}
		}
		return false
	})
	base, err := c.DescribeWorkflowExecution(t.Context(), trial, "")
	if err != nil {
		t.Fatal(err)
	}
	again := resetToFirstTask(t, c, trial)
	if k := sameSearch(t, "one trial reset", untouched, awaitSearch(t, "one trial reset", search)); k != len(untouched.Trials) {
		t.Fatalf("one trial reset: trial %d ran as a reset search's", k)
	}
	// The reset terminated the trial's execution while it trained, and its
	// new execution is the one that completed.
	was, err := c.DescribeWorkflowExecution(t.Context(), trial, base.WorkflowExecutionInfo.Execution.RunId)
	if err != nil {
		t.Fatal(err)
	}
	now, err := c.DescribeWorkflowExecution(t.Context(), trial, again.GetRunID())
	if err != nil {
		t.Fatal(err)
	}
	if was.WorkflowExecutionInfo.Status != enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED || now.WorkflowExecutionInfo.Status != enumspb.WORKFLOW_EXECUTION_STATUS_COMPLETED {
		t.Fatalf("trial %s: its base execution %s, its reset one %s; want terminated by the reset, then completed", trial, was.WorkflowExecutionInfo.Status, now.WorkflowExecutionInfo.Status)
	}
	t.Logf("reset trial %s while it trained its second epoch", trial)
}

// TestAResetSearchAfterContinueAsNewRunsItsTrialsAgain: on a server that
// suggests continue-as-new every 40 events, a search that continued as new
// is reset to its new execution's first workflow task while that execution's
// trials train. The trials listed before continue-as-new but started after
// it run again under IDs of the reset run, and the search ends with the
// numbers of the same search on that server untouched.
func TestAResetSearchAfterContinueAsNewRunsItsTrialsAgain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and worker processes")
	}
	often, err := devserver.Start(devserver.Options{Ephemeral: true, SuggestContinueAsNewAfter: 40})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(often.Stop)
	c, err := connect.Options{Address: often.Addr(), Namespace: "default"}.Dial(zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	queue := "it-reset-tune-can"
	startWorkerAt(t, often.Addr(), "rtc-ctl", "workflows", queue, testPolicy)
	startWorkerAt(t, often.Addr(), "rtc-a", "agent", queue, testPolicy)
	startWorkerAt(t, often.Addr(), "rtc-b", "agent", queue, testPolicy)
	untouched := awaitSearch(t, "untouched", startSearch(t, c, "it-reset-tune-can-ref", queue, 1))

	first := startSearch(t, c, "it-reset-tune-can", queue, 1) // one at a time: it continues as new before the last
	training := -1                                            // a trial the continued execution trains
	until(t, "it-reset-tune-can to train a trial after it continued as new", func() bool {
		d, err := c.DescribeWorkflowExecution(t.Context(), "it-reset-tune-can", "")
		if err != nil || d.WorkflowExecutionInfo.Execution.RunId == first.GetRunID() {
			return false
		}
		for _, tr := range searchResults(t, c, "it-reset-tune-can").Trials {
			if tr.Status == spec.TrialRunning {
				training = tr.Trial
				return true
			}
		}
		return false
	})
	// The execution reset started the trials from k on: the reset run
	// starts them again under its own IDs; those before k ended before it.
	k := sameSearch(t, "reset after continue-as-new", untouched, awaitSearch(t, "reset after continue-as-new", resetToFirstTask(t, c, "it-reset-tune-can")))
	t.Logf("reset after continue-as-new while trial %d trained: trials %d on ran again", training, k)
	if k < 1 || k > training {
		t.Fatalf("trials from %d on ran again; want from the continued execution's first, at least 1 and at most %d (training when reset)", k, training)
	}
}
