package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/devserver"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

var recordHistories = flag.Bool("record-histories", false, "write the histories of the runs to ../workflows/testdata/histories for the replay tests")

var (
	server    *devserver.Server
	workerBin string
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "durabletrain-integration-")
	if err != nil {
		panic(err)
	}
	workerBin = filepath.Join(dir, "worker")
	if out, err := exec.Command("go", "build", "-o", workerBin, "../cmd/worker").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building cmd/worker: %v\n%s", err, out)
		os.Exit(1)
	}
	server, err = devserver.Start(devserver.Options{Ephemeral: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	server.Stop()
	os.RemoveAll(dir)
	os.Exit(code)
}

// workerProc is a real worker process.
type workerProc struct {
	cmd  *exec.Cmd
	name string
	logs *lineLog
}

type lineLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) add(s string) { l.mu.Lock(); l.lines = append(l.lines, s); l.mu.Unlock() }
func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// startWorker starts a worker process with the given role on queues unique to the test.
func startWorker(t testing.TB, name, role, queue string, env ...string) *workerProc {
	t.Helper()
	return startWorkerWith(t, name, role, queue, testPolicy, env...)
}

// startWorkerWith starts a worker with extra flags (testPolicy, or a policy of the test's own).
func startWorkerWith(t testing.TB, name, role, queue string, flags []string, env ...string) *workerProc {
	t.Helper()
	return startWorkerAt(t, server.Addr(), name, role, queue, flags, env...)
}

// startWorkerAt is startWorkerWith against the server at address.
func startWorkerAt(t testing.TB, address, name, role, queue string, flags []string, env ...string) *workerProc {
	t.Helper()
	cmd := exec.Command(workerBin, append([]string{"-address", address, "-role", role, "-slots", "1", "-identity", name,
		"-control-queue", queue + "-control", "-task-queue", queue, "-grace", "2s"}, flags...)...)
	cmd.Env = append(os.Environ(), env...)
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &workerProc{cmd: cmd, name: name, logs: &lineLog{}}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			w.logs.add(sc.Text())
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		if t.Failed() {
			t.Logf("log of %s:\n%s", name, w.logs)
		}
	})
	return w
}

// testPolicy lets the tests' workers use their temporary directories and the
// committed data set, and run the system's Python for exec runs; a worker
// started without it keeps the default policy (TestWorkerPolicy).
var testPolicy = []string{
	"-storage-roots", bloburl.FromPath(filepath.Clean(os.TempDir())) + "/," + bloburl.FromPath(filepath.Dir(testdata.FashionMNISTSmallDir())) + "/,mem://",
	"-allow-exec", "/usr/bin/python3", "-exec-dirs", os.TempDir(),
}

func dial(t testing.TB) client.Client {
	c, err := connect.Options{Address: server.Addr(), Namespace: "default"}.Dial(zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func startRun(t testing.TB, c client.Client, id, queue string, s spec.Training) client.WorkflowRun {
	input, _ := json.Marshal(s)
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: id, TaskQueue: queue + "-control"},
		spec.WorkflowTraining, json.RawMessage(input))
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// awaitRun waits up to limit for a run's result and logs its incidents.
func awaitRun(t *testing.T, run client.WorkflowRun, limit time.Duration) *spec.Progress {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var p *spec.Progress
	if err := run.Get(ctx, &p); err != nil {
		t.Fatal(err)
	}
	for _, inc := range p.Incidents {
		t.Logf("incident: %s: %s", inc.Kind, inc.Detail)
	}
	return p
}

func subsetSpec(t *testing.T, queue string, workers, epochs int) spec.Training {
	return spec.Training{
		Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()},
		// 64 per rank: 2 ranks make the global batch of 128 a single rank would use.
		Hyper:      spec.Hyper{Epochs: epochs, BatchSize: 64},
		Scaling:    spec.Scaling{Workers: workers, TaskQueue: queue, GangTimeout: spec.Duration(time.Minute)},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(t.TempDir()) + "?metadata=skip"},
		Failure:    spec.Failure{HeartbeatTimeout: spec.Duration(3 * time.Second)},
	}
}

