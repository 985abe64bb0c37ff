package integration

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// historyCounts counts a closed workflow's events by type; workflow task
// failures only where the workflow's code failed.
func historyCounts(t *testing.T, c client.Client, id string) map[enumspb.EventType]int {
	t.Helper()
	n := map[enumspb.EventType]int{}
	it := c.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		if a := e.GetWorkflowTaskFailedEventAttributes(); a != nil && a.Cause == enumspb.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND {
			// The server refused a completion because an event (a cancelled
			// hold, a signal) arrived meanwhile, and ran the task again: a
			// race of Temporal's, not a failure of the workflow code.
			continue
		}
		n[e.EventType]++
	}
	return n
}

// awaitClosed waits for a workflow to close and returns its status.
func awaitClosed(t *testing.T, c client.Client, id string, limit time.Duration) enumspb.WorkflowExecutionStatus {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		d, err := c.DescribeWorkflowExecution(context.Background(), id, "")
		if err != nil {
			t.Fatal(err)
		}
		if s := d.WorkflowExecutionInfo.Status; s != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still running %v after it was asked to end", id, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkpointsOf lists the committed checkpoints a run left in a file:// store.
func checkpointsOf(t *testing.T, dir, run string) []string {
	manifests, _ := filepath.Glob(filepath.Join(dir, run, "*", checkpoint.ManifestName))
	return manifests
}

// TestCancelWhileFormingAGangClosesTheRun: a run that waits for slots no
// worker has (2 ranks, no agent), cancelled, closes as cancelled within
// seconds, having tried a handful of gangs, not tens of thousands, and with
// no workflow task failed.
func TestCancelWhileFormingAGangClosesTheRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-cancel-forming"
	startWorker(t, "cf-ctl", "workflows", queue)
	c := dial(t)
	s := subsetSpec(t, queue, 2, 3)
	s.Scaling.GangTimeout = spec.Duration(time.Second)
	run := startRun(t, c, "it-cancel-forming-1", queue, s)
	time.Sleep(2500 * time.Millisecond) // a gang timeout and a back-off
	if p := progress(t, c, run.GetID()); p == nil || p.State != spec.StateFormingGang {
		t.Fatalf("before the cancel: %+v", p)
	}
	asked := time.Now()
	if err := c.CancelWorkflow(context.Background(), run.GetID(), ""); err != nil {
		t.Fatal(err)
	}
	err := run.Get(context.Background(), nil)
	var canceled *temporal.CanceledError
	if !errors.As(err, &canceled) {
		t.Fatalf("got %v; want the run cancelled", err)
	}
	n := historyCounts(t, c, run.GetID())
	t.Logf("closed %v after the cancel; %d HoldSlot activities scheduled, %d workflow tasks", time.Since(asked).Round(time.Millisecond),
		n[enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED], n[enumspb.EVENT_TYPE_WORKFLOW_TASK_COMPLETED])
	if n[enumspb.EVENT_TYPE_WORKFLOW_TASK_FAILED] != 0 || n[enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED] > 8 {
		t.Fatalf("history after the cancel: %v", n)
	}
	recordHistory(t, c, run.GetID(), "cancel-forming-gang")
}

