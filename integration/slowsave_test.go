package integration

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/faultproxy"
	"github.com/durabletrain/durabletrain/testkit/minio/miniotest"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// slowSaveScript is an exec program (standard library only) whose save at a
// stop sleeps SAVE_SECONDS, as a big model's checkpoint does, and whose
// state is a fold of every (epoch, step) it trained: a step trained twice
// or skipped changes it, so the final checkpoint says whether the run
// resumed exactly where it stopped.
const slowSaveScript = `import os, sys, time, durabletrain as dt
rank = dt.world_rank()
save_seconds = float(os.environ.get('SAVE_SECONDS', '8'))
steps = int(os.environ.get('STEPS', '150'))
state = 0
ck = dt.get_checkpoint()
if ck:
    state = int(open(os.path.join(ck, 'state')).read())
    print('rank %d: resumed at epoch %d step %d' % (rank, ck.epoch, ck.step), file=sys.stderr, flush=True)
    restore_seconds = float(os.environ.get('RESTORE_SECONDS') or '0')
    if restore_seconds:
        print('rank %d: restoring for %ss' % (rank, restore_seconds), file=sys.stderr, flush=True)
        time.sleep(restore_seconds)  # a big model's state loaded onto its devices
out = os.path.abspath('ck-%d-%d' % (rank, os.getpid()))
os.makedirs(out, exist_ok=True)
def write():
    with open(os.path.join(out, 'state'), 'w') as f:
        f.write(str(state))
    return out
def save():
    print('rank %d: saving at %s for %ss' % (rank, dt.position(), save_seconds), file=sys.stderr, flush=True)
    time.sleep(save_seconds)
    return write()
for epoch in dt.epochs():
    for step in dt.steps(steps, save=save):
        state = (state * 31 + epoch * 100000 + step + 1) % 2147483647
        time.sleep(0.01)
    dt.report({'train_loss': 1.0 / (epoch + 1), 'test_loss': 1.0, 'test_accuracy': 0.5}, checkpoint_dir=write())
`

// slowSaveState is the state slowSaveScript ends with after epochs epochs
// of steps steps, never stopped.
func slowSaveState(epochs, steps int) string {
	var s uint64
	for e := range epochs {
		for i := range steps {
			s = (s*31 + uint64(e)*100000 + uint64(i) + 1) % 2147483647
		}
	}
	return strconv.FormatUint(s, 10)
}

// TestASlowSaveAtAStopIsAPreemption (issue 66): a 2-rank exec run whose
// programs take seconds to save, heartbeat timeout 3 s, max_failures 0, and
// SIGTERM to rank 1's worker: mid-epoch with a save of 8 s and a grace of
// 20 s; during a periodic checkpoint (every_steps) of 5 s; with a grace
// (5 s) shorter than the save, so the ranks are cut off unsaved; twice, the
// second mid-leave; to a host of 2 ranks of a 4-rank gang (workers_per_host
// 2); and to a worker of the new gang while its ranks restore for 8 s, after
// a first preemption. Every time the run must count its preemptions (not
// failures, which would end it), resume at the stop's step where it saved
// (at the latest checkpoint where it did not, saying so), and end with the
// state of a run never stopped. TestASIGTERMWhileTheGangFormsIsAPreemption
// is the same while the gang forms.
func TestASlowSaveAtAStopIsAPreemption(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	for _, c := range []slowSaveCase{
		{name: "mid-epoch", save: "8", grace: "20s", saved: true},
		{name: "during-a-periodic-checkpoint", save: "5", grace: "20s", everySteps: 100, whenSaving: true, saved: true},
		{name: "grace-shorter-than-the-save", save: "8", grace: "5s", saved: false},
		{name: "a-second-sigterm-mid-leave", save: "8", grace: "20s", twice: true, saved: true},
		{name: "a-host-of-two-ranks", save: "8", grace: "20s", perHost: 2, saved: true},
		{name: "while-the-new-gang-restores", save: "8", grace: "20s", restore: "8", saved: true},
	} {
		// In parallel: each case has its own queues and workers, and mostly waits on its saves.
		t.Run(c.name, func(t *testing.T) { t.Parallel(); c.run(t) })
	}
}

