package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// TestSearchSurvivesEveryProcessKilled: a 4-trial ASHA search on the hosts
// of the chaos harness. Once a trial has ended, every process is killed with
// SIGKILL, the Temporal server included, and all are started again (the
// server on its SQLite file): the search completes, with every trial run
// exactly once.
func TestSearchSurvivesEveryProcessKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and worker processes in network namespaces")
	}
	if err := Available(); err != nil {
		t.Skipf("no network namespaces here (%v): skipping", err)
	}
	dir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"devserver", "host-0", "host-1"} {
				b, _ := os.ReadFile(filepath.Join(dir, "logs", name+".log"))
				if len(b) > 3000 {
					b = b[len(b)-3000:]
				}
				t.Logf("%s log:\n%s", name, b)
			}
		}
	})
	bin := filepath.Join(dir, "bin")
	if err := Build(bin, "", io.Discard); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := start(ctx, Config{Hosts: 2, Bin: bin, Dir: dir, Dataset: testdata.FashionMNISTSmall()}.withDefaults(), hostNet{bridge: "dtcbr1", prefix: "10.231.8"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.close()

	search, _ := json.Marshal(map[string]any{
		"name": "chaos-search",
		"train": map[string]any{
			"dataset":    map[string]any{"url": h.cfg.Dataset},
			"hyper":      map[string]any{"epochs": 5},
			"scaling":    map[string]any{"workers": 1, "task_queue": "chaos-gpu"},
			"checkpoint": map[string]any{"url": bloburl.FromPath(h.ckptDir) + "?metadata=skip"},
			"failure":    map[string]any{"heartbeat_timeout": "4s", "max_failures": 10},
		},
		"param_space":           map[string]any{"hyper.lr": map[string]any{"grid_search": []float64{0.01, 0.0003, 0.002, 0.0001}}},
		"max_concurrent_trials": 2,
		"scheduler":             map[string]any{"type": "asha", "grace_period": 1, "reduction_factor": 2, "max_t": 5},
	})
	if _, err := h.client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "chaos-search", TaskQueue: "chaos"}, spec.WorkflowTune, json.RawMessage(search)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(90 * time.Second)
	for ended := 0; ended < 1; {
		if time.Now().After(deadline) {
			t.Fatal("no trial ended")
		}
		time.Sleep(100 * time.Millisecond)
		if r := h.results(ctx); r != nil {
			ended = 0
			for _, tr := range r.Trials {
				if tr.Status == spec.TrialCompleted || tr.Status == spec.TrialEarlyStop {
					ended++
				}
			}
		}
	}
	// Every process, at once, and nothing restarts for a moment.
	procs := append([]*proc{h.server}, h.hosts...)
	for _, p := range procs {
		p.setStopping(true)
		if exited, err := p.signal(syscall.SIGKILL); err == nil {
			<-exited
		}
	}
	t.Log("killed the Temporal server and every worker; starting them again")
	time.Sleep(2 * time.Second)
	for _, p := range procs {
		p.setStopping(false)
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
	}
	h.client.Close()
	if h.client, err = h.dial(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	var res spec.TuneResults
	if err := h.client.GetWorkflow(wctx, "chaos-search", "").Get(wctx, &res); err != nil {
		t.Fatal(err)
	}
	for _, tr := range res.Trials {
		t.Logf("trial %d %s epochs %d: %s", tr.Trial, tr.Status, tr.Epochs, tr.Reason)
		if tr.Status != spec.TrialCompleted && tr.Status != spec.TrialEarlyStop {
			t.Errorf("trial %d ended %s", tr.Trial, tr.Status)
		}
		resp, err := h.client.ListWorkflow(ctx, &workflowservice.ListWorkflowExecutionsRequest{Namespace: "default",
			Query: fmt.Sprintf("WorkflowId = '%s'", tr.WorkflowID)})
		if err != nil || len(resp.Executions) != 1 {
			t.Errorf("trial %d: %d executions (%v); want exactly one", tr.Trial, len(resp.GetExecutions()), err)
		}
	}
	if len(res.Trials) != 4 || res.Best < 0 {
		t.Fatalf("results %+v", res)
	}
}

func (h *Harness) results(ctx context.Context) *spec.TuneResults {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := h.client.QueryWorkflow(qctx, "chaos-search", "", spec.QueryResults)
	if err != nil {
		return nil
	}
	var r spec.TuneResults
	if v.Get(&r) != nil {
		return nil
	}
	return &r
}
