package integration

import (
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// TestHostsOfSeveralRanks: two worker processes with two slots each serve a
// 4-rank run as two hosts of two ranks (scaling.workers_per_host), each host
// one HoldSlot and one RunEpoch per epoch with its ranks in-process; the run
// trains bit-identically to the same run with one rank per hold.
func TestHostsOfSeveralRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-hosts"
	for _, name := range []string{"host-a", "host-b"} {
		startWorkerWith(t, name, "both", queue, append(append([]string{}, testPolicy...), "-slots", "2"))
	}
	c := dial(t)
	runs := map[int]*spec.Progress{}
	for _, perHost := range []int{2, 1} {
		s := subsetSpec(t, queue, 4, 3)
		s.Hyper.BatchSize = 32
		s.Scaling.WorkersPerHost = perHost
		id := "it-hosts-" + map[int]string{1: "one", 2: "two"}[perHost]
		p := awaitRun(t, startRun(t, c, id, queue, s), 2*time.Minute)
		if p.State != spec.StateCompleted || p.Epoch != 3 || p.Generation != 1 {
			t.Fatalf("%d ranks per host: progress %+v", perHost, p)
		}
		hist := c.GetWorkflowHistory(t.Context(), id, "", false, 0)
		holds, epochs := 0, 0
		for hist.HasNext() {
			e, err := hist.Next()
			if err != nil {
				t.Fatal(err)
			}
			if a := e.GetActivityTaskScheduledEventAttributes(); a != nil {
				switch a.GetActivityType().GetName() {
				case spec.ActivityHoldSlot:
					holds++
				case spec.ActivityRunEpoch:
					epochs++
				}
			}
		}
		// A hold may be asked for again once: a worker's second poller can
		// take it while the first hold fills the worker (TestPollGate...).
		if hosts := 4 / perHost; holds < hosts || holds > 2*hosts || epochs != 3*hosts {
			t.Fatalf("%d ranks per host: %d HoldSlot and %d RunEpoch activities; want %d to %d and %d", perHost, holds, epochs, hosts, 2*hosts, 3*hosts)
		}
		t.Logf("%d ranks per host: %d HoldSlot activities for %d hosts, %d RunEpoch", perHost, holds, 4/perHost, epochs)
		runs[perHost] = p
	}
	for e := range 3 {
		a, b := runs[2].Metrics[e], runs[1].Metrics[e]
		if a.TrainLoss != b.TrainLoss || a.TestAccuracy != b.TestAccuracy || a.TestLoss != b.TestLoss {
			t.Fatalf("epoch %d: hosts of 2 ranks %+v, hosts of 1 %+v; want the same numbers", e, a, b)
		}
	}
	t.Logf("4 ranks as 2 hosts of 2 and as 4 of 1: test accuracy %.4f both", runs[2].Metrics[2].TestAccuracy)
}