type slowSaveCase struct {
	name, save, grace string
	everySteps        int
	whenSaving        bool   // SIGTERM once the victim's rank logs that it is saving
	twice             bool   // a second SIGTERM 2 s after the first
	saved             bool   // the save fits the grace: the run resumes at the stop's step
	perHost           int    // ranks per host (workers_per_host); 0: 1
	restore           string // seconds a resumed rank takes to restore: a second SIGTERM hits the new gang while it restores
}

func (c slowSaveCase) run(t *testing.T) {
	const epochs, steps = 2, 150
	perHost := max(1, c.perHost)
	world := 2 * perHost
	queue := "it-slow-save-" + c.name
	py, _ := filepath.Abs("../python")
	dir := t.TempDir()
	script := filepath.Join(dir, "slowsave.py")
	if err := os.WriteFile(script, []byte(slowSaveScript), 0o644); err != nil {
		t.Fatal(err)
	}
	startWorker(t, queue+"-ctl", "workflows", queue)
	var agents []*workerProc
	hosts := 3 // one spare
	if c.restore != "" {
		hosts = 4 // a spare for each preemption
	}
	for i := range hosts {
		agents = append(agents, startWorkerWith(t, fmt.Sprintf("%s-%d", queue, i), "agent", queue,
			append(slices.Clone(testPolicy), "-grace", c.grace, "-slots", strconv.Itoa(perHost)), "DURABLETRAIN_PYTHONPATH="+py))
	}
	cl := dial(t)
	s := subsetSpec(t, queue, world, epochs)
	s.Scaling.WorkersPerHost = c.perHost
	s.Trainer = "exec"
	s.Failure.MaxFailures = spec.Int(0)
	s.Checkpoint.EverySteps = c.everySteps
	s.Checkpoint.KeepLast = spec.Int(0)
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script}, Dir: dir,
		Env: map[string]string{"SAVE_SECONDS": c.save, "STEPS": strconv.Itoa(steps), "RESTORE_SECONDS": c.restore}}
	id := queue + "-1"
	run := startRun(t, cl, id, queue, s)
	victim, took := sigtermRankWorkerWithin(t, cl, id, agents, world-1, world, 30*time.Second, c.whenSaving, c.twice)
	preemptions := 1
	if c.restore != "" {
		// The new gang's ranks restore for c.restore seconds: SIGTERM a worker of it meanwhile.
		second := sigtermWhileRestoring(t, cl, id, agents, victim, 30*time.Second)
		t.Logf("%s SIGTERMed while its rank restored", second.name)
		preemptions = 2
	}
	p := awaitRun(t, run, 4*time.Minute)
	t.Logf("%s left %v after SIGTERM; run: state %s, %d preemptions, %d failures, incidents %+v", victim.name, took.Round(time.Millisecond),
		p.State, p.Preemptions, p.Failures, p.Incidents)
	if p.State != spec.StateCompleted || p.Preemptions != preemptions || p.Failures != 0 {
		t.Fatalf("progress %+v: want completed with %d preemptions and 0 failures", p, preemptions)
	}
	var stopped int
	var detail string
	for _, inc := range p.Incidents {
		if inc.Kind == spec.IncidentPreemption {
			detail = inc.Detail
		}
		if i := strings.Index(inc.Detail, "checkpointed at epoch 1 step"); i >= 0 {
			fmt.Sscanf(inc.Detail[i:], "checkpointed at epoch 1 step %d", &stopped)
		}
	}
	if c.saved {
		if took < 5*time.Second {
			t.Errorf("the worker left %v after SIGTERM; its ranks' save alone takes %s s", took, c.save)
		}
		if stopped == 0 {
			t.Fatalf("incidents %+v: want a preemption that checkpointed mid-epoch 1", p.Incidents)
		}
		// Every rank of every new gang resumed at a stop's step: the last
		// stop's for the gang that finished (a second stop of a gang still
		// restoring saves where the first one did).
		want := slices.Repeat([]int{stopped}, world*(preemptions))
		if got := resumedAt(agents, 1); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("stopped at epoch 1 step %d; the new gangs' ranks resumed at %v, want %v", stopped, got, want)
		}
	} else if !strings.Contains(detail, "not saved at the stop") || !strings.Contains(detail, "resumes from") {
		t.Fatalf("the preemption says %q; want it to say the ranks did not save at the stop, and where the run resumes", detail)
	}
	if got, want := finalExecFile(t, s.Checkpoint.URL, id, epochs, "files/state"), slowSaveState(epochs, steps); got != want {
		t.Fatalf("the final state is %s; a run never stopped ends with %s", got, want)
	}
}

