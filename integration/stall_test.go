package integration

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// TestAStarvedRankCostsNoFailure: a worker process kept off its cores for
// 4 s mid-run (SIGSTOP, then SIGCONT: what a host starved of CPU or a
// paused VM does to a rank) is declared stalled by its ring neighbour at
// the default stall timeout (2 s), and its gang breaks. Running again, its
// rank hears the verdict and its host tells the run, which takes the
// failure back and raises the stall timeout it chose for its next gangs:
// the run completes with no failure charged, the incident says why, and
// the next gang's ranks were told the raised timeout. The heartbeat
// timeout is 20 s, so that a silence of 4 s and more (the neighbour may
// itself run late on a loaded machine, and count silence again from then)
// is still brief beside what the timeout can be raised to (10 s). Twice:
// hosts of one rank on one flat ring, and hosts of two ranks that reduce
// hierarchically (the ring's members are hosts, named by their first rank).
func TestAStarvedRankCostsNoFailure(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	for _, shape := range []struct {
		name    string
		perHost int
	}{{"one rank per host", 1}, {"hosts of two ranks", 2}} {
		t.Run(shape.name, func(t *testing.T) { starvedHost(t, shape.perHost) })
	}
}

func starvedHost(t *testing.T, perHost int) {
	queue := fmt.Sprintf("it-false-stall-%d", perHost)
	startWorker(t, "ctl", "workflows", queue)
	slots := append(append([]string{}, testPolicy...), "-slots", fmt.Sprint(perHost))
	agents := []*workerProc{startWorkerWith(t, "agent-a", "agent", queue, slots), startWorkerWith(t, "agent-b", "agent", queue, slots)}
	c := dial(t)
	const epochs = 8
	id := queue + "-1"
	s := subsetSpec(t, queue, 2*perHost, epochs)
	s.Scaling.WorkersPerHost = perHost                           // hosts of two reduce hierarchically: the default
	s.Failure.HeartbeatTimeout = spec.Duration(20 * time.Second) // the stall timeout's default is still 2 s
	run := startRun(t, c, id, queue, s)
	var stopped *workerProc
	until(t, id+" to train its second epoch", func() bool {
		p := progress(t, c, id)
		if p == nil || p.Epoch < 1 || p.State != spec.StateTraining {
			return false
		}
		for _, pl := range p.Gang {
			if pl.Worker == agents[1].name {
				stopped = agents[1]
			}
		}
		return stopped != nil
	})
	if err := stopped.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4 * time.Second)
	if err := stopped.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	p := awaitRun(t, run, 3*time.Minute)
	t.Logf("progress: state %s, epoch %d, generation %d, failures %d, stall timeout %v, incidents %+v",
		p.State, p.Epoch, p.Generation, p.Failures, p.StallTimeout, p.Incidents)
	if p.State != spec.StateCompleted || p.Epoch != epochs || p.Generation < 2 {
		t.Fatalf("progress %+v; want completed by a second gang", p)
	}
	var falseStall *spec.Incident
	for i, inc := range p.Incidents {
		if inc.Kind == spec.IncidentFalseStall && falseStall == nil {
			falseStall = &p.Incidents[i]
		}
	}
	if p.Failures != 0 || falseStall == nil || !strings.Contains(falseStall.Detail, "heard this verdict") {
		t.Fatalf("failures %d, incidents %+v; want the stall taken back (%s)", p.Failures, p.Incidents, spec.IncidentFalseStall)
	}
	raised := time.Duration(p.StallTimeout)
	if raised <= spec.DefaultStallTimeout || raised > 10*time.Second {
		t.Fatalf("the run's stall timeout is %v; want it raised from the default %v, to at most half the heartbeat timeout", raised, spec.DefaultStallTimeout)
	}
	// The broken gang's ranks were told the default; every later gang's, the raised timeout.
	told := map[int]time.Duration{}
	for _, in := range epochInputs(t, c, id) {
		told[in.Generation] = time.Duration(in.Spec.Failure.StallTimeout)
	}
	for gen, stall := range told {
		want := raised
		if gen <= falseStall.Generation {
			want = spec.DefaultStallTimeout
		}
		if stall != want {
			t.Fatalf("generation %d's ranks were told a stall timeout of %v; want %v (told %v)", gen, stall, want, told)
		}
	}
	if perHost == 1 {
		recordHistory(t, c, id, "false-stall")
	}
}
