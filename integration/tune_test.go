package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// TestTuneSearchSurvivesLosingEveryWorker: 8 trials over learning rate and
// hidden width on the Fashion-MNIST subset with ASHA, two at a time. Mid-way
// every worker process is killed with SIGKILL and new ones started: the
// search goes on, no trial is lost or run twice, at least half the trials are
// stopped early, and the best trial's accuracy is reported.
func TestTuneSearchSurvivesLosingEveryWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-tune"
	first := []*workerProc{startWorker(t, "ctl-1", "workflows", queue), startWorker(t, "agent-1", "agent", queue), startWorker(t, "agent-2", "agent", queue)}
	c := dial(t)
	ckpt := t.TempDir()
	search := map[string]any{
		"name": "it-tune-1",
		"train": map[string]any{
			"dataset":    map[string]any{"url": testdata.FashionMNISTSmall()},
			"hyper":      map[string]any{"epochs": 6},
			"scaling":    map[string]any{"workers": 1, "task_queue": queue},
			"checkpoint": map[string]any{"url": bloburl.FromPath(ckpt) + "?metadata=skip"},
			"failure":    map[string]any{"heartbeat_timeout": "3s"},
		},
		"param_space": map[string]any{
			"hyper.lr":     map[string]any{"loguniform": []float64{1e-4, 3e-2}},
			"model.hidden": map[string]any{"grid_search": [][]int{{32}, {256, 128}}},
		},
		"num_samples": 4, "metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2, "seed": 3,
		"scheduler": map[string]any{"type": "asha", "grace_period": 1, "reduction_factor": 2, "max_t": 6},
	}
	raw, _ := json.Marshal(search)
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: "it-tune-1", TaskQueue: queue + "-control"}, spec.WorkflowTune, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	// Once three trials have ended, kill every worker process.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var r *spec.TuneResults
		if v, err := c.QueryWorkflow(context.Background(), "it-tune-1", "", spec.QueryResults); err == nil && v.Get(&r) == nil {
			ended := 0
			for _, tr := range r.Trials {
				if tr.Status != spec.TrialPending && tr.Status != spec.TrialRunning && tr.Status != spec.TrialStopping {
					ended++
				}
			}
			if ended >= 3 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("three trials never ended")
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, w := range first {
		w.cmd.Process.Signal(syscall.SIGKILL)
		w.cmd.Wait()
	}
	t.Log("killed every worker process mid-search; starting new ones")
	startWorker(t, "ctl-2", "workflows", queue)
	startWorker(t, "agent-3", "agent", queue)
	startWorker(t, "agent-4", "agent", queue)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var res spec.TuneResults
	if err := run.Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	early := 0
	for _, tr := range res.Trials {
		cfg, _ := json.Marshal(tr.Config)
		t.Logf("trial %d %-13s %s epochs %d last %.4f %s", tr.Trial, tr.Status, cfg, tr.Epochs, deref(tr.Last), tr.Reason)
		if tr.Status == spec.TrialEarlyStop {
			early++
		}
		if tr.Status == spec.TrialFailed || tr.Status == spec.TrialPending {
			t.Errorf("trial %d %s: %s", tr.Trial, tr.Status, tr.Reason)
		}
		// One execution per trial: none lost, none run twice.
		resp, err := c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: "default",
			Query: fmt.Sprintf("WorkflowId = '%s'", tr.WorkflowID)})
		if err != nil || len(resp.Executions) != 1 {
			t.Errorf("trial %d (%s): %d executions, %v", tr.Trial, tr.WorkflowID, len(resp.GetExecutions()), err)
		}
	}
	if len(res.Trials) != 8 || res.Best < 0 {
		t.Fatalf("results %+v", res)
	}
	recordHistory(t, c, "it-tune-1", "tune-asha-every-worker-killed")
	best := res.Trials[res.Best]
	t.Logf("best: trial %d, test accuracy %.4f, checkpoint %+v; %d of 8 stopped early", best.Trial, deref(best.Last), best.Checkpoint, early)
	if early < 4 {
		t.Fatalf("%d of 8 trials stopped early; want at least half", early)
	}
	if deref(best.Last) < 0.8 || best.Checkpoint == nil {
		t.Fatalf("best trial %+v", best)
	}
	csv, err := os.ReadFile(filepath.Join(ckpt, "it-tune-1", "results.csv"))
	if err != nil || strings.Count(string(csv), "\n") != 9 {
		t.Fatalf("results.csv (%v):\n%s", err, csv)
	}
}