// sigtermWhileRestoring waits for a rank of the gang formed after first's
// preemption to say it is restoring, SIGTERMs that rank's worker, and waits
// up to limit for it to exit.
func sigtermWhileRestoring(t *testing.T, c client.Client, run string, agents []*workerProc, first *workerProc, limit time.Duration) *workerProc {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		for _, w := range agents {
			if w == first || !strings.Contains(w.logs.String(), "restoring for") {
				continue
			}
			time.Sleep(time.Second) // well inside the restore
			w.cmd.Process.Signal(syscall.SIGTERM)
			exited := make(chan error, 1)
			go func() { exited <- w.cmd.Wait() }()
			select {
			case <-exited:
				return w
			case <-time.After(limit):
				t.Fatalf("%s did not exit within %v of SIGTERM", w.name, limit)
			}
		}
	}
	t.Fatalf("no rank of run %s's new gang said it was restoring", run)
	return nil
}

// resumedAt is the steps of epoch the agents' programs said they resumed at.
func resumedAt(agents []*workerProc, epoch int) []int {
	var out []int
	key := fmt.Sprintf("resumed at epoch %d step ", epoch)
	for _, w := range agents {
		for _, line := range strings.Split(w.logs.String(), "\n") {
			i := strings.Index(line, key)
			if i < 0 || !strings.Contains(line, `"stream":"stderr"`) {
				continue
			}
			var step int
			fmt.Sscanf(line[i+len(key):], "%d", &step)
			out = append(out, step)
		}
	}
	return out
}

// finalExecFile reads name from the run's verified checkpoint at the end of epochs.
func finalExecFile(t *testing.T, url, run string, epochs int, name string) string {
	t.Helper()
	store, err := checkpoint.Open(context.Background(), url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ck, err := store.Verify(context.Background(), run, checkpoint.ID(epochs, 0))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ck.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// sigtermRankWorkerWithin is sigtermRankWorker for workers whose ranks take
// long to leave: it waits up to limit for the worker to exit, and says how
// long it took. whenSaving waits, before the signal, for the victim's rank
// to log that it is saving; twice signals again 2 s after.
func sigtermRankWorkerWithin(t *testing.T, c client.Client, run string, agents []*workerProc, rank, world int, limit time.Duration, whenSaving, twice bool) (*workerProc, time.Duration) {
	t.Helper()
	var victim *workerProc
	for deadline := time.Now().Add(3 * time.Minute); victim == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		p := progress(t, c, run)
		if p == nil || p.Epoch < 1 || p.World != world || len(p.Gang) == 0 || p.State != spec.StateTraining {
			continue
		}
		perHost := world / len(p.Gang) // a placement is a host: its first rank and the next perHost-1
		for _, pl := range p.Gang {
			for _, w := range agents {
				if pl.Worker == w.name && pl.Rank <= rank && rank < pl.Rank+perHost {
					victim = w
				}
			}
		}
	}
	if victim == nil {
		t.Fatalf("run %s never trained epoch 1 with %d ranks", run, world)
	}
	if whenSaving {
		before := strings.Count(victim.logs.String(), "saving at (1,")
		for deadline := time.Now().Add(time.Minute); strings.Count(victim.logs.String(), "saving at (1,") == before; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's rank never saved in epoch 1", victim.name)
			}
		}
		time.Sleep(time.Second)
	} else {
		time.Sleep(300 * time.Millisecond)
	}
	victim.cmd.Process.Signal(syscall.SIGTERM)
	termed := time.Now()
	exited := make(chan error, 1)
	go func() { exited <- victim.cmd.Wait() }()
	var again <-chan time.Time
	if twice {
		again = time.After(2 * time.Second)
	}
	for {
		select {
		case <-exited:
			return victim, time.Since(termed)
		case <-again:
			victim.cmd.Process.Signal(syscall.SIGTERM)
			again = nil
		case <-time.After(limit):
			t.Fatalf("%s did not exit within %v of SIGTERM", victim.name, limit)
		}
	}
}

