package integration

import (
	"context"
	"regexp"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"

	"github.com/durabletrain/durabletrain/spec"
)

// TestAHoldTakenByAStoppedWorkerIsHedged: a SIGSTOPped agent's open long
// poll takes the run's hold, and Temporal records it as started. The gang
// asks which of its holds started but did not grant, asks once for another
// host, and trains on the agent that grants it, before the swallowed hold's
// heartbeat times out (the test reads the history to see that order).
func TestAHoldTakenByAStoppedWorkerIsHedged(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-hedge"
	startWorker(t, "ctl", "workflows", queue)
	stopped := startWorkerWith(t, "agent-stopped", "agent", queue, append(append([]string{}, testPolicy...), "-metrics-listen", "127.0.0.1:0"))
	addr := waitLine(t, stopped, regexp.MustCompile(`serving /metrics.*"address":"([0-9.:]+)"`), 30*time.Second)[1]
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if code, _ := get(t, "http://"+addr+"/readyz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the agent never became ready")
		}
	}
	time.Sleep(time.Second) // its pollers are open
	if err := stopped.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopped.cmd.Process.Signal(syscall.SIGCONT) })

	c := dial(t)
	s := subsetSpec(t, queue, 1, 1)
	s.Failure.HeartbeatTimeout = spec.Duration(8 * time.Second) // hedged after 2 s
	run := startRun(t, c, "it-hedge-1", queue, s)
	time.Sleep(500 * time.Millisecond) // the hold goes to the only open poll: the stopped agent's
	startWorker(t, "agent-live", "agent", queue)
	p := awaitRun(t, run, 2*time.Minute)
	if p.State != spec.StateCompleted || p.Generation != 1 {
		t.Fatalf("progress %+v; want completed with the first gang", p)
	}

	// Read the history: which holds there were, who started them, and when
	// the gang's epoch began against the swallowed hold's timeout.
	it := c.GetWorkflowHistory(context.Background(), "it-hedge-1", "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	scheduled := map[int64]string{} // event ID -> activity ID
	var events []*historypb.HistoryEvent
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, e)
		if a := e.GetActivityTaskScheduledEventAttributes(); a != nil {
			scheduled[e.GetEventId()] = a.GetActivityId()
		}
	}
	startedBy := map[string]string{} // activity ID -> worker identity
	firstEpoch, swallowedTimeout := -1, -1
	var holds []string
	for i, e := range events {
		if a := e.GetActivityTaskScheduledEventAttributes(); a != nil {
			switch a.GetActivityType().GetName() {
			case spec.ActivityHoldSlot:
				holds = append(holds, a.GetActivityId())
			case spec.ActivityRunEpoch:
				if firstEpoch < 0 {
					firstEpoch = i
				}
			}
		}
		if a := e.GetActivityTaskStartedEventAttributes(); a != nil {
			startedBy[scheduled[a.GetScheduledEventId()]] = a.GetIdentity()
		}
		if a := e.GetActivityTaskTimedOutEventAttributes(); a != nil && scheduled[a.GetScheduledEventId()] == "hold-1-0-0" && swallowedTimeout < 0 {
			swallowedTimeout = i
		}
	}
	t.Logf("holds %v, started by %v", holds, startedBy)
	if len(holds) != 2 || holds[0] != "hold-1-0-0" || holds[1] != "hold-1-1-0" {
		t.Fatalf("holds asked %v; want the first and one hedge, [hold-1-0-0 hold-1-1-0]", holds)
	}
	// Temporal writes an activity's started event only when the attempt
	// ends. The swallowed hold ends only by its heartbeat timeout: on a
	// quick machine the run completes first and the hold has no started
	// event; on a slow one the timeout can come just before the run closes,
	// and then the hold is written as started by the stopped agent and timed
	// out. Either way the run hedged because the server called it started,
	// and no live agent ever took it.
	if startedBy["hold-1-1-0"] != "agent-live" {
		t.Fatalf("holds started by %v; want hold-1-1-0 by agent-live", startedBy)
	}
	switch by := startedBy["hold-1-0-0"]; {
	case by == "":
	case by == "agent-stopped" && swallowedTimeout >= 0:
		t.Logf("the swallowed hold timed out (event %d) before the run closed", swallowedTimeout)
	default:
		t.Fatalf("hold-1-0-0 started by %q, timed out at event %d; want it never ended, or started by agent-stopped and timed out", by, swallowedTimeout)
	}
	if firstEpoch < 0 || swallowedTimeout >= 0 && swallowedTimeout < firstEpoch {
		t.Fatalf("the first epoch at event %d, the swallowed hold's timeout at %d; want the epoch first", firstEpoch, swallowedTimeout)
	}
	recordHistory(t, c, "it-hedge-1", "hold-hedged")
}
