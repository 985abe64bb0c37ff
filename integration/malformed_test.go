package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	commonpb "go.temporal.io/api/common/v1"
	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/speccorpus"
)

// TestMalformedInputIsRefusedAtOnce submits every malformed spec and search
// of the corpus three ways: through the starter (which refuses it before it
// dials anything), straight to the workflow with the Go client (the bytes as
// given, valid JSON or not), and with the Temporal CLI. Each is refused on
// the workflow's first task with the field named: the run fails as a user
// error, schedules no activity, fails no workflow task (nothing is retried),
// and the workflow worker's memory stays flat.
func TestMalformedInputIsRefusedAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the server")
	}
	queue := "it-malformed"
	ctl := startWorker(t, "malformed-ctl", "workflows", queue)
	c := dial(t)
	starter := buildStarter(t)
	cli := ""
	if p, err := filepath.Abs("../bin/temporal"); err == nil {
		if _, err := os.Stat(p); err == nil {
			cli = p
		}
	}
	// Warm the worker up with one refusal, then measure.
	refusedByWorkflow(t, c, queue, spec.WorkflowTraining, "it-malformed-warm", speccorpus.Training()[0])
	before := rss(t, ctl)
	var slowest time.Duration
	kinds := []struct {
		kind, workflow string
		cases          []speccorpus.Case
	}{{"train", spec.WorkflowTraining, speccorpus.Training()}, {"tune", spec.WorkflowTune, speccorpus.Tune()}}
	for _, k := range kinds {
		for i, cs := range k.cases {
			id := fmt.Sprintf("it-malformed-%s-%02d", k.kind, i)
			took := refusedByWorkflow(t, c, queue, k.workflow, id, cs)
			slowest = max(slowest, took)
			refusedByStarter(t, starter, k.kind, cs)
			if cli != "" && json.Valid([]byte(cs.Input)) && len(cs.Input) < 1<<20 && i%4 == 0 {
				refusedByCLI(t, cli, queue, k.workflow, id+"-cli", cs)
			}
		}
	}
	after := rss(t, ctl)
	t.Logf("%d specs and %d searches refused; slowest from start to failure %v; workflow worker RSS %d MiB before, %d MiB after",
		len(kinds[0].cases), len(kinds[1].cases), slowest.Round(time.Millisecond), before>>20, after>>20)
	if after > before+64<<20 {
		t.Fatalf("the workflow worker grew from %d to %d MiB refusing malformed input", before>>20, after>>20)
	}
}

// refusedByWorkflow starts the workflow with the input's bytes as they are
// and checks how it ends; it returns the time from start to failure.
func refusedByWorkflow(t *testing.T, c client.Client, queue, workflow, id string, cs speccorpus.Case) time.Duration {
	t.Helper()
	payload := converter.NewRawValue(&commonpb.Payload{Metadata: map[string][]byte{"encoding": []byte("json/plain")}, Data: []byte(cs.Input)})
	start := time.Now()
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: id, TaskQueue: queue + "-control"}, workflow, payload)
	if err != nil {
		// The server's own limits (2 MiB payloads) refuse it before any worker sees it.
		t.Logf("%s: the server refused the start: %.200v", cs.Name, err)
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = run.Get(ctx, nil)
	took := time.Since(start)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != spec.ErrUser || !app.NonRetryable() || !strings.Contains(app.Message(), cs.Want) {
		t.Errorf("%s (%s): got %.300v; want a non-retryable user error containing %q", cs.Name, id, err, cs.Want)
		return took
	}
	if msg := app.Message(); len(msg) > 400 || strings.ContainsAny(msg, "\r\n") {
		t.Errorf("%s: a %d-byte message", cs.Name, len(msg))
	}
	it := c.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch e.EventType {
		case enumspb.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, enumspb.EVENT_TYPE_WORKFLOW_TASK_FAILED, enumspb.EVENT_TYPE_TIMER_STARTED,
			enumspb.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
			t.Errorf("%s: the refused run's history has %s", cs.Name, e.EventType)
		}
	}
	return took
}

// refusedByStarter runs the starter on the input as a spec file, against an
// address nothing listens on: a refusal must come before any dialling.
func refusedByStarter(t *testing.T, starter, kind string, cs speccorpus.Case) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "spec.json")
	os.WriteFile(f, []byte(cs.Input), 0o644)
	cmd := exec.Command(starter, kind, "-f", f, "-address", "127.0.0.1:1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), cs.Want) {
		t.Errorf("starter %s %s: %v\n%.400s\nwant exit status 2 and %q", kind, cs.Name, err, stderr.String(), cs.Want)
	}
	if n := len(stderr.String()); n > 1200 {
		t.Errorf("starter %s %s: %d bytes of error", kind, cs.Name, n)
	}
}

// refusedByCLI starts the workflow with the Temporal CLI and checks the run failed naming the field.
func refusedByCLI(t *testing.T, cli, queue, workflow, id string, cs speccorpus.Case) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "input.json")
	os.WriteFile(f, []byte(cs.Input), 0o644)
	out, err := exec.Command(cli, "workflow", "execute", "--type", workflow, "--task-queue", queue+"-control", "--workflow-id", id,
		"--input-file", f, "--address", server.Addr(), "--namespace", "default").CombinedOutput()
	if err == nil || !strings.Contains(string(out), cs.Want) {
		t.Errorf("temporal workflow execute %s: %v\n%.600s\nwant the run failed with %q", cs.Name, err, out, cs.Want)
	}
}

func buildStarter(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "starter")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/starter").CombinedOutput(); err != nil {
		t.Fatalf("building cmd/starter: %v\n%s", err, out)
	}
	return bin
}

// rss is a process's resident memory in bytes.
func rss(t *testing.T, w *workerProc) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}
