package integration

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// temporalCLI is the Temporal CLI v1.5.1 that `make temporal-cli` installs
// into bin/, or $TEMPORAL_CLI.
func temporalCLI(t *testing.T) string {
	if p := os.Getenv("TEMPORAL_CLI"); p != "" {
		return p
	}
	p, _ := filepath.Abs("../bin/temporal")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("no Temporal CLI at %s (make temporal-cli installs v1.5.1; or set TEMPORAL_CLI): skipping", p)
	}
	return p
}

// TestTemporalCLIDrivesARun: a user with only the Temporal CLI starts a run
// with its JSON spec, watches it with the progress query, and stops it with
// the stop update, which answers with the final checkpoint.
func TestTemporalCLIDrivesARun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	cli := temporalCLI(t)
	queue := "it-cli"
	startWorker(t, "worker-a", "both", queue)
	startWorker(t, "worker-b", "agent", queue)
	temporal := func(args ...string) []byte {
		t.Helper()
		cmd := exec.Command(cli, append(args, "--address", server.Addr(), "--namespace", "default")...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("temporal %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	s := subsetSpec(t, queue, 2, 50)
	input, _ := json.Marshal(s)
	temporal("workflow", "start", "--type", spec.WorkflowTraining, "--task-queue", queue+"-control",
		"--workflow-id", "it-cli-1", "--input", string(input))

	// Watch it with the progress query until two epochs are done.
	var p spec.Progress
	deadline := time.Now().Add(2 * time.Minute)
	for p.Epoch < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the run did not reach epoch 2: %+v", p)
		}
		var answer struct {
			QueryResult []spec.Progress `json:"queryResult"`
		}
		out := temporal("workflow", "query", "--workflow-id", "it-cli-1", "--name", spec.QueryProgress, "--output", "json")
		if err := json.Unmarshal(out, &answer); err != nil || len(answer.QueryResult) != 1 {
			t.Fatalf("temporal workflow query: %v\n%s", err, out)
		}
		p = answer.QueryResult[0]
		time.Sleep(200 * time.Millisecond)
	}
	if p.State != spec.StateTraining || len(p.Gang) != 2 || len(p.Metrics) < 2 {
		t.Fatalf("progress through the CLI: %+v", p)
	}

	out := temporal("workflow", "update", "execute", "--workflow-id", "it-cli-1", "--name", spec.UpdateStop, "--output", "json")
	var answer struct {
		Result spec.StopResult `json:"result"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		t.Fatalf("temporal workflow update execute: %v\n%s", err, out)
	}
	r := answer.Result
	t.Logf("stopped through the CLI: %+v, checkpoint %+v", r, r.Latest)
	if r.State != spec.StateStopped || r.Epoch < 2 || r.Epoch >= 50 || r.Latest == nil || r.Latest.Epoch != r.Epoch {
		t.Fatalf("stop update answered %s", out)
	}
	desc := temporal("workflow", "describe", "--workflow-id", "it-cli-1", "--output", "json")
	if !strings.Contains(string(desc), "WORKFLOW_EXECUTION_STATUS_COMPLETED") {
		t.Fatalf("after the stop update the run is not completed:\n%s", desc)
	}
}
