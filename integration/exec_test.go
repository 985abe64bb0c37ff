package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// TestPyTorchExampleThroughDurabletrain runs examples/pytorch/train.py (DDP
// with gloo) as an exec run: 2 ranks, 3 epochs on the Fashion-MNIST subset,
// and mid-run one rank's Python process is killed with SIGKILL; the run
// re-forms its gang, restores the checkpoint directory, and completes above
// 0.8 test accuracy.
func TestPyTorchExampleThroughDurabletrain(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and PyTorch")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("no PyTorch for /usr/bin/python3 (Debian's python3-torch): skipping")
	}
	queue := "it-exec"
	py, _ := filepath.Abs("../python")
	script, _ := filepath.Abs("../examples/pytorch/train.py")
	data := testdata.FashionMNISTSmallDir()
	for _, name := range []string{"ctl", "agent-a", "agent-b", "agent-c"} {
		role := "agent"
		if name == "ctl" {
			role = "workflows"
		}
		startWorker(t, name, role, queue, "DURABLETRAIN_PYTHONPATH="+py)
	}
	c := dial(t)
	s := subsetSpec(t, queue, 2, 3)
	s.Trainer = "exec"
	// A marker of this run's own in its command line: other tests (other
	// packages, at the same time) run the same script.
	marker := fmt.Sprintf("ckpt-it-exec-1-%d-%%(rank)s", os.Getpid())
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script, "--data", data, "--batch-size", "64", "--checkpoint-dir", marker},
		Env: map[string]string{"OMP_NUM_THREADS": "1"}, Dir: t.TempDir()}
	run := startRun(t, c, "it-exec-1", queue, s)

	deadline := time.Now().Add(2 * time.Minute)
	killed := 0
	for killed == 0 && time.Now().Before(deadline) {
		p := progress(t, c, "it-exec-1")
		if p != nil && p.Epoch >= 1 && p.State == spec.StateTraining {
			out, _ := exec.Command("pgrep", "-f", strings.TrimSuffix(marker, "%(rank)s")).Output()
			if pids := strings.Fields(string(out)); len(pids) > 0 {
				pid, _ := strconv.Atoi(pids[len(pids)-1])
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					killed = pid
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if killed == 0 {
		t.Fatal("never found a rank's Python process to kill")
	}
	t.Logf("killed the Python process %d of one rank", killed)
	p := awaitRun(t, run, 4*time.Minute)
	last := p.Metrics[len(p.Metrics)-1]
	t.Logf("3 epochs of the PyTorch example, 2 ranks: test accuracy %.4f; %d failures, %d gangs", last.TestAccuracy, p.Failures, p.Generation)
	if p.State != spec.StateCompleted || p.Epoch != 3 || p.Failures < 1 || p.Generation < 2 {
		t.Fatalf("progress %+v", p)
	}
	if last.TestAccuracy <= 0.8 {
		t.Fatalf("test accuracy %.4f; want above 0.8", last.TestAccuracy)
	}
}

// TestExecGangStopsAtAStepAndResumesThere: examples/pytorch/train.py as a
// 2-rank exec run with checkpoint.every_steps 40. SIGTERM to a rank's worker
// mid-epoch is a preemption: both ranks' programs stop at one step, save
// there, the worker leaves within its grace period, and the new gang's
// programs resume at exactly that step. Then a rank's Python process is
// killed with SIGKILL mid-epoch: the run resumes at a step no earlier than
// the newest checkpoint when it was killed, so at most every_steps steps
// are lost.
func TestExecGangStopsAtAStepAndResumesThere(t *testing.T) {
	queue := "it-exec-step"
	agents := pytorchWorkers(t, queue, "agent-a", "agent-b", "agent-c")
	script, _ := filepath.Abs("../examples/pytorch/train.py")
	data := testdata.FashionMNISTSmallDir()
	c := dial(t)
	const every = 40
	s := subsetSpec(t, queue, 2, 3)
	s.Trainer = "exec"
	s.Checkpoint.EverySteps = every
	marker := fmt.Sprintf("ckpt-it-exec-step-%d-%%(rank)s", os.Getpid())
	// Batches of 8: 625 steps an epoch, so the faults land mid-epoch.
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script, "--data", data, "--batch-size", "8", "--checkpoint-dir", marker},
		Env: map[string]string{"OMP_NUM_THREADS": "1"}, Dir: t.TempDir()}
	run := startRun(t, c, "it-exec-step-1", queue, s)

	// 1. SIGTERM to rank 1's worker in epoch 1.
	sigtermRankWorker(t, c, "it-exec-step-1", agents, 1, 2)
	deadline := time.Now().Add(3 * time.Minute)

	// 2. SIGKILL to a rank's Python process in epoch 2, once a mid-epoch
	// checkpoint is in: the newest one then is the least it may resume from.
	store, err := checkpoint.Open(context.Background(), s.Checkpoint.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	newestStep := 0
	for newestStep == 0 && time.Now().Before(deadline) {
		p := progress(t, c, "it-exec-step-1")
		if p != nil && p.Epoch >= 2 && p.State == spec.StateTraining {
			ids, _ := store.IDs(context.Background(), "it-exec-step-1")
			newest := ""
			for _, id := range ids {
				if strings.HasPrefix(id, "ckpt-e000002-") && id > newest {
					newest = id
				}
			}
			var step int
			fmt.Sscanf(strings.TrimPrefix(newest, "ckpt-e000002-"), "s%d", &step)
			out, _ := exec.Command("pgrep", "-f", strings.TrimSuffix(marker, "%(rank)s")).Output()
			if pids := strings.Fields(string(out)); step > 0 && len(pids) > 0 {
				pid, _ := strconv.Atoi(pids[len(pids)-1])
				if syscall.Kill(pid, syscall.SIGKILL) == nil {
					newestStep = step
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if newestStep == 0 {
		t.Fatal("the run never checkpointed mid-epoch 2")
	}
	p := awaitRun(t, run, 4*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != 3 || p.Preemptions != 1 || p.Failures < 1 {
		t.Fatalf("progress %+v", p)
	}
	var stopped int
	for _, inc := range p.Incidents {
		if _, err := fmt.Sscanf(inc.Detail[max(0, strings.Index(inc.Detail, "checkpointed at epoch 1 step")):], "checkpointed at epoch 1 step %d", &stopped); err == nil {
			break
		}
	}
	if stopped == 0 {
		t.Fatalf("incidents %+v: want a preemption that checkpointed mid-epoch 1", p.Incidents)
	}
	// Where each new gang's programs resumed, from their own words in the workers' logs.
	resumed := map[int][]int{} // epoch -> steps
	for _, w := range agents {
		for _, line := range strings.Split(w.logs.String(), "\n") {
			i := strings.Index(line, "resumed from ")
			if i < 0 || !strings.Contains(line, `"stream":"stderr"`) { // the program's own line, not a failure quoting it
				continue
			}
			var rank, epoch, step int
			var dir string
			if _, err := fmt.Sscanf(strings.ReplaceAll(line[strings.LastIndex(line[:i], "rank "):], " at epoch ", " "), "rank %d: resumed from %s %d step %d", &rank, &dir, &epoch, &step); err == nil {
				resumed[epoch] = append(resumed[epoch], step)
			}
		}
	}
	t.Logf("preempted at epoch 1 step %d; killed at epoch 2 with the newest checkpoint at step %d; programs resumed at %v", stopped, newestStep, resumed)
	if fmt.Sprint(resumed[1]) != fmt.Sprint([]int{stopped, stopped}) {
		t.Fatalf("after the preemption at epoch 1 step %d, the ranks resumed at %v", stopped, resumed[1])
	}
	if len(resumed[2]) != 2 || resumed[2][0] != resumed[2][1] || resumed[2][0] < newestStep {
		t.Fatalf("after the kill in epoch 2 (newest checkpoint at step %d), the ranks resumed at %v: more than every_steps (%d) lost", newestStep, resumed[2], every)
	}
	if last := p.Metrics[len(p.Metrics)-1]; last.TestAccuracy <= 0.8 {
		t.Fatalf("test accuracy %.4f; want above 0.8", last.TestAccuracy)
	}
}

// TestTunePyTorchExampleWithASHA tunes examples/pytorch/train.py as Ray Tune
// tunes a trainable: a search over its learning rate and width
// ("config.lr", "config.hidden") with ASHA, each trial a real Python process
// on a real worker. Every trial's checkpoint records the config its program
// read (durabletrain.config()), and it must be the trial's own.
func TestTunePyTorchExampleWithASHA(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and PyTorch")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("no PyTorch for /usr/bin/python3 (Debian's python3-torch): skipping")
	}
	queue := "it-exec-tune"
	py, _ := filepath.Abs("../python")
	script, _ := filepath.Abs("../examples/pytorch/train.py")
	data := testdata.FashionMNISTSmallDir()
	startWorker(t, "ctl", "workflows", queue)
	startWorker(t, "agent-a", "agent", queue, "DURABLETRAIN_PYTHONPATH="+py)
	startWorker(t, "agent-b", "agent", queue, "DURABLETRAIN_PYTHONPATH="+py)
	c := dial(t)
	ckpt := bloburl.FromPath(t.TempDir()) + "?metadata=skip"
	search := map[string]any{
		"name": "it-exec-tune-1",
		"train": map[string]any{
			"trainer":    "exec",
			"exec":       map[string]any{"command": []string{"/usr/bin/python3", script, "--data", data}, "env": map[string]string{"OMP_NUM_THREADS": "1"}, "dir": t.TempDir()},
			"dataset":    map[string]any{"url": testdata.FashionMNISTSmall()},
			"hyper":      map[string]any{"epochs": 4},
			"scaling":    map[string]any{"workers": 1, "task_queue": queue},
			"checkpoint": map[string]any{"url": ckpt},
			"failure":    map[string]any{"heartbeat_timeout": "5s"},
		},
		"param_space": map[string]any{
			"config.lr":     map[string]any{"loguniform": []float64{1e-5, 1e-1}},
			"config.hidden": map[string]any{"grid_search": [][]int{{16}, {256, 128}}},
		},
		"num_samples": 3, "metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2, "seed": 5,
		"scheduler": map[string]any{"type": "asha", "grace_period": 1, "reduction_factor": 3, "max_t": 4},
	}
	raw, _ := json.Marshal(search)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "it-exec-tune-1", TaskQueue: queue + "-control"}, spec.WorkflowTune, json.RawMessage(raw))
	if err != nil {
		t.Fatal(err)
	}
	var res spec.TuneResults
	if err := run.Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	early := 0
	for _, tr := range res.Trials {
		cfg := spec.Config(tr.Config).JSON()
		t.Logf("trial %d %-13s %s epochs %d last %.4f %s", tr.Trial, tr.Status, cfg, tr.Epochs, deref(tr.Last), tr.Reason)
		switch tr.Status {
		case spec.TrialEarlyStop:
			early++
		case spec.TrialCompleted:
		default:
			t.Errorf("trial %d %s: %s", tr.Trial, tr.Status, tr.Reason)
			continue
		}
		if tr.Checkpoint == nil {
			t.Errorf("trial %d has no checkpoint", tr.Trial)
			continue
		}
		// What the program read, as it wrote it into its checkpoint.
		seen := readExecMeta(t, tr.Checkpoint)
		want := map[string]json.RawMessage{"lr": tr.Config["config.lr"], "hidden": tr.Config["config.hidden"]}
		var got, wanted any
		json.Unmarshal([]byte(spec.Config(seen.Config).JSON()), &got)
		json.Unmarshal([]byte(spec.Config(want).JSON()), &wanted)
		if !reflect.DeepEqual(got, wanted) {
			t.Errorf("trial %d: its program read the config %s; want %s", tr.Trial, spec.Config(seen.Config).JSON(), spec.Config(want).JSON())
		}
		var lr float64
		json.Unmarshal(tr.Config["config.lr"], &lr)
		if len(seen.ParamGroups) != 1 || seen.ParamGroups[0].LR != lr {
			t.Errorf("trial %d: the optimizer's learning rate was %+v; want %v", tr.Trial, seen.ParamGroups, lr)
		}
	}
	if len(res.Trials) != 6 || res.Best < 0 {
		t.Fatalf("results %+v", res)
	}
	best := res.Trials[res.Best]
	t.Logf("best: trial %d (%s), test accuracy %.4f; %d of 6 stopped early by ASHA", best.Trial, spec.Config(best.Config).JSON(), deref(best.Last), early)
	if early < 1 {
		t.Fatalf("ASHA stopped none of 6 trials whose learning rates span 4 decades")
	}
	if deref(best.Last) < 0.75 {
		t.Fatalf("the best trial's test accuracy is %.4f; want at least 0.75", deref(best.Last))
	}
}

// execMeta is what examples/pytorch/train.py writes beside its weights.
type execMeta struct {
	Epoch       int                        `json:"epoch"`
	Config      map[string]json.RawMessage `json:"config"`
	ParamGroups []struct {
		LR float64 `json:"lr"`
	} `json:"param_groups"`
}

// readExecMeta reads meta.json of an exec run's checkpoint, verified.
func readExecMeta(t *testing.T, ref *spec.CheckpointRef) execMeta {
	t.Helper()
	store, err := checkpoint.Open(context.Background(), ref.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ck, err := store.Verify(context.Background(), ref.Run, ref.ID)
	if err != nil {
		t.Fatal(err)
	}
	r, err := ck.Open(context.Background(), "files/meta.json")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var m execMeta
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		t.Fatalf("meta.json of %s: %v", ref.ID, err)
	}
	return m
}

// TestReferenceResNet18OnCPU runs the reference run's program
// (examples/pytorch/resnet18_fashion_mnist.py: torchvision ResNet-18 with a
// one-channel stem, Adam, batches of 128) through durabletrain as a 2-rank
// exec run on CPU: one short epoch on the first 2,048 images of the
// committed subset, checkpointing every 4 steps. The full run (10 epochs,
// 60,000 images, ≥ 0.8976) needs a GPU: see BENCHMARKS.md.
func TestReferenceResNet18OnCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes and PyTorch")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import torch, torchvision").Run(); err != nil {
		t.Skip("no PyTorch and torchvision for /usr/bin/python3 (Debian's python3-torch, python3-torchvision): skipping")
	}
	queue := "it-resnet"
	pytorchWorkers(t, queue, "agent-a", "agent-b")
	script, _ := filepath.Abs("../examples/pytorch/resnet18_fashion_mnist.py")
	data := testdata.FashionMNISTSmallDir()
	c := dial(t)
	s := subsetSpec(t, queue, 2, 1)
	s.Trainer = "exec"
	s.Checkpoint.EverySteps = 4
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script, "--data", data, "--limit", "2048", "--report-every", "2"},
		Env: map[string]string{"OMP_NUM_THREADS": "1"}, Dir: t.TempDir()}
	start := time.Now()
	run := startRun(t, c, "it-resnet-1", queue, s)
	p := awaitRun(t, run, 5*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != 1 || len(p.Metrics) != 1 {
		t.Fatalf("progress %+v", p)
	}
	m := p.Metrics[0]
	t.Logf("ResNet-18, 2 CPU ranks, one epoch of 2,048 images (%d steps): %.1f s in all, epoch %.1f s, train loss %.3f, test accuracy %.4f on %s",
		m.Steps, time.Since(start).Seconds(), m.Seconds, m.TrainLoss, m.TestAccuracy, "the subset's 1,000 test images")
	// One short epoch from scratch: well above chance (0.1), far from the reference's 10 epochs.
	if m.Steps != 8 || m.TestAccuracy < 0.3 || m.Other["samples"] != 2048 {
		t.Fatalf("metrics %+v", m)
	}
	store, err := checkpoint.Open(context.Background(), s.Checkpoint.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cp, err := store.LatestVerified(context.Background(), "it-resnet-1")
	if err != nil || cp.Manifest.Epoch != 1 || cp.Manifest.Step != 0 {
		t.Fatalf("latest verified checkpoint %+v: %v", cp, err)
	}
}

// TestShardedCheckpointResumesBitIdentical: examples/pytorch/train.py with
// --zero (ZeroRedundancyOptimizer: each rank holds Adam's state for its own
// part of the parameters) and checkpoint.sharded, 2 ranks, 2 epochs. One run
// goes straight through; the other's rank-1 worker is SIGTERMed mid-epoch,
// so every rank saves its own part at one step and each resumes from its
// own part on a new gang. The two runs' final checkpoints are the same
// bytes, part for part.
func TestShardedCheckpointResumesBitIdentical(t *testing.T) {
	queue := "it-shard"
	agents := pytorchWorkers(t, queue, "agent-a", "agent-b", "agent-c")
	script, _ := filepath.Abs("../examples/pytorch/train.py")
	data := testdata.FashionMNISTSmallDir()
	c := dial(t)
	s := subsetSpec(t, queue, 2, 2)
	s.Trainer = "exec"
	s.Checkpoint.Sharded = true
	s.Checkpoint.KeepLast = spec.Int(0)
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script, "--data", data, "--batch-size", "8", "--zero"},
		Env: map[string]string{"OMP_NUM_THREADS": "1"}, Dir: t.TempDir()}

	straight := awaitRun(t, startRun(t, c, "it-shard-straight", queue, s), 3*time.Minute)
	if straight.State != spec.StateCompleted || straight.Preemptions != 0 {
		t.Fatalf("the straight run: %+v", straight)
	}
	run := startRun(t, c, "it-shard-preempted", queue, s)
	sigtermRankWorker(t, c, "it-shard-preempted", agents, 1, 2)
	p := awaitRun(t, run, 3*time.Minute)
	if p.State != spec.StateCompleted || p.Preemptions != 1 || len(p.Incidents) == 0 || !strings.Contains(p.Incidents[0].Detail, "checkpointed at epoch 1 step") {
		t.Fatalf("the preempted run: %+v", p)
	}
	store, err := checkpoint.Open(context.Background(), s.Checkpoint.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	final := func(run string) checkpoint.Manifest {
		cp, err := store.Committed(context.Background(), run, checkpoint.ID(2, 0))
		if err != nil {
			t.Fatal(err)
		}
		return cp.Manifest
	}
	a, b := final("it-shard-straight"), final("it-shard-preempted")
	sums := func(m checkpoint.Manifest) map[string]string {
		out := map[string]string{}
		for _, o := range m.Objects {
			out[o.Name] = o.Hash()
		}
		return out
	}
	t.Logf("preempted: %s; final checkpoints of %d and %d objects over %d and %d shards", p.Incidents[0].Detail, len(a.Objects), len(b.Objects), a.Shards, b.Shards)
	if a.Shards != 2 || b.Shards != 2 || !reflect.DeepEqual(sums(a), sums(b)) {
		t.Fatalf("the final checkpoints differ:\nstraight  %v\npreempted %v", sums(a), sums(b))
	}
	if sa, sb := sums(a)["shards/0/files/state.pt"], sums(a)["shards/1/files/state.pt"]; sa == "" || sa == sb {
		t.Fatalf("rank 0's and rank 1's parts are %q and %q: want two different parts", sa, sb)
	}
}

// pytorchWorkers skips without PyTorch, and starts a workflows worker and
// the named agents (with the durabletrain Python module) on queue.
func pytorchWorkers(t *testing.T, queue string, agentNames ...string) []*workerProc {
	t.Helper()
	if testing.Short() {
		t.Skip("starts worker processes and PyTorch")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("no PyTorch for /usr/bin/python3 (Debian's python3-torch): skipping")
	}
	py, _ := filepath.Abs("../python")
	startWorker(t, "ctl", "workflows", queue)
	var agents []*workerProc
	for _, name := range agentNames {
		// A grace of 5 s, not 2: a PyTorch rank that saves as it leaves
		// took over 2 s on a 2-core machine busy with other packages' tests.
		agents = append(agents, startWorkerWith(t, name, "agent", queue, append(slices.Clone(testPolicy), "-grace", "5s"), "DURABLETRAIN_PYTHONPATH="+py))
	}
	return agents
}

// sigtermRankWorker waits until run trains epoch 1 or later with a gang of
// world ranks, lets it go 300 ms into the epoch, SIGTERMs the agent that
// holds rank, and waits up to 10 s for it to exit.
func sigtermRankWorker(t *testing.T, c client.Client, run string, agents []*workerProc, rank, world int) *workerProc {
	t.Helper()
	victim, took := sigtermRankWorkerWithin(t, c, run, agents, rank, world, 10*time.Second, false, false)
	t.Logf("%s exited after SIGTERM in %v", victim.name, took.Round(time.Millisecond))
	return victim
}

// linkedRanksScript is an exec program whose two ranks talk to each other
// directly every step, as torch.distributed's gloo or NCCL do, over a TCP
// link rank 0 opens on MASTER_PORT: a peer that dies resets the link, and
// the survivor's program raises and exits 1 by itself, as a PyTorch rank
// does ("Connection closed by peer").
const linkedRanksScript = `import os, socket, time, durabletrain as dt
rank = dt.world_rank()
addr, port = os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT'])
ckdir = os.path.abspath('ckpt-%d-%d' % (rank, os.getpid()))
os.makedirs(ckdir, exist_ok=True)
if rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(1)
    peer, _ = srv.accept()
else:
    for _ in range(400):
        try:
            peer = socket.create_connection((addr, port))
            break
        except OSError:
            time.sleep(0.05)
def exchange():
    peer.sendall(b'x')
    if peer.recv(1) != b'x':
        raise RuntimeError('the peer closed the link')
dt.get_checkpoint()
for epoch in dt.epochs():
    for step, _ in dt.steps(range(150)):
        exchange()
        time.sleep(0.01)
    open(os.path.join(ckdir, 'epoch'), 'w').write(str(epoch))
    dt.report({'train_loss': 1.0 / (epoch + 1), 'test_loss': 1.0, 'test_accuracy': 0.5}, checkpoint_dir=ckdir)
`

// TestAnExecRunSurvivesAWorkerKilledUnderIt: a 2-rank exec run whose
// programs talk to each other directly (linkedRanksScript, standard library
// only), and a worker holding one of its ranks killed with SIGKILL mid-run.
// Its program dies with it (Pdeathsig), the other rank's program fails by
// itself on the reset link, and the run must count that as the gang's
// failure, a worker's, and go on with a spare: not as the user's error,
// which would end it.
func TestAnExecRunSurvivesAWorkerKilledUnderIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-exec-kill"
	py, _ := filepath.Abs("../python")
	dir := t.TempDir()
	script := filepath.Join(dir, "linked.py")
	if err := os.WriteFile(script, []byte(linkedRanksScript), 0o644); err != nil {
		t.Fatal(err)
	}
	startWorker(t, "exec-kill-ctl", "workflows", queue, "DURABLETRAIN_PYTHONPATH="+py)
	var agents []*workerProc
	for i := range 3 { // one spare
		agents = append(agents, startWorker(t, fmt.Sprintf("exec-kill-%d", i), "agent", queue, "DURABLETRAIN_PYTHONPATH="+py))
	}
	c := dial(t)
	s := subsetSpec(t, queue, 2, 3)
	s.Trainer = "exec"
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script}, Dir: dir}
	id := "it-exec-kill-1"
	run := startRun(t, c, id, queue, s)
	victim := killRankWorker(t, c, id, agents, 1)
	t.Logf("killed %s", victim.name)
	p := awaitRun(t, run, 4*time.Minute)
	if p.State != spec.StateCompleted || p.Epoch != 3 || p.Generation < 2 {
		t.Fatalf("after a worker under the exec run was killed: %+v; want it completed by a new gang", p)
	}
	t.Logf("completed: %d gangs, %d failures, incidents %+v", p.Generation, p.Failures, p.Incidents)
}