// TestASIGTERMWhileTheGangFormsIsAPreemption (issue 66): a 2-rank exec run
// whose first host holds its slot while the second is not there yet; that
// first host's worker is SIGTERMed before the gang has formed. Its hold
// leaves as a preemption, counted as one (no failure is charged,
// max_failures is 0); the gang forms on the hosts that come after, and the
// run ends with the state of a run never stopped.
func TestASIGTERMWhileTheGangFormsIsAPreemption(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	const epochs, steps = 2, 60
	queue := "it-slow-save-forming"
	py, _ := filepath.Abs("../python")
	dir := t.TempDir()
	script := filepath.Join(dir, "slowsave.py")
	if err := os.WriteFile(script, []byte(slowSaveScript), 0o644); err != nil {
		t.Fatal(err)
	}
	startWorker(t, queue+"-ctl", "workflows", queue)
	agent := func(i int) *workerProc {
		return startWorkerWith(t, fmt.Sprintf("%s-%d", queue, i), "agent", queue,
			append(slices.Clone(testPolicy), "-grace", "20s"), "DURABLETRAIN_PYTHONPATH="+py)
	}
	first := agent(0)
	cl := dial(t)
	s := subsetSpec(t, queue, 2, epochs)
	s.Trainer = "exec"
	s.Failure.MaxFailures = spec.Int(0)
	s.Checkpoint.KeepLast = spec.Int(0)
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script}, Dir: dir,
		Env: map[string]string{"SAVE_SECONDS": "4", "STEPS": strconv.Itoa(steps)}}
	id := queue + "-1"
	run := startRun(t, cl, id, queue, s)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(first.logs.String(), "slot held"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s never held a slot for the run", first.name)
		}
	}
	if p := progress(t, cl, id); p == nil || p.State != spec.StateFormingGang {
		t.Fatalf("progress %+v: want the gang still forming", p)
	}
	first.cmd.Process.Signal(syscall.SIGTERM)
	termed := time.Now()
	if err := first.cmd.Wait(); err != nil {
		t.Logf("%s exited: %v", first.name, err)
	}
	t.Logf("%s left %v after SIGTERM, before the gang formed", first.name, time.Since(termed).Round(time.Millisecond))
	agent(1)
	agent(2)
	p := awaitRun(t, run, 3*time.Minute)
	if p.State != spec.StateCompleted || p.Failures != 0 || p.Preemptions != 1 {
		t.Fatalf("progress %+v: want completed with 1 preemption and no failure", p)
	}
	if inc := troubles(p); len(inc) != 1 || inc[0].Kind != spec.IncidentPreemption || !strings.Contains(inc[0].Detail, "preempted before the gang formed") {
		t.Fatalf("incidents %+v: want one preemption, before the gang formed", p.Incidents)
	}
	if got, want := finalExecFile(t, s.Checkpoint.URL, id, epochs, "files/state"), slowSaveState(epochs, steps); got != want {
		t.Fatalf("the final state is %s; a run never stopped ends with %s", got, want)
	}
}

