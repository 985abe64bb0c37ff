package integration

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

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

// TestSmallAllReducesGatherOverSkipLinksAcrossMachines: three worker
// processes on three addresses (127.0.0.1 to .3, as three machines) train
// a 3-rank run whose small all-reduces gather over skip links (the
// workflow says so in every RunEpoch input, and names the links' far
// ends); one of them is killed with SIGKILL after the first epoch and a
// spare on a fourth address takes its place. The run ends with the same
// test numbers, exactly, as three workers on one address trained without
// a fault, whose ring is shared memory all round and which gather around it.
func TestSmallAllReducesGatherOverSkipLinksAcrossMachines(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	const epochs = 3
	c := dial(t)
	runs := map[bool]*spec.Progress{}
	for _, spread := range []bool{false, true} {
		queue := fmt.Sprintf("it-links-%v", spread)
		workers := 3
		if spread {
			workers = 4 // a spare
		}
		var agents []*workerProc
		for i := range workers {
			role, flags := "agent", append([]string{}, testPolicy...)
			if i == 0 {
				role = "both"
			}
			if spread {
				flags = append(flags, "-collective-bind", fmt.Sprintf("127.0.0.%d:0", i+1))
			}
			w := startWorkerWith(t, fmt.Sprintf("%s-%d", queue, i), role, queue, flags)
			if i > 0 {
				agents = append(agents, w)
			}
		}
		s := subsetSpec(t, queue, 3, epochs)
		s.Scaling.BucketBytes = spec.MinBucketBytes // many all-reduces small enough to gather
		id := queue + "-run"
		run := startRun(t, c, id, queue, s)
		if spread {
			victim := killRankWorker(t, c, id, agents, 1)
			t.Logf("killed %s", victim.name)
		}
		p := awaitRun(t, run, 3*time.Minute)
		if p.State != spec.StateCompleted || p.Epoch != epochs || spread != (p.Generation > 1) {
			t.Fatalf("%s: progress %+v", id, p)
		}
		inputs := epochInputs(t, c, id)
		for _, in := range inputs {
			if in.GatherLinks != spread || in.SmallAllReduceBytes == 0 {
				t.Fatalf("%s: rank %d told to gather up to %d bytes, over links: %v; want links %v", id, in.Rank, in.SmallAllReduceBytes, in.GatherLinks, spread)
			}
		}
		if len(inputs) < 3*epochs {
			t.Fatalf("%s: %d RunEpoch inputs; want at least %d", id, len(inputs), 3*epochs)
		}
		runs[spread] = p
	}
	for e := range epochs {
		a, b := runs[true].Metrics[e], runs[false].Metrics[e]
		if a.TestAccuracy != b.TestAccuracy || a.TestLoss != b.TestLoss {
			t.Fatalf("epoch %d: gathered over skip links, a worker killed %+v; around a shared-memory ring %+v; want the same test numbers", e, a, b)
		}
	}
	t.Logf("3 ranks on 3 addresses, gathering over skip links, one killed and replaced (%d gangs), and on one address: test accuracy %.4f both",
		runs[true].Generation, runs[true].Metrics[epochs-1].TestAccuracy)
}

// killRankWorker kills with SIGKILL, once the run has completed the given
// epoch, whichever of agents holds one of its ranks, and returns it.
func killRankWorker(t *testing.T, c client.Client, id string, agents []*workerProc, epoch int) *workerProc {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		p := progress(t, c, id)
		if p == nil || p.Epoch < epoch {
			continue
		}
		for _, w := range agents {
			for _, pl := range p.Gang {
				if pl.Worker == w.name {
					w.cmd.Process.Signal(syscall.SIGKILL)
					return w
				}
			}
		}
	}
	t.Fatalf("%s never reached epoch %d on an agent that can be killed", id, epoch)
	return nil
}