func deref(v *float64) float64 {
	if v == nil {
		return -1
	}
	return *v
}

// TestPBTSurvivesLosingEveryWorkerMidExploit: a PBT search of 4 trials
// that exploit every epoch, on real worker processes. While a trial is
// exploiting (stopped, its donor's checkpoint being cloned) every worker
// process is killed with SIGKILL and new ones start: the search goes on,
// every trial completes its epochs, every segment ran once, and every
// clone it made is a whole, verified checkpoint.
func TestPBTSurvivesLosingEveryWorkerMidExploit(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-pbt"
	var first []*workerProc
	first = append(first, startWorker(t, "ctl-1", "workflows", queue))
	for i := range 4 {
		first = append(first, startWorker(t, fmt.Sprintf("agent-%d", i+1), "agent", queue))
	}
	c := dial(t)
	ckpt := t.TempDir()
	search := map[string]any{
		"name": "it-pbt-1",
		"train": map[string]any{
			"dataset":    map[string]any{"url": testdata.FashionMNISTSmall()},
			"hyper":      map[string]any{"epochs": 6},
			"scaling":    map[string]any{"workers": 1, "task_queue": queue},
			"checkpoint": map[string]any{"url": bloburl.FromPath(ckpt) + "?metadata=skip"},
			"failure":    map[string]any{"heartbeat_timeout": "3s"},
		},
		"param_space": map[string]any{"config.lr": map[string]any{"loguniform": []float64{1e-5, 3e-2}}},
		"num_samples": 4, "metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 4, "seed": 2,
		"scheduler": map[string]any{"type": "pbt", "perturbation_interval": 1},
	}
	raw, _ := json.Marshal(search)
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: "it-pbt-1", TaskQueue: queue + "-control"}, spec.WorkflowTune, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for caught := false; !caught; {
		var r *spec.TuneResults
		if v, err := c.QueryWorkflow(context.Background(), "it-pbt-1", "", spec.QueryResults); err == nil && v.Get(&r) == nil {
			for _, tr := range r.Trials {
				if tr.Status == spec.TrialExploiting {
					t.Logf("trial %d is exploiting at epoch %d: killing every worker process", tr.Trial, tr.Epochs)
					caught = true
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no trial ever exploited")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, w := range first {
		w.cmd.Process.Signal(syscall.SIGKILL)
		w.cmd.Wait()
	}
	startWorker(t, "ctl-2", "workflows", queue)
	for i := range 4 {
		startWorker(t, fmt.Sprintf("agent-%d", i+5), "agent", queue)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var res spec.TuneResults
	if err := run.Get(ctx, &res); err != nil {
		if v, qerr := c.QueryWorkflow(context.Background(), "it-pbt-1", "", spec.QueryResults); qerr == nil && v.Get(&res) == nil {
			for _, tr := range res.Trials {
				t.Logf("trial %d %s epochs %d segment %d lineage %+v", tr.Trial, tr.Status, tr.Epochs, tr.Segment, tr.Lineage)
			}
		}
		t.Fatal(err)
	}
	exploits := 0
	for _, tr := range res.Trials {
		t.Logf("trial %d %s epochs %d last %.4f segments %d config %s", tr.Trial, tr.Status, tr.Epochs, deref(tr.Last), tr.Segment, spec.Config(tr.Config).JSON())
		if tr.Status != spec.TrialCompleted || tr.Epochs != 6 {
			t.Errorf("trial %d: %s after %d epochs: %s", tr.Trial, tr.Status, tr.Epochs, tr.Reason)
		}
		for k, e := range tr.Lineage {
			t.Logf("  epoch %d: took trial %d's %s, changed %s %s", e.Epoch, e.From, e.Cloned, spec.Config(e.Changed).JSON(), e.Reason)
			if e.Cloned != "" {
				exploits++
			}
			id := fmt.Sprintf("%s-p%d", tr.WorkflowID, k+1)
			resp, err := c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: "default", Query: fmt.Sprintf("WorkflowId = '%s'", id)})
			if err != nil || len(resp.Executions) != 1 {
				t.Errorf("segment %s: %d executions, %v", id, len(resp.GetExecutions()), err)
			}
		}
	}
	if exploits == 0 {
		t.Fatal("no exploit cloned a checkpoint")
	}
	// Every clone the search made is whole: each checkpoint under a clone run verifies.
	store, err := checkpoint.Open(ctx, bloburl.FromPath(ckpt)+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	entries, _ := os.ReadDir(ckpt)
	clones := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "-clone") {
			continue
		}
		ids, err := store.IDs(ctx, e.Name())
		if err != nil || len(ids) != 1 {
			t.Errorf("clone run %s: checkpoints %v, %v; want one", e.Name(), ids, err)
			continue
		}
		if _, err := store.Verify(ctx, e.Name(), ids[0]); err != nil {
			t.Errorf("clone %s/%s does not verify: %v", e.Name(), ids[0], err)
		}
		clones++
	}
	if clones < exploits {
		t.Fatalf("%d clone runs for %d exploits", clones, exploits)
	}
	recordHistory(t, c, "it-pbt-1", "tune-pbt-every-worker-killed")
	t.Logf("%d exploits, %d verified clones; best trial %d (%.4f)", exploits, clones, res.Best, deref(res.BestTrial.Last))
}