// TestCancelAndTerminateWhileTrainingFreeTheSlotsAndKeepTheCheckpoints: a
// 2-rank run on two one-slot agents is cancelled (then, in a second round,
// terminated) mid-training. It closes; its checkpoints stay; and a second
// 2-rank run on the same two slots forms its gang and completes, which it
// could not if either slot were still held.
func TestCancelAndTerminateWhileTrainingFreeTheSlotsAndKeepTheCheckpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-end-training"
	startWorker(t, "et-ctl", "workflows", queue)
	startWorker(t, "et-a", "agent", queue)
	startWorker(t, "et-b", "agent", queue)
	c := dial(t)
	for _, how := range []string{"cancel", "terminate"} {
		s := subsetSpec(t, queue, 2, 50)
		s.Checkpoint.KeepLast = spec.Int(0) // keep every one: any checkpoint gone was deleted by the ending
		dir, err := bloburl.LocalPath("checkpoint.url", s.Checkpoint.URL)
		if err != nil {
			t.Fatal(err)
		}
		id := "it-end-training-" + how
		run := startRun(t, c, id, queue, s)
		deadline := time.Now().Add(2 * time.Minute)
		for {
			p := progress(t, c, id)
			if p != nil && p.Epoch >= 2 && p.Latest != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the run did not reach epoch 2: %+v", how, p)
			}
			time.Sleep(50 * time.Millisecond)
		}
		before := checkpointsOf(t, dir, id)
		asked := time.Now()
		if how == "cancel" {
			err = c.CancelWorkflow(context.Background(), id, "")
		} else {
			err = c.TerminateWorkflow(context.Background(), id, "", "test: terminate mid-training")
		}
		if err != nil {
			t.Fatal(err)
		}
		status := awaitClosed(t, c, id, 30*time.Second)
		closed := time.Since(asked)
		want := map[string]enumspb.WorkflowExecutionStatus{"cancel": enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED,
			"terminate": enumspb.WORKFLOW_EXECUTION_STATUS_TERMINATED}[how]
		if status != want {
			t.Fatalf("%s: status %v", how, status)
		}
		if how == "cancel" {
			var canceled *temporal.CanceledError
			if err := run.Get(context.Background(), nil); !errors.As(err, &canceled) {
				t.Fatalf("cancel: got %v", err)
			}
		}
		// The same two slots make the next run's gang.
		next := subsetSpec(t, queue, 2, 1)
		next.Scaling.GangTimeout = spec.Duration(30 * time.Second)
		nextRun := startRun(t, c, id+"-next", queue, next)
		p := awaitRun(t, nextRun, 2*time.Minute)
		formed := time.Since(asked)
		after := checkpointsOf(t, dir, id)
		t.Logf("%s: closed %v after it was asked; the next run on the same slots completed %v after; %d checkpoints before, %d after",
			how, closed.Round(time.Millisecond), formed.Round(time.Millisecond), len(before), len(after))
		if p.State != spec.StateCompleted || p.Generation != 1 {
			t.Fatalf("%s: the next run: %+v", how, p)
		}
		if len(before) == 0 || len(after) < len(before) {
			t.Fatalf("%s: checkpoints %v before, %v after", how, before, after)
		}
		for _, m := range before {
			if _, err := os.Stat(m); err != nil {
				t.Fatalf("%s: checkpoint %s is gone: %v", how, m, err)
			}
		}
		recordHistory(t, c, id, how+"-training")
	}
}