// TestTrainsAcrossTwoWorkerProcesses: a 2-rank run over two real worker
// processes reaches 0.85 test accuracy on the committed subset.
func TestTrainsAcrossTwoWorkerProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-train"
	startWorker(t, "worker-a", "both", queue)
	startWorker(t, "worker-b", "agent", queue)
	c := dial(t)
	s := subsetSpec(t, queue, 2, 10)
	s.SearchAttributes = true
	run := startRun(t, c, "it-train-1", queue, s)
	p := awaitRun(t, run, 5*time.Minute)
	last := p.Metrics[len(p.Metrics)-1]
	t.Logf("10 epochs, 2 ranks: test accuracy %.4f, %.0f samples/s", last.TestAccuracy, last.SamplesPerSecond)
	if p.State != spec.StateCompleted || p.Epoch != 10 || p.Generation != 1 {
		t.Fatalf("progress %+v", p)
	}
	if last.TestAccuracy < 0.85 {
		t.Fatalf("test accuracy %.4f; want at least 0.85", last.TestAccuracy)
	}
	workers := map[string]bool{}
	for _, pl := range p.Gang {
		workers[pl.Worker] = true
	}
	// The query answers while the run is open; after completion the gang is released.
	if p.Latest == nil || p.Latest.Epoch != 10 {
		t.Fatalf("latest checkpoint %+v", p.Latest)
	}
	// The run upserted its state and epoch: it can be found by them.
	q := fmt.Sprintf("WorkflowId = 'it-train-1' AND %s = 'completed' AND %s = 10", spec.SearchAttributeState, spec.SearchAttributeEpoch)
	// Visibility is eventually consistent: a busy server indexes the close a moment later.
	var resp *workflowservice.ListWorkflowExecutionsResponse
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err = c.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{Namespace: "default", Query: q})
		if err == nil && len(resp.Executions) == 1 || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || len(resp.Executions) != 1 {
		t.Fatalf("listing by search attributes (%s): %d runs, %v", q, len(resp.GetExecutions()), err)
	}
	recordHistory(t, c, "it-train-1", "two-ranks-ten-epochs")
}