// TestASlowNativeSaveAtAStopIsAPreemption (issue 66): the native trainer's
// ranks, a 2-rank run checkpointing to S3 (a real MinIO) through a proxy
// that holds every upload 5 s once rank 1's worker is SIGTERMed mid-epoch:
// rank 0's stop checkpoint takes longer than the 3 s heartbeat timeout,
// while the stopping worker's hold waits for it. One preemption, no failure
// (max_failures 0), resumed at the stop's step, and the run ends with the
// numbers, bit for bit, of the same run never stopped.
func TestASlowNativeSaveAtAStopIsAPreemption(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MinIO and worker processes")
	}
	const epochs = 3
	proxy, s3 := miniotest.StartBehindFaults(t, "..", "slowsave")
	queue := "it-slow-save-native"
	roots := bloburl.FromPath(filepath.Dir(testdata.FashionMNISTSmallDir())) + "/," + bloburl.FromPath(filepath.Clean(os.TempDir())) + "/," + s3.BucketURL("slowsave", "")
	flags := []string{"-storage-roots", roots, "-grace", "30s"}
	startWorkerWith(t, queue+"-ctl", "workflows", queue, flags, s3.Env()...)
	var agents []*workerProc
	for i := range 3 { // one spare
		agents = append(agents, startWorkerWith(t, fmt.Sprintf("%s-%d", queue, i), "agent", queue, flags, s3.Env()...))
	}
	cl := dial(t)
	s := subsetSpec(t, queue, 2, epochs)
	s.Hyper.BatchSize = 8 // long epochs, so the signal lands mid-epoch
	s.Failure.MaxFailures = spec.Int(0)
	reference := awaitRun(t, startRun(t, cl, queue+"-reference", queue, s), 3*time.Minute)
	if reference.State != spec.StateCompleted {
		t.Fatalf("the reference run: %+v", reference)
	}
	s.Checkpoint.URL = "s3://slowsave?prefix=ckpt/"
	id := queue + "-1"
	run := startRun(t, cl, id, queue, s)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if p := progress(t, cl, id); p != nil && p.Epoch >= 1 && p.State == spec.StateTraining {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s never trained epoch 1", id)
		}
	}
	proxy.SetDelay(5 * time.Second)
	proxy.Set(func(r *http.Request) faultproxy.Fault {
		if r.Method == http.MethodPut || r.Method == http.MethodPost {
			return faultproxy.Slow
		}
		return faultproxy.Pass
	})
	victim, took := sigtermRankWorkerWithin(t, cl, id, agents, 1, 2, 60*time.Second, false, false)
	proxy.Set(nil)
	p := awaitRun(t, run, 3*time.Minute)
	t.Logf("%s left %v after SIGTERM (%d uploads held 5 s); run: state %s, %d preemptions, %d failures", victim.name,
		took.Round(time.Millisecond), proxy.Faulted(), p.State, p.Preemptions, p.Failures)
	if p.State != spec.StateCompleted || p.Preemptions != 1 || p.Failures != 0 {
		t.Fatalf("progress %+v: want completed with 1 preemption and 0 failures", p)
	}
	if took < 5*time.Second {
		t.Errorf("the worker left %v after SIGTERM; its gang's checkpoint alone takes 5 s an upload", took)
	}
	if inc := troubles(p); len(inc) != 1 || !strings.Contains(inc[0].Detail, "checkpointed at epoch 1 step") {
		t.Fatalf("incidents %+v: want one preemption that checkpointed mid-epoch 1", p.Incidents)
	}
	last, want := p.Metrics[len(p.Metrics)-1], reference.Metrics[len(reference.Metrics)-1]
	if len(p.Metrics) != epochs || last.TestLoss != want.TestLoss || last.TestAccuracy != want.TestAccuracy || last.TrainLoss != want.TrainLoss {
		t.Fatalf("the preempted run ended with %+v; the run never stopped with %+v: want the same numbers", last, want)
	}
}