// TestEndingASearchEndsItsTrials: a search whose two trials wait for slots
// (2 ranks each, one one-slot agent: neither gang can form) is terminated,
// as the issue found it: the trials are asked to cancel (parent-close policy
// REQUEST_CANCEL) and close as cancelled. A second search, cancelled while
// one trial trains and one waits, waits for both to close, writes its results and
// closes as cancelled; the slot is free for the next run.
func TestEndingASearchEndsItsTrials(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-end-search"
	startWorker(t, "es-ctl", "workflows", queue)
	startWorker(t, "es-a", "agent", queue)
	c := dial(t)
	ckpt := t.TempDir()
	search := func(workers, epochs int) json.RawMessage {
		raw, _ := json.Marshal(map[string]any{
			"train": map[string]any{
				"dataset":    map[string]any{"url": testdata.FashionMNISTSmall()},
				"hyper":      map[string]any{"epochs": epochs},
				"scaling":    map[string]any{"workers": workers, "task_queue": queue, "gang_timeout": "1s"},
				"checkpoint": map[string]any{"url": bloburl.FromPath(ckpt) + "?metadata=skip"},
				"failure":    map[string]any{"heartbeat_timeout": "3s"},
			},
			"param_space":           map[string]any{"hyper.lr": map[string]any{"grid_search": []float64{1e-3, 2e-3}}},
			"max_concurrent_trials": 2,
		})
		return raw
	}
	// 1. Terminated while its trials wait for slots.
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: "it-end-search-1", TaskQueue: queue + "-control"}, spec.WorkflowTune, search(2, 3))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	asked := time.Now()
	if err := c.TerminateWorkflow(context.Background(), run.GetID(), "", "test: terminate a waiting search"); err != nil {
		t.Fatal(err)
	}
	for _, trial := range []string{"it-end-search-1-trial-000", "it-end-search-1-trial-001"} {
		if s := awaitClosed(t, c, trial, 30*time.Second); s != enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED {
			t.Fatalf("%s: %v", trial, s)
		}
		n := historyCounts(t, c, trial)
		if n[enumspb.EVENT_TYPE_WORKFLOW_TASK_FAILED] != 0 {
			t.Fatalf("%s: %d workflow tasks failed", trial, n[enumspb.EVENT_TYPE_WORKFLOW_TASK_FAILED])
		}
	}
	t.Logf("terminated search: both waiting trials closed as cancelled %v after", time.Since(asked).Round(time.Millisecond))

	// 2. Cancelled while its trial trains.
	run, err = c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: "it-end-search-2", TaskQueue: queue + "-control"}, spec.WorkflowTune, search(1, 50))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	trials := []string{"it-end-search-2-trial-000", "it-end-search-2-trial-001"}
	for {
		// One trial has the slot (which one is a race); the other waits for it.
		a, b := progress(t, c, trials[0]), progress(t, c, trials[1])
		if (a != nil && a.Epoch >= 1) || (b != nil && b.Epoch >= 1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the trial did not train an epoch")
		}
		time.Sleep(50 * time.Millisecond)
	}
	asked = time.Now()
	if err := c.CancelWorkflow(context.Background(), run.GetID(), ""); err != nil {
		t.Fatal(err)
	}
	var canceled *temporal.CanceledError
	if err := run.Get(context.Background(), nil); !errors.As(err, &canceled) {
		t.Fatalf("got %v; want the search cancelled", err)
	}
	closed := time.Since(asked)
	for _, trial := range trials {
		if s := awaitClosed(t, c, trial, time.Second); s != enumspb.WORKFLOW_EXECUTION_STATUS_CANCELED {
			t.Fatalf("%s: %v", trial, s)
		}
	}
	if _, err := os.Stat(filepath.Join(ckpt, "it-end-search-2", "results.csv")); err != nil {
		t.Fatalf("no results of the cancelled search: %v", err)
	}
	next := subsetSpec(t, queue, 1, 1)
	p := awaitRun(t, startRun(t, c, "it-end-search-next", queue, next), 2*time.Minute)
	t.Logf("cancelled search: closed %v after the cancel, its trials first; the next run on the slot completed %v after",
		closed.Round(time.Millisecond), time.Since(asked).Round(time.Millisecond))
	if p.State != spec.StateCompleted {
		t.Fatalf("the next run: %+v", p)
	}
	recordHistory(t, c, "it-end-search-2", "tune-cancelled-while-training")
}

// TestLongWorkflowIDsTrain: a run whose workflow ID is as long as the server
// allows trains (the collective's handshake carries 255 bytes at most).
func TestLongWorkflowIDsTrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-long-id"
	startWorker(t, "li-ctl", "workflows", queue)
	startWorker(t, "li-a", "agent", queue)
	startWorker(t, "li-b", "agent", queue)
	c := dial(t)
	id := "it-long-id-" + strings.Repeat("x", 980)
	p := awaitRun(t, startRun(t, c, id, queue, subsetSpec(t, queue, 2, 1)), 2*time.Minute)
	if p.State != spec.StateCompleted || p.Failures != 0 {
		t.Fatalf("progress %+v", p)
	}
}
