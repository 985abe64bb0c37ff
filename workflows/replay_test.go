package workflows

import (
	"os"
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// recordedIDs are the workflow IDs the histories were recorded under, where
// the workflow's decisions depend on it (a search names its trials after it).
var recordedIDs = map[string]string{
	"tune-asha-every-worker-killed.json":    "it-tune-1",
	"tune-cancelled-while-training.json":    "it-end-search-2",
	"tune-pbt-every-worker-killed.json":     "it-pbt-1",
	"tune-pbt-time-shared.json":             "it-pbt-ts",
	"v6-tune-pbt-every-worker-killed.json":  "it-pbt-1",
	"v1-tune-asha-every-worker-killed.json": "it-tune-1",
	"v1-tune-cancelled-while-training.json": "it-end-search-2",
	"v2-tune-asha-every-worker-killed.json": "it-tune-1",
	"v2-tune-cancelled-while-training.json": "it-end-search-2",
	"v5-tune-asha-every-worker-killed.json": "it-tune-1",
	"v5-tune-cancelled-while-training.json": "it-end-search-2",
	"v5-tune-pbt-every-worker-killed.json":  "it-pbt-1",
}

// TestReplayRecordedHistories replays histories recorded from real runs on the
// embedded server (go test ./integration -args -record-histories): a change
// that makes TrainingWorkflow or TuneWorkflow non-deterministic, or
// incompatible with runs already in flight, fails here. Histories of older
// versions stay beside the current ones: a file prefixed "v0-" is from before
// the elastic-gangs version, "v1-" from before the rank-keys and
// run-ownership versions (a gang secret in a SideEffect, run names that
// several workflow IDs could share), "v2-" from before the host-holds,
// keep-gang, ask-again, tune-continue-as-new and release-by-host versions,
// "v3-" from before the reuse-holds and await-releases versions, "v4-" from
// before the hedge-holds version, "v5-" from before the own-signals and
// reset-trial-names versions, "v6-" from before the pbt-time-share version.
func TestReplayRecordedHistories(t *testing.T) {
	files, _ := filepath.Glob("testdata/histories/*.json")
	if len(files) == 0 {
		t.Fatal("no recorded histories in testdata/histories")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(TrainingWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTraining})
			r.RegisterWorkflowWithOptions(TuneWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTune})
			file, err := os.Open(f)
			if err != nil {
				t.Fatal(err)
			}
			defer file.Close()
			history, err := client.HistoryFromJSON(file, client.HistoryJSONOptions{})
			if err != nil {
				t.Fatal(err)
			}
			opts := worker.ReplayWorkflowHistoryOptions{}
			if id, ok := recordedIDs[filepath.Base(f)]; ok {
				opts.OriginalExecution = workflow.Execution{ID: id}
			}
			if err := r.ReplayWorkflowHistoryWithOptions(nil, history, opts); err != nil {
				t.Fatal(err)
			}
		})
	}
}