// TestKilledWorkerIsReplacedAndTheRunCompletes: kill -9 of a rank's worker
// mid-run; a spare worker takes its place and the run resumes from the latest
// checkpoint.
func TestKilledWorkerIsReplacedAndTheRunCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-kill"
	startWorker(t, "ctl", "workflows", queue)
	a := startWorker(t, "agent-a", "agent", queue)
	b := startWorker(t, "agent-b", "agent", queue)
	startWorker(t, "spare", "agent", queue)
	c := dial(t)
	s := subsetSpec(t, queue, 2, 6)
	run := startRun(t, c, "it-kill-1", queue, s)
	// Once epoch 2 is done, kill whichever of a and b holds a rank.
	victim := killRankWorker(t, c, "it-kill-1", []*workerProc{a, b}, 2)
	killed := time.Now()
	t.Logf("killed %s", victim.name)
	// How long until the workflow notices and a new gang trains?
	var detected, resumed time.Duration
	for time.Since(killed) < time.Minute && resumed == 0 {
		p := progress(t, c, "it-kill-1")
		if p != nil && p.Failures > 0 && detected == 0 {
			detected = time.Since(killed)
		}
		if p != nil && p.Generation >= 2 && p.State == spec.StateTraining && resumed == 0 {
			resumed = time.Since(killed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	p := awaitRun(t, run, 3*time.Minute)
	t.Logf("kill -9 of %s: detected after %v, new gang training after %v; %d failures, %d gangs", victim.name, detected.Round(time.Millisecond), resumed.Round(time.Millisecond), p.Failures, p.Generation)
	if p.State != spec.StateCompleted || p.Epoch != 6 || p.Failures < 1 || p.Generation < 2 {
		t.Fatalf("progress %+v", p)
	}
	for _, inc := range p.Incidents {
		if len(inc.Detail) > 300 {
			t.Errorf("an incident a person has to read is %d characters long", len(inc.Detail))
		}
	}
	recordHistory(t, c, "it-kill-1", "killed-worker-recovers")
}

// TestSIGTERMLeavesWithACheckpoint: SIGTERM to a rank's worker mid-epoch is a
// preemption: the gang stops at one step, rank 0 commits a mid-epoch
// checkpoint within the grace period, the run resumes from that exact step on
// a spare, and max_failures (0 here) is not charged.
func TestSIGTERMLeavesWithACheckpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-term"
	startWorker(t, "ctl", "workflows", queue)
	agents := []*workerProc{startWorker(t, "agent-a", "agent", queue), startWorker(t, "agent-b", "agent", queue), startWorker(t, "agent-c", "agent", queue)}
	c := dial(t)
	s := subsetSpec(t, queue, 2, 4)
	s.Hyper.BatchSize = 8 // long epochs, so the signal lands mid-epoch
	s.Failure.MaxFailures = spec.Int(0)
	run := startRun(t, c, "it-term-1", queue, s)
	victim := sigtermRankWorker(t, c, "it-term-1", agents, 1, 2)
	p := awaitRun(t, run, 3*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != 4 || p.Failures != 0 || p.Preemptions != 1 {
		t.Fatalf("progress %+v", p)
	}
	if inc := troubles(p); len(inc) != 1 || !strings.Contains(inc[0].Detail, "checkpointed at epoch 1 step") {
		t.Fatalf("incidents %+v: want one preemption that checkpointed mid-epoch 1 (and restores)", p.Incidents)
	}
	// Each epoch is recorded once: the interrupted one by the gang that finished it.
	for i, m := range p.Metrics {
		if m.Epoch != i {
			t.Fatalf("metrics history %+v", p.Metrics)
		}
	}
	if !strings.Contains(victim.logs.String(), "left the gang after a checkpoint") && !strings.Contains(victim.logs.String(), "slot given up") {
		t.Errorf("the stopped worker's log does not say it left with its gang")
	}
	recordHistory(t, c, "it-term-1", "sigterm-preemption")
}

// TestElasticGangGrowsBack: 2 ranks asked for, min_workers 1, and only one
// agent up: the run trains with one rank (global batch kept); a second agent
// starts, and at an epoch boundary the gang grows back to 2 ranks.
func TestElasticGangGrowsBack(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-elastic"
	startWorker(t, "ctl", "workflows", queue)
	startWorker(t, "agent-a", "agent", queue)
	c := dial(t)
	s := subsetSpec(t, queue, 2, 12)
	s.Scaling.MinWorkers = 1
	s.Scaling.GangTimeout = spec.Duration(2 * time.Second)
	run := startRun(t, c, "it-elastic-1", queue, s)
	deadline := time.Now().Add(time.Minute)
	for {
		p := progress(t, c, "it-elastic-1")
		if p != nil && p.Epoch >= 2 && p.World == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the run did not train on with one rank: %+v", p)
		}
		time.Sleep(50 * time.Millisecond)
	}
	started := time.Now()
	startWorker(t, "agent-b", "agent", queue)
	grown := time.Duration(0)
	for time.Since(started) < time.Minute && grown == 0 {
		if p := progress(t, c, "it-elastic-1"); p != nil && p.World == 2 {
			grown = time.Since(started)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if grown == 0 {
		t.Fatal("the gang did not grow back to 2 ranks within a minute of a second agent starting")
	}
	p := awaitRun(t, run, 3*time.Minute)
	var resized []string
	for _, inc := range p.Incidents {
		if inc.Kind == "resized" {
			resized = append(resized, inc.Detail)
		}
	}
	last := p.Metrics[len(p.Metrics)-1]
	t.Logf("grew back %v after the second agent started; resizes %q; final accuracy %.4f", grown.Round(time.Millisecond), resized, last.TestAccuracy)
	if p.State != spec.StateCompleted || p.Epoch != 12 || p.Failures != 0 || len(resized) != 2 {
		t.Fatalf("progress %+v", p)
	}
	// Resizing keeps the global batch, so training converges as a fixed gang's does (0.85-0.86 here).
	if last.TestAccuracy < 0.84 {
		t.Fatalf("test accuracy %.4f; want at least 0.84", last.TestAccuracy)
	}
	recordHistory(t, c, "it-elastic-1", "elastic-gang-grows")
}

func TestBadSpecIsRefusedAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the server")
	}
	queue := "it-bad"
	startWorker(t, "bad-ctl", "workflows", queue)
	c := dial(t)
	run, err := c.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: "it-bad-1", TaskQueue: queue + "-control"},
		spec.WorkflowTraining, json.RawMessage(`{"scaling": {"workers": -2}}`))
	if err != nil {
		t.Fatal(err)
	}
	err = run.Get(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "scaling.workers is -2; want 1 to 8192 ranks") {
		t.Fatalf("got %v", err)
	}
	desc, _ := c.DescribeWorkflowExecution(context.Background(), "it-bad-1", "")
	if desc.WorkflowExecutionInfo.Status != enumspb.WORKFLOW_EXECUTION_STATUS_FAILED {
		t.Fatalf("status %v", desc.WorkflowExecutionInfo.Status)
	}
}

