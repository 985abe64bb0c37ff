package integration

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// TestHostsOfSeveralRanks: two worker processes with two slots each serve a
// 4-rank run as two hosts of two ranks (scaling.workers_per_host), each host
// one HoldSlot and one RunEpoch per epoch with its ranks in-process. With
// one flat ring (scaling.all_reduce "ring") the run trains bit-identically
// to the same run with one rank per hold; with the default hierarchical
// all-reduce (sums within the host first) it trains to the same accuracy
// within rounding.
func TestHostsOfSeveralRanks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-hosts"
	for _, name := range []string{"host-a", "host-b"} {
		startWorkerWith(t, name, "both", queue, append(append([]string{}, testPolicy...), "-slots", "2"))
	}
	c := dial(t)
	runs := map[string]*spec.Progress{}
	for _, run := range []struct {
		perHost   int
		allReduce string
	}{{2, spec.AllReduceRing}, {1, ""}, {2, spec.AllReduceHierarchical}} {
		perHost := run.perHost
		s := subsetSpec(t, queue, 4, 3)
		s.Hyper.BatchSize = 32
		s.Scaling.WorkersPerHost = perHost
		s.Scaling.AllReduce = run.allReduce
		id := fmt.Sprintf("it-hosts-%d-%s", perHost, run.allReduce)
		p := awaitRun(t, startRun(t, c, id, queue, s), 2*time.Minute)
		if p.State != spec.StateCompleted || p.Epoch != 3 || p.Generation != 1 {
			t.Fatalf("%s: progress %+v", id, p)
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
		t.Logf("%s: %d HoldSlot activities for %d hosts, %d RunEpoch", id, holds, 4/perHost, epochs)
		runs[run.allReduce+fmt.Sprint(perHost)] = p
	}
	ring, flat, hier := runs["ring2"], runs["1"], runs["hierarchical2"]
	for e := range 3 {
		a, b := ring.Metrics[e], flat.Metrics[e]
		if a.TrainLoss != b.TrainLoss || a.TestAccuracy != b.TestAccuracy || a.TestLoss != b.TestLoss {
			t.Fatalf("epoch %d: hosts of 2 ranks on one ring %+v, hosts of 1 %+v; want the same numbers", e, a, b)
		}
		h := hier.Metrics[e]
		if math.Abs(h.TestAccuracy-b.TestAccuracy) > 0.02 || math.Abs(h.TrainLoss-b.TrainLoss) > 0.02*b.TrainLoss {
			t.Fatalf("epoch %d: hosts of 2 ranks reducing hierarchically %+v, hosts of 1 %+v; want the same within rounding", e, h, b)
		}
	}
	t.Logf("4 ranks as 2 hosts of 2 (one ring) and as 4 of 1: test accuracy %.4f both; hierarchically %.4f",
		flat.Metrics[2].TestAccuracy, hier.Metrics[2].TestAccuracy)
}