// TestPBTTimeSharesItsSlots: a population of 4 on 2 slots, perturbed every
// epoch, on real training. The population moves together, as Ray's PBT
// runs one: a trial at a perturbation point pauses (it stops with its
// checkpoint) and gives its slot to the trial that has trained least, so
// every trial has started before any resumes a second time; never more than
// 2 train at once; every trial trains all its epochs, and each segment
// resumes where its trial stopped or from the clone it exploited.
func TestPBTTimeSharesItsSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-pbt-ts"
	startWorker(t, "ctl-1", "workflows", queue)
	for i := range 2 {
		startWorker(t, fmt.Sprintf("agent-%d", i+1), "agent", queue)
	}
	c := dial(t)
	ckpt := t.TempDir()
	search := map[string]any{
		"name": "it-pbt-ts",
		"train": map[string]any{
			"dataset":    map[string]any{"url": testdata.FashionMNISTSmall()},
			"hyper":      map[string]any{"epochs": 4},
			"scaling":    map[string]any{"workers": 1, "task_queue": queue},
			"checkpoint": map[string]any{"url": bloburl.FromPath(ckpt) + "?metadata=skip"},
		},
		"param_space": map[string]any{"config.lr": map[string]any{"loguniform": []float64{1e-5, 3e-2}}},
		"num_samples": 4, "metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2, "seed": 3,
		"scheduler": map[string]any{"type": "pbt", "perturbation_interval": 1},
	}
	raw, _ := json.Marshal(search)
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: "it-pbt-ts", TaskQueue: queue + "-control"}, spec.WorkflowTune, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var res spec.TuneResults
	if err := run.Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	type span struct {
		id         string
		start, end time.Time
	}
	var spans []span
	var firstsStarted, secondResumed time.Time
	for _, tr := range res.Trials {
		t.Logf("trial %d %s epochs %d last %.4f segments %d lineage %d", tr.Trial, tr.Status, tr.Epochs, deref(tr.Last), tr.Segment, len(tr.Lineage))
		if tr.Status != spec.TrialCompleted || tr.Epochs != 4 || tr.Segment == 0 {
			t.Errorf("trial %d: %s after %d epochs and %d segments: %s", tr.Trial, tr.Status, tr.Epochs, tr.Segment, tr.Reason)
		}
		for k := 0; k <= tr.Segment; k++ {
			id := tr.WorkflowID
			if k > 0 {
				id = fmt.Sprintf("%s-p%d", id, k)
			}
			d, err := c.DescribeWorkflowExecution(ctx, id, "")
			if err != nil {
				t.Fatalf("segment %s: %v", id, err)
			}
			s := span{id, d.WorkflowExecutionInfo.StartTime.AsTime(), d.WorkflowExecutionInfo.CloseTime.AsTime()}
			spans = append(spans, s)
			if k == 0 && s.start.After(firstsStarted) {
				firstsStarted = s.start
			}
			if k == 2 && (secondResumed.IsZero() || s.start.Before(secondResumed)) {
				secondResumed = s.start
			}
		}
	}
	for _, a := range spans {
		at := 0
		for _, b := range spans {
			if !b.start.After(a.start) && b.end.After(a.start) {
				at++
			}
		}
		if at > 2 {
			t.Fatalf("%d trials trained at once when %s started, on 2 slots", at, a.id)
		}
	}
	if !secondResumed.IsZero() && secondResumed.Before(firstsStarted) {
		t.Fatalf("a trial resumed a second time at %v, before every trial had started (the last at %v)", secondResumed, firstsStarted)
	}
	recordHistory(t, c, "it-pbt-ts", "tune-pbt-time-shared")
	t.Logf("%d segments on 2 slots; best trial %d (%.4f)", len(spans), res.Best, deref(res.BestTrial.Last))
}
