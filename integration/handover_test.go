package integration

import (
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/devserver"
)

// TestGangCrossesContinueAsNew: on a server that suggests continue-as-new
// every few dozen events, a 2-rank run of the native trainer continues as
// new after most epochs, yet forms its gang once: each run takes the holds
// over from the run before (on the hosts' own queues), the ranks keep their
// warm replicas, so no checkpoint is restored, and the run trains the same
// numbers as the same run on a server that never suggests it.
func TestGangCrossesContinueAsNew(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and worker processes")
	}
	const epochs = 5
	often, err := devserver.Start(devserver.Options{Ephemeral: true, SuggestContinueAsNewAfter: 40})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(often.Stop)
	oc, err := connect.Options{Address: often.Addr(), Namespace: "default"}.Dial(zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(oc.Close)

	queue := "it-handover"
	var workers []*workerProc
	for _, name := range []string{"handover-a", "handover-b"} {
		flags := append(append([]string{}, testPolicy...), "-log-format", "json")
		workers = append(workers, startWorkerAt(t, often.Addr(), name, "both", queue, flags))
	}
	s := subsetSpec(t, queue, 2, epochs)
	s.Checkpoint.EveryEpochs = 2
	run := startRun(t, oc, "it-handover", queue, s)
	firstRunID := run.GetRunID()
	p := awaitRun(t, run, 3*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != epochs {
		t.Fatalf("progress %+v", p)
	}
	executions := 0
	for runID := firstRunID; runID != ""; executions++ {
		next := ""
		hist := oc.GetWorkflowHistory(t.Context(), "it-handover", runID, false, enumspb.HISTORY_EVENT_FILTER_TYPE_CLOSE_EVENT)
		for hist.HasNext() {
			e, err := hist.Next()
			if err != nil {
				t.Fatal(err)
			}
			next = e.GetWorkflowExecutionContinuedAsNewEventAttributes().GetNewExecutionRunId()
		}
		runID = next
	}
	if executions < 3 {
		t.Fatalf("the run made %d executions; want at least 3 (continue-as-new suggested at 40 events)", executions)
	}
	if p.Generation != 1 {
		t.Fatalf("the run formed %d gangs over %d executions; want 1, taken over at each continue-as-new", p.Generation, executions)
	}
	for _, w := range workers {
		logs := w.logs.String()
		if n := strings.Count(logs, `"msg":"slot held"`); n != 1 {
			t.Errorf("%s held a slot %d times; want once", w.name, n)
		}
		if n := strings.Count(logs, `"msg":"slot taken over from the run before"`); n != executions-1 {
			t.Errorf("%s handed its slot over %d times; want %d", w.name, n, executions-1)
		}
		if strings.Contains(logs, `"msg":"restored"`) {
			t.Errorf("%s restored a checkpoint; want the warm replicas kept", w.name)
		}
	}

	// The same run where continue-as-new never comes: the same numbers.
	for _, name := range []string{"handover-ref-a", "handover-ref-b"} {
		startWorker(t, name, "both", queue+"-ref")
	}
	ref := subsetSpec(t, queue+"-ref", 2, epochs)
	ref.Checkpoint.EveryEpochs = 2
	q := awaitRun(t, startRun(t, dial(t), "it-handover-ref", queue+"-ref", ref), 3*time.Minute)
	for e := range epochs {
		a, b := p.Metrics[e], q.Metrics[e]
		if a.TrainLoss != b.TrainLoss || a.TestLoss != b.TestLoss || a.TestAccuracy != b.TestAccuracy {
			t.Fatalf("epoch %d: across continue-as-new %+v, without %+v; want the same numbers", e, a, b)
		}
	}
	t.Logf("%d executions, 1 gang, no restore; test accuracy %.4f, as without continue-as-new", executions, p.Metrics[epochs-1].TestAccuracy)
}
