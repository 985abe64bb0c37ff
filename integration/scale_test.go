package integration

import (
	"encoding/json"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/simfleet"
)

// TestSimulatedFleetSmallRow is the scale benchmark's small row (bench
// scale has the big ones): 8 simulated hosts of 4 fake GPUs, each the real
// agent on its own host queue, train 32 ranks for 4 epochs. Temporal's cost
// grows with hosts: one HoldSlot per host, about 4 events per host and
// epoch besides workflow tasks, at most one workflow task per host and
// epoch, and no payload grows with the gang.
func TestSimulatedFleetSmallRow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a fleet")
	}
	const hosts, perHost, epochs = 8, 4, 4
	c := dial(t)
	queue := "it-fleet"
	fleet, err := simfleet.Start(c, simfleet.Options{Hosts: hosts, GPUsPerHost: perHost, TaskQueue: queue, EpochTime: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Stop)
	s := spec.Training{Trainer: simfleet.Backend, Dataset: spec.Dataset{URL: "mem://"}, Hyper: spec.Hyper{Epochs: epochs},
		Scaling:    spec.Scaling{Workers: hosts * perHost, WorkersPerHost: perHost, TaskQueue: queue, GangTimeout: spec.Duration(time.Minute)},
		Checkpoint: spec.Checkpoint{URL: "mem://", EveryEpochs: 2},
		// 32 ranks in this process beside the server, on a machine that runs
		// other packages' tests: a ring link may go unread for longer than
		// the default 2 s, and a broken gang would fail the test's count.
		Failure: spec.Failure{StallTimeout: spec.Duration(5 * time.Second)}}
	input, _ := json.Marshal(s)
	startWorker(t, "fleet-control", "workflows", queue) // the workflows, in a real worker process
	run, err := c.ExecuteWorkflow(t.Context(), client.StartWorkflowOptions{ID: "it-fleet-1", TaskQueue: queue + "-control"}, spec.WorkflowTraining, json.RawMessage(input))
	if err != nil {
		t.Fatal(err)
	}
	firstRunID := run.GetRunID() // Get follows continue-as-new
	p := awaitRun(t, run, 3*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != epochs || p.Generation != 1 {
		t.Fatalf("progress %+v", p)
	}
	rep, err := simfleet.Measure(t.Context(), c, run.GetID(), firstRunID)
	if err != nil {
		t.Fatal(err)
	}
	limit, used := rep.Binding()
	t.Logf("%d ranks on %d hosts: gang formed in %.2f s, Temporal overhead %.3f s/epoch (p50), %.1f events/epoch, largest payload %d B, peak pending %d, closest limit %s (%.1f%%)",
		hosts*perHost, hosts, simfleet.Quantile(rep.GangSeconds, 1), simfleet.Quantile(rep.OverheadSeconds, 0.5), rep.EventsPerEpoch(), rep.MaxPayloadBytes, rep.PeakPending, limit, 100*used)
	t.Logf("events from the first epoch on, by type: %v", rep.EpochEventTypes)
	if got := fleet.Epochs.Load(); got != hosts*perHost*epochs {
		t.Fatalf("the fake trainers trained %d rank-epochs; want %d", got, hosts*perHost*epochs)
	}
	// Per epoch: scheduled, started, completed per host's RunEpoch, and the
	// holds' cancellation at the end spread over the epochs. Workflow tasks
	// are counted apart: how many completions the server batches into one
	// depends on timing (a busy machine batches fewer), but each is woken by
	// at least one completion, so there are at most one per host and epoch
	// and a few more (the start, the timer, the end).
	tasks := rep.EpochEventTypes["WorkflowTaskScheduled"] + rep.EpochEventTypes["WorkflowTaskStarted"] + rep.EpochEventTypes["WorkflowTaskCompleted"]
	if max := 4*hosts + 16; float64(rep.EpochEvents-tasks)/epochs > float64(max) {
		t.Errorf("%.1f events per epoch besides workflow tasks; want at most 4 × hosts + 16 = %d", float64(rep.EpochEvents-tasks)/epochs, max)
	}
	if max := hosts + 4; rep.EpochEventTypes["WorkflowTaskStarted"] > max*epochs {
		t.Errorf("%d workflow tasks in %d epochs; want at most hosts + 4 = %d per epoch", rep.EpochEventTypes["WorkflowTaskStarted"], epochs, max)
	}
	if rep.PeakPending > 2*hosts+1 {
		t.Errorf("%d activities pending at once; want at most 2 per host and one more", rep.PeakPending)
	}
	if rep.MaxPayloadBytes > 4<<10 {
		t.Errorf("the largest payload is %d bytes; want under 4 KiB at this size", rep.MaxPayloadBytes)
	}
}