func progress(t *testing.T, c client.Client, id string) *spec.Progress {
	v, err := c.QueryWorkflow(context.Background(), id, "", spec.QueryProgress)
	if err != nil {
		return nil
	}
	var p *spec.Progress
	if v.Get(&p) != nil {
		return nil
	}
	return p
}

// epochInputs are the RunEpoch inputs the workflow id scheduled, in the
// order of its history (one per host and epoch).
func epochInputs(t *testing.T, c client.Client, id string) []spec.EpochInput {
	t.Helper()
	var ins []spec.EpochInput
	hist := c.GetWorkflowHistory(t.Context(), id, "", false, 0)
	for hist.HasNext() {
		e, err := hist.Next()
		if err != nil {
			t.Fatal(err)
		}
		a := e.GetActivityTaskScheduledEventAttributes()
		if a == nil || a.GetActivityType().GetName() != spec.ActivityRunEpoch {
			continue
		}
		var in spec.EpochInput
		if err := converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &in); err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	return ins
}

// recordHistory saves a run's history for the replay tests in package workflows.
func recordHistory(t *testing.T, c client.Client, id, name string) {
	if !*recordHistories {
		return
	}
	it := c.GetWorkflowHistory(context.Background(), id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events []json.RawMessage
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		b, err := protojsonMarshal(e)
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, b)
	}
	out, _ := json.MarshalIndent(map[string]any{"events": events}, "", "  ")
	path := filepath.Join("..", "workflows", "testdata", "histories", name+".json")
	os.MkdirAll(filepath.Dir(path), 0o755)
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d events to %s", len(events), path)
}

// TestTwoRunsCompetingForTooFewSlotsBothFinish: two 2-rank runs, three slots.
// Gangs are all-or-nothing with backoff, so one run waits while the other
// trains, and neither holds half a gang forever.
func TestTwoRunsCompetingForTooFewSlotsBothFinish(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-compete"
	startWorker(t, "compete-ctl", "workflows", queue)
	for _, n := range []string{"c1", "c2", "c3"} {
		startWorker(t, n, "agent", queue)
	}
	c := dial(t)
	s := subsetSpec(t, queue, 2, 3)
	s.Scaling.GangTimeout = spec.Duration(2 * time.Second)
	runs := []client.WorkflowRun{startRun(t, c, "it-compete-1", queue, s), startRun(t, c, "it-compete-2", queue, s)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	for _, run := range runs {
		var p *spec.Progress
		if err := run.Get(ctx, &p); err != nil {
			t.Fatal(err)
		}
		timeouts := 0
		for _, inc := range p.Incidents {
			if inc.Kind == "gang-timeout" {
				timeouts++
			}
		}
		t.Logf("%s: %s after %d gangs (%d gang timeouts)", run.GetID(), p.State, p.Generation, timeouts)
		if p.State != spec.StateCompleted || p.Epoch != 3 || p.Failures != 0 {
			t.Fatalf("%s: progress %+v", run.GetID(), p)
		}
	}
}

// troubles are the run's incidents but its restores (every new gang records one).
func troubles(p *spec.Progress) []spec.Incident {
	var out []spec.Incident
	for _, inc := range p.Incidents {
		if inc.Kind != spec.IncidentRestored {
			out = append(out, inc)
		}
	}
	return out
}
