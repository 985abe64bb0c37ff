package exectrainer

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	"testing/iotest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/race"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/trainertest"
)

func newCounter(t *testing.T, env map[string]string) *Trainer {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	py, _ := filepath.Abs("../../python")
	script, _ := filepath.Abs("testdata/counter.py")
	tr, err := New(Config{Command: []string{"/usr/bin/python3", script}, Dir: t.TempDir(), Env: env, World: 1,
		MasterAddr: "127.0.0.1", MasterPort: 1, Epochs: 10, Scratch: t.TempDir(), PythonPath: py, Saves: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// The program lives across epochs, its reported checkpoint directory is
// saved, and a new program restored from it goes on where the first stopped.
func TestEpochsSaveAndRestore(t *testing.T) {
	ctx := context.Background()
	a := newCounter(t, nil)
	if err := a.Init(ctx); err != nil {
		t.Fatal(err)
	}
	for epoch := range 3 {
		if _, err := a.TrainEpoch(ctx, epoch, trainer.EpochOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if e, _ := a.Evaluate(ctx); e.TestAccuracy != 0.06 { // 1+2+3
		t.Fatalf("evaluation %+v, want accuracy 0.06", e)
	}
	st := trainer.MemState{}
	if err := a.Save(ctx, st); err != nil {
		t.Fatal(err)
	}
	b := newCounter(t, nil)
	if err := b.Restore(ctx, st); err != nil {
		t.Fatal(err)
	}
	if b.Cursor() != (trainer.Cursor{Epoch: 3}) {
		t.Fatalf("restored cursor %+v", b.Cursor())
	}
	if _, err := b.TrainEpoch(ctx, 3, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	if e, _ := b.Evaluate(ctx); e.TestAccuracy != 0.10 { // 6 + 4
		t.Fatalf("after restoring and one more epoch: %+v, want accuracy 0.10", e)
	}
	// A damaged file is caught by its SHA-256, and nothing starts.
	st["files/value.json"] = []byte(`{"value": 999}`)
	c := newCounter(t, nil)
	if err := c.Restore(ctx, st); err == nil || !strings.Contains(err.Error(), "SHA-256") {
		t.Fatalf("restoring a damaged file: %v", err)
	}
	if c.cmd != nil {
		t.Fatal("a program started on a damaged checkpoint")
	}
}

// A rank that does not save (not rank 0) does not copy what the program reports.
func TestRanksThatDoNotSaveCopyNothing(t *testing.T) {
	ctx := context.Background()
	tr := newCounter(t, nil)
	tr.cfg.Saves = false
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	if copies, _ := filepath.Glob(filepath.Join(tr.cfg.Scratch, "saved-*")); len(copies) != 0 || tr.savedDir != "" {
		t.Fatalf("a rank that does not save copied %v", copies)
	}
	if err := tr.Save(ctx, trainer.MemState{}); err == nil || !strings.Contains(err.Error(), "not configured to save") {
		t.Fatalf("Save on a rank that does not save: %v", err)
	}
}

// A program that exits non-zero fails the epoch with its last lines of stderr.
func TestFailingProgramReportsItsStderr(t *testing.T) {
	ctx := context.Background()
	tr := newCounter(t, map[string]string{"FAIL_AT_EPOCH": "1"})
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := tr.TrainEpoch(ctx, 1, trainer.EpochOptions{})
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Killed() || !strings.Contains(err.Error(), "the data is broken at epoch 1") || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("got %v, want the program's exit status and its last stderr line", err)
	}
}

// A program's control socket closes before its exit status is known. One
// killed by a signal just after is a killed rank, not a user error, whether
// the worker finds the socket closed as it sends (a paused program told to
// go on) or as it reads (the next epoch); one that closes its socket and
// lives on is killed as broken, a user error, and never wedges the epoch.
func TestClosedControlSocketWaitsForTheExitStatus(t *testing.T) {
	for _, c := range []struct {
		name, then string
		paused     bool // closed while paused mid-epoch: found by the worker's send
	}{
		{"send/kill", "kill", true}, {"send/hang", "hang", true},
		{"read/kill", "kill", false}, {"read/hang", "hang", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			env := map[string]string{"CLOSE_THEN": c.then, "STEPS": "8"}
			if c.paused {
				env["CLOSE_ON_USR1"] = "1"
			} else {
				env["CLOSE_AFTER_EPOCH"] = "0"
			}
			tr := newCounter(t, env)
			if err := tr.Init(ctx); err != nil {
				t.Fatal(err)
			}
			if c.paused {
				if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: 3}); err != nil || !tr.paused {
					t.Fatalf("epoch 0 until step 3: %v (paused %v)", err, tr.paused)
				}
				tr.cmd.Process.Signal(syscall.SIGUSR1)
			} else if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond) // the socket is closed; the program lives on for 0.3 s more
			epoch := tr.cursor.Epoch
			_, err := tr.TrainEpoch(ctx, epoch, trainer.EpochOptions{})
			var ee *ExitError
			if !errors.As(err, &ee) {
				t.Fatalf("got %v; want an ExitError", err)
			}
			if c.then == "kill" && (!ee.Killed() || errors.Is(err, trainer.ErrUser)) {
				t.Fatalf("got %v (killed %v); want a killed rank, not a user error", err, ee.Killed())
			}
			if c.then == "hang" && (!errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "did not exit")) {
				t.Fatalf("got %v; want a user error saying the program did not exit", err)
			}
		})
	}
}

// Cancelling an epoch kills the program's whole process group at once.
func TestCancelKillsTheProcessGroup(t *testing.T) {
	tr := newCounter(t, map[string]string{"HANG": "1"})
	if err := tr.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	pid := tr.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	// The program hangs forever: only the cancel can end the epoch.
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v, want the context's error", err)
	}
	if err := exec.Command("kill", "-0", strconv.Itoa(pid)).Run(); err == nil {
		t.Fatalf("process %d still alive after the cancel", pid)
	}
}

// A program that cannot start is a user error (no retry will start it),
// naming the command: missing, not executable, or in a missing directory.
func TestProgramThatCannotStartIsAUserError(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "train.sh")
	os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644)
	for _, c := range []Config{
		{Command: []string{"/nonexistent/python9"}},
		{Command: []string{"python9-that-is-not-on-path"}},
		{Command: []string{notExec}},
		{Command: []string{"/bin/true"}, Dir: "/nonexistent/dir"},
	} {
		c.Scratch = t.TempDir()
		tr, _ := New(c)
		err := tr.Init(context.Background())
		if err == nil || !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), c.Command[0]) {
			t.Errorf("%v in %q: got %v; want a user error naming the command", c.Command, c.Dir, err)
		}
	}
}

// The conformance suite every backend passes, on the PyTorch example (DDP
// with gloo) over the committed Fashion-MNIST subset.
func TestConformance(t *testing.T) {
	if race.Enabled {
		// Its time goes to PyTorch, which the detector does not see; the
		// plain pass of make test runs it, and the protocol's Go side is
		// covered under the detector by the counter tests.
		t.Skip("under the race detector: the plain pass runs the PyTorch conformance suite")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("no PyTorch for /usr/bin/python3 (Debian's python3-torch): skipping")
	}
	py, _ := filepath.Abs("../../python")
	script, _ := filepath.Abs("../../examples/pytorch/train.py")
	data, _ := filepath.Abs("../../testdata/fashion-mnist-small")
	port := 0
	trainertest.Run(t, func(t testing.TB, comm trainer.Reducer) trainer.Trainer {
		if comm.Rank() == 0 { // one rendezvous port per gang, shared by its ranks
			if port = RendezvousPort("127.0.0.1"); port == 0 {
				t.Fatal("no free port for MASTER_PORT")
			}
		}
		// Stopping after every step, so that the suite sees and steers every step.
		tr, err := New(Config{Command: []string{"/usr/bin/python3", script, "--data", data, "--batch-size", "256", "--report-every", "1"}, Dir: t.TempDir(),
			Env: map[string]string{"OMP_NUM_THREADS": "1"}, Rank: comm.Rank(), World: comm.World(), MasterAddr: "127.0.0.1",
			MasterPort: port, Epochs: 10, Scratch: t.TempDir(), PythonPath: py, Saves: true, Comm: comm, SyncEvery: time.Nanosecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	})
}

// A rank's program gets torchrun's whole environment: where it sits on its
// host and among the hosts, the run and its restarts, and its GPU.
func TestProgramGetsTorchrunsEnvironment(t *testing.T) {
	vars := []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
		"ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}
	var line []string
	for _, v := range vars {
		line = append(line, v+"=${"+v+"}")
	}
	tr, err := New(Config{Command: []string{"/bin/sh", "-c", `echo "` + strings.Join(line, " ") + `" >&2; exit 3`},
		Rank: 43, World: 512, LocalRank: 3, LocalWorld: 8, GroupRank: 5, GroupWorld: 64, RunID: "run-a", Restarts: 2,
		MasterAddr: "10.0.0.1", MasterPort: 29500, Devices: "GPU-3", Epochs: 1, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.Init(context.Background())
	want := "RANK=43 WORLD_SIZE=512 LOCAL_RANK=3 LOCAL_WORLD_SIZE=8 GROUP_RANK=5 NODE_RANK=5 GROUP_WORLD_SIZE=64 ROLE_NAME=default ROLE_RANK=43 ROLE_WORLD_SIZE=512 TORCHELASTIC_RUN_ID=run-a TORCHELASTIC_RESTART_COUNT=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 CUDA_VISIBLE_DEVICES=GPU-3"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the program's environment, as it printed it: %v; want %s", err, want)
	}
}

// A run's config reaches its program whole, as JSON in DURABLETRAIN_CONFIG
// and as durabletrain.config() in the Python helper, numbers and lists as
// the spec wrote them.
func TestProgramGetsTheRunsConfig(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	py, _ := filepath.Abs("../../python")
	cfg := spec.Config{"lr": json.RawMessage(`0.00031`), "hidden": json.RawMessage(`[64, 32]`), "act": json.RawMessage(`"gelu"`)}
	prog := `import json, os, sys, durabletrain as dt
c = dt.config()
print("config=%s lr=%r hidden=%r act=%s env=%s" % (json.dumps(c, sort_keys=True), c["lr"], c["hidden"], c["act"], os.environ["DURABLETRAIN_CONFIG"]), file=sys.stderr)
sys.exit(3)`
	tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, MasterAddr: "127.0.0.1", MasterPort: 1,
		Epochs: 1, Scratch: t.TempDir(), PythonPath: py, Hyper: cfg.JSON()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.Init(context.Background())
	want := `config={"act": "gelu", "hidden": [64, 32], "lr": 0.00031} lr=0.00031 hidden=[64, 32] act=gelu env={"act":"gelu","hidden":[64,32],"lr":0.00031}`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("the program printed: %v; want %s", err, want)
	}
}

// Two programs in one exec.dir (two trials on one host) each get a directory
// of their own to save in, DURABLETRAIN_SCRATCH_DIR: a checkpoint written to
// the same relative path would be the one or the other's.
func TestProgramsSharingADirHaveDirectoriesOfTheirOwn(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	py, _ := filepath.Abs("../../python")
	shared := t.TempDir()
	prog := `import os, sys, durabletrain as dt
d = dt.scratch_dir()
open(os.path.join(d, "mine"), "w").write(os.environ["RANK"])
print("own=%s isdir=%s" % (d, os.path.isdir(d)), file=sys.stderr)
sys.exit(3)`
	var owns []string
	for i := range 2 {
		scratch := t.TempDir()
		tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, Dir: shared, World: 2, Rank: i, MasterAddr: "127.0.0.1", MasterPort: 1,
			Epochs: 1, Scratch: scratch, PythonPath: py})
		if err != nil {
			t.Fatal(err)
		}
		err = tr.Init(context.Background())
		tr.Close()
		if err == nil {
			t.Fatal("the program exited 3; Init succeeded")
		}
		m := regexp.MustCompile(`own=(\S+) isdir=True`).FindStringSubmatch(err.Error())
		if m == nil {
			t.Fatalf("the program printed: %v; want its own directory, made", err)
		}
		own := m[1]
		if !within(own, scratch) || within(own, shared) {
			t.Fatalf("rank %d's own directory is %s; want one in its scratch %s, not in the shared exec.dir %s", i, own, scratch, shared)
		}
		if b, err := os.ReadFile(filepath.Join(own, "mine")); err != nil || string(b) != fmt.Sprint(i) {
			t.Fatalf("rank %d's file in its own directory: %q, %v", i, b, err)
		}
		owns = append(owns, own)
	}
	if owns[0] == owns[1] {
		t.Fatalf("both programs were given %s", owns[0])
	}
}

// Whatever a program reports reaches the epoch's metrics: the three by
// their fields (those it did not report listed as absent), any other by
// name. A name no metric may have is refused, naming it.
func TestProgramReportsAnyMetric(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	py, _ := filepath.Abs("../../python")
	run := func(metrics string) (*Trainer, error) {
		prog := "import durabletrain as dt\nfor e in dt.epochs():\n    dt.report(" + metrics + ")\n"
		tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, MasterAddr: "127.0.0.1", MasterPort: 1,
			Epochs: 2, Scratch: t.TempDir(), PythonPath: py})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		if err := tr.Init(context.Background()); err != nil {
			t.Fatal(err)
		}
		_, err = tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
		return tr, err
	}
	tr, err := run(`{"train_loss": 0.25, "f1": 0.75, "val.bleu-4": 31.5}`)
	if err != nil {
		t.Fatal(err)
	}
	e, err := tr.Evaluate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if e.Other["f1"] != 0.75 || e.Other["val.bleu-4"] != 31.5 || len(e.Other) != 2 || strings.Join(e.Absent, ",") != "test_accuracy,test_loss" {
		t.Fatalf("evaluation %+v", e)
	}
	_, err = run(`{"val acc": 0.5}`)
	if err == nil || !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), `a metric is "val acc"; want a metric's name`) {
		t.Fatalf("a bad metric name: %v", err)
	}
	many := "{"
	for i := range 65 {
		many += fmt.Sprintf(`"m%d": %d, `, i, i)
	}
	_, err = run(many + "}")
	if err == nil || !strings.Contains(err.Error(), "has 65 metrics beyond test_accuracy, test_loss, train_loss; want at most 64") {
		t.Fatalf("too many metrics: %v", err)
	}
}

func newCounterRank(t *testing.T, env map[string]string, comm trainer.Reducer, sync time.Duration) *Trainer {
	t.Helper()
	tr := newCounter(t, env)
	tr.cfg.Comm, tr.cfg.Rank, tr.cfg.World, tr.cfg.SyncEvery = comm, comm.Rank(), comm.World(), sync
	return tr
}

// The worker logs what each call's stops at agreed steps cost the program
// (how many, how long it waited in all and at most, where the first came),
// so a slow epoch says whether the program trained slowly or waited.
func TestStopsAreLoggedWithWhatTheyCost(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	a := newCounterRank(t, map[string]string{"STEPS": "10"}, trainer.Local{}, time.Nanosecond)
	a.cfg.Log = zap.New(core)
	ctx := context.Background()
	if err := a.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	got := logs.FilterMessage("exec trainer: the program's stops at agreed steps").All()
	if len(got) != 1 {
		t.Fatalf("%d stop summaries logged for one call; want 1 (all: %v)", len(got), logs.All())
	}
	f := got[0].ContextMap()
	// After every step (SyncEvery 1ns) but the last: the ninth's go says
	// the epoch ends first.
	if f["stops"] != int64(9) || f["first_stop_step"] != int64(1) || f["epoch"] != int64(0) ||
		f["stopped"].(time.Duration) <= 0 || f["slowest_stop"].(time.Duration) > f["stopped"].(time.Duration) ||
		f["first_stop_after"].(time.Duration) > f["call"].(time.Duration) {
		t.Fatalf("stop summary %v", f)
	}
}

// readSeen is the steps a counter trained, as "epoch,step;…".
func readSeen(t *testing.T, path string) string {
	t.Helper()
	b, _ := os.ReadFile(path)
	var steps []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		steps = append(steps, strings.ReplaceAll(line, " ", ","))
	}
	return strings.Join(steps, ";")
}

// A program in durabletrain.steps() stops at the step asked for, saves
// there, and a new program restored from that checkpoint trains exactly the
// steps that were left: none twice, none lost.
func TestStepsStopSaveAndResumeAtTheStep(t *testing.T) {
	ctx := context.Background()
	seen := filepath.Join(t.TempDir(), "seen")
	env := map[string]string{"STEPS": "10", "SEEN": seen}
	a := newCounterRank(t, env, trainer.Local{}, time.Nanosecond)
	if err := a.Init(ctx); err != nil {
		t.Fatal(err)
	}
	var steps []int
	m, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: 4, Progress: func(p trainer.Progress) { steps = append(steps, p.Step) }})
	if err != nil {
		t.Fatal(err)
	}
	if a.Cursor() != (trainer.Cursor{Epoch: 0, Step: 4}) || m.Left || m.Steps != 10 || fmt.Sprint(steps) != "[1 2 3 4]" {
		t.Fatalf("after UntilStep 4: cursor %+v, metrics %+v, progress at steps %v", a.Cursor(), m, steps)
	}
	st := trainer.MemState{}
	if err := a.Save(ctx, st); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b := newCounterRank(t, env, trainer.Local{}, 50*time.Millisecond)
	if err := b.Restore(ctx, st); err != nil {
		t.Fatal(err)
	}
	if b.Cursor() != (trainer.Cursor{Epoch: 0, Step: 4}) {
		t.Fatalf("restored at %+v", b.Cursor())
	}
	if m, err = b.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	if b.Cursor() != (trainer.Cursor{Epoch: 1}) || m.Steps != 10 {
		t.Fatalf("after the rest of the epoch: cursor %+v, metrics %+v", b.Cursor(), m)
	}
	if got := readSeen(t, seen); got != "0,0;0,1;0,2;0,3;0,4;0,5;0,6;0,7;0,8;0,9" {
		t.Fatalf("steps trained (epoch step): %s", got)
	}
	if e, _ := b.Evaluate(ctx); e.TestAccuracy != float64(10*1000+45)/100 {
		t.Fatalf("evaluation %+v: the value is not the sum over every step once", e)
	}
}

// A report with a checkpoint inside steps() ends the call at its step, for
// the caller to checkpoint there, and the next call goes on after it.
func TestCheckpointReportInsideStepsEndsTheCallThere(t *testing.T) {
	ctx := context.Background()
	tr := newCounterRank(t, map[string]string{"STEPS": "6", "CHECKPOINT_AT": "2"}, trainer.Local{}, time.Hour)
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	if tr.Cursor() != (trainer.Cursor{Epoch: 0, Step: 3}) {
		t.Fatalf("cursor %+v after a checkpoint reported after step index 2; want epoch 0 step 3", tr.Cursor())
	}
	st := trainer.MemState{}
	if err := tr.Save(ctx, st); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st["files/value.json"]), `"step": 3`) {
		t.Fatalf("saved %s", st["files/value.json"])
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil || tr.Cursor() != (trainer.Cursor{Epoch: 1}) {
		t.Fatalf("the rest of the epoch: %v, cursor %+v", err, tr.Cursor())
	}
}

// A checkpoint due mid-epoch (every_steps) from a program that passes no
// save= is the user's error, saying what to pass.
func TestCheckpointDueWithoutSaveIsAUserError(t *testing.T) {
	tr := newCounterRank(t, map[string]string{"STEPS": "10", "NO_SAVE": "1"}, trainer.Local{}, time.Nanosecond)
	if err := tr.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, err := tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{UntilStep: 3})
	if !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "save=") || !strings.Contains(err.Error(), "step 3") {
		t.Fatalf("got %v; want a user error naming save= and the step", err)
	}
}

// A program that speaks anything but the protocol fails its rank as the
// user's error, quoting what it sent; an endless line is cut off.
func TestProgramOutsideTheProtocolIsAUserError(t *testing.T) {
	for _, c := range []struct{ name, code, want string }{
		{"garbage", `s.sendall(b"hello worker\n")`, `"hello worker"`},
		{"wrong op", `s.sendall(b'{"op": "sync", "epoch": 0, "step": 1}\n')`, `"sync" where "ready" was due`},
		{"endless line", `s.sendall(b"x" * (2 << 20))`, "longer than"},
		{"a step past any epoch", `s.sendall(b'{"op": "ready"}\n'); s.recv(4096); s.sendall(b'{"op": "sync", "epoch": 0, "step": 99999999999}\n')`, "at most 16777216"},
		{"a step backwards", `s.sendall(b'{"op": "ready"}\n'); s.recv(4096); s.sendall(b'{"op": "sync", "epoch": 0, "step": -3}\n')`, "want a step after it"},
		{"another epoch", `s.sendall(b'{"op": "ready"}\n'); s.recv(4096); s.sendall(b'{"op": "sync", "epoch": 7, "step": 1}\n')`, "of epoch 7 while it trains epoch 0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			prog := "import os, socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['DURABLETRAIN_CONTROL'])\n" + c.code + "\ntime.sleep(30)\n"
			tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, Scratch: t.TempDir(), Saves: true})
			if err != nil {
				t.Fatal(err)
			}
			defer tr.Close()
			if err := tr.Init(context.Background()); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
			if !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), c.want) || time.Since(start) > 10*time.Second {
				t.Fatalf("got %v after %v; want a user error with %s at once", err, time.Since(start), c.want)
			}
		})
	}
}

// Ranks whose programs report checkpoints at different steps fail, naming
// both, instead of training on apart; a rank whose program never gets to
// the gang's next agreed step fails its waiting peers after VoteTimeout.
func TestRanksThatDisagreeFailInsteadOfWaiting(t *testing.T) {
	t.Run("different events", func(t *testing.T) {
		errs := gangEpoch(t, []map[string]string{{"STEPS": "6"}, {"STEPS": "6", "CHECKPOINT_AT": "2"}}, time.Nanosecond, time.Minute)
		if !errors.Is(errs[1], trainer.ErrUser) || !strings.Contains(errs[1].Error(), "checkpoint report at epoch 0 step 3, but rank 0's is at its agreed stop at step 3") {
			t.Fatalf("rank 1: %v", errs[1])
		}
	})
	t.Run("a rank that never arrives", func(t *testing.T) {
		start := time.Now()
		errs := gangEpoch(t, []map[string]string{{"STEPS": "6"}, {"STEPS": "6", "HANG_AT": "2"}}, time.Nanosecond, time.Second)
		// The wait is VoteTimeout (1s) or 20 of the slowest steps so far,
		// whichever is longer: more than 1s on a loaded machine.
		if errs[0] == nil || !strings.Contains(errs[0].Error(), "did not get there within") || time.Since(start) < time.Second || time.Since(start) > 20*time.Second {
			t.Fatalf("rank 0 after %v: %v", time.Since(start), errs[0])
		}
	})
}

// gangEpoch trains epoch 0 on a gang of counters, one env each, and
// returns each rank's error. A rank that fails closes its collective and
// cancels the others, as the run's workflow does.
func gangEpoch(t *testing.T, envs []map[string]string, every, voteTimeout time.Duration) []error {
	groups := trainertest.Gang(t, len(envs))
	errs := make([]error, len(envs))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for r, env := range envs {
		tr := newCounterRank(t, env, groups[r], every)
		tr.cfg.VoteTimeout = voteTimeout
		wg.Go(func() {
			if errs[r] = tr.Init(ctx); errs[r] == nil {
				_, errs[r] = tr.TrainEpoch(ctx, 0, trainer.EpochOptions{})
			}
			if errs[r] != nil && ctx.Err() == nil {
				tr.Close()
				groups[r].Close()
				cancel()
			}
		})
	}
	wg.Wait()
	return errs
}

// ShardSampler gives each rank exactly what torch's DistributedSampler
// (shuffle, seed, drop_last) gives it, and skips the steps already trained.
func TestShardSamplerIsDistributedSamplersOrder(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		t.Skip("no PyTorch for /usr/bin/python3 (Debian's python3-torch): skipping")
	}
	py, _ := filepath.Abs("../../python")
	prog := `
import durabletrain as dt
from torch.utils.data.distributed import DistributedSampler
for world in (1, 2, 3):
    for rank in range(world):
        for epoch in (0, 5):
            s = dt.ShardSampler(103, batch_size=4, seed=7, rank=rank, world=world)
            s.set_epoch(epoch)
            d = DistributedSampler(range(103), num_replicas=world, rank=rank, shuffle=True, seed=7, drop_last=True)
            d.set_epoch(epoch)
            assert list(s) == list(d), (world, rank, epoch)
            assert len(s) == len(d)
            whole = list(s)
            s.set_epoch(epoch, start=3)
            assert list(s) == whole[12:] and len(s) == len(whole) - 12
print("ok")
`
	cmd := exec.Command("/usr/bin/python3", "-c", prog)
	cmd.Env = append(os.Environ(), "PYTHONPATH="+py)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v: %s", err, out)
	}
}

// A scratch directory too deep for a Unix socket's name (a long run name)
// still gets a control socket, in a short directory removed on Close.
func TestDeepScratchDirectoryStillConnects(t *testing.T) {
	tr := newCounter(t, map[string]string{"STEPS": "3"})
	tr.cfg.Scratch = filepath.Join(t.TempDir(), strings.Repeat("a-long-run-name-", 8), "rank")
	os.MkdirAll(tr.cfg.Scratch, 0o755)
	ctx := context.Background()
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := tr.sockDir
	if dir == "" {
		t.Fatal("no short socket directory for a deep scratch directory")
	}
	tr.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the socket directory %s outlived Close: %v", dir, err)
	}
}

// A worker that dies (SIGKILL) takes its ranks' programs with it: none is
// left behind holding a GPU or waiting on a dead peer. The test runs
// itself as the worker: a child process that starts a program and is
// killed.
func TestProgramsDieWithTheWorker(t *testing.T) {
	if scratch := os.Getenv("EXECTRAINER_TEST_WORKER"); scratch != "" {
		// Connected, then deaf to its socket: as a program blocked in a collective.
		// Its scratch is the parent's: this process is killed, and its own
		// t.TempDir would stay behind.
		prog := "import os, socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['DURABLETRAIN_CONTROL'])\ntime.sleep(600)\n"
		tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, Scratch: scratch})
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Init(context.Background()); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("program %d\n", tr.cmd.Process.Pid)
		time.Sleep(time.Minute)
		return
	}
	worker := exec.Command(os.Args[0], "-test.run", "^TestProgramsDieWithTheWorker$", "-test.v")
	worker.Env = append(os.Environ(), "EXECTRAINER_TEST_WORKER="+t.TempDir())
	out, _ := worker.StdoutPipe()
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	defer worker.Process.Kill()
	var pid int
	for sc := bufio.NewScanner(out); pid == 0 && sc.Scan(); {
		fmt.Sscanf(sc.Text(), "program %d", &pid)
	}
	if pid == 0 {
		t.Fatal("the worker started no program")
	}
	worker.Process.Signal(syscall.SIGKILL)
	worker.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("program %d outlived its worker by 5s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A metric that is not a finite number ends the program with a message
// that says the training diverged, as the user's error.
func TestNonFiniteMetricSaysTrainingDiverged(t *testing.T) {
	prog := "import durabletrain as dt\nfor e in dt.epochs():\n    dt.report({'train_loss': float('nan')})\n"
	tr := startInline(t, prog, t.TempDir())
	_, err := tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
	if !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "metric train_loss is nan at epoch 0") || !strings.Contains(err.Error(), "diverged") {
		t.Fatalf("got %v", err)
	}
}

// A program given no exec.dir runs in its scratch directory, never in the
// worker's own: what it writes there goes with the rank.
func TestProgramWithoutADirRunsInItsScratch(t *testing.T) {
	scratch := t.TempDir()
	tr, err := New(Config{Command: []string{"/bin/sh", "-c", `echo "cwd=$(pwd)" >&2; exit 3`}, World: 1, Scratch: scratch})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.Init(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cwd="+scratch) {
		t.Fatalf("got %v; want the program to start in %s", err, scratch)
	}
}

// A checkpoint_dir is the program's to name: a relative one is taken from
// the program's working directory, not the worker's; one that holds the
// rank's scratch directory (the program's own working directory when it
// has no dir, or any directory above it, "/" included) is refused as the
// user's error, not walked, since it holds the worker's control socket and
// the checkpoints it restored and saved; and one of more files than a
// manifest may list is refused, its partial copy removed.
func TestCheckpointDirIsTheProgramsOwn(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	for _, c := range []struct {
		name, dir string
		setup     string // Python run in the program's working directory, beside ckpt/value.json
		want      string
		scratch   bool // the error names the scratch directory
	}{
		{"relative", "ckpt", "", "", false},
		{"a link to a file", "ckpt", "os.rename('ckpt/value.json', 'v'); os.symlink(os.path.abspath('v'), 'ckpt/value.json')", "", false},
		{"its working directory, the scratch", ".", "", "which holds the rank's scratch directory", true},
		{"the root", "/", "", "which holds the rank's scratch directory", true},
		{"more files than a manifest lists", "ckpt", "for i in range(" + strconv.Itoa(MaxCheckpointFiles) + "): open('ckpt/f%05d' % i, 'w').close()",
			fmt.Sprintf("more than %d files", MaxCheckpointFiles), false},
		// Each of these blocked the worker for ever, past cancellation.
		{"a named pipe", "ckpt", "os.mkfifo('ckpt/pipe')", "pipe is a named pipe, not a regular file", false},
		{"a link to /dev/zero", "ckpt", "os.symlink('/dev/zero', 'ckpt/zeros')", "zeros is a character device, not a regular file", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			prog := "import os, durabletrain as dt\n" +
				"os.makedirs('ckpt', exist_ok=True)\n" +
				"open('ckpt/value.json', 'w').write('42')\n" +
				c.setup + "\n" +
				"for epoch in dt.epochs():\n" +
				"    # the epoch's report as durabletrain.report sends it, less its abspath: a program of its own\n" +
				"    dt._send({'op': 'report', 'epoch': epoch, 'step': 0, 'metrics': {'test_accuracy': 0.5}, 'checkpoint_dir': " + strconv.Quote(c.dir) + ", 'end': True})\n" +
				"    dt._receive()\n"
			scratch := t.TempDir()
			tr := startInline(t, prog, scratch)
			_, err := tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
			if c.want == "" {
				if err != nil {
					t.Fatalf("a relative checkpoint_dir: %v", err)
				}
				st := trainer.MemState{}
				if err := tr.Save(context.Background(), st); err != nil || string(st["files/value.json"]) != "42" {
					t.Fatalf("saved %v (%v); want the program's ckpt/value.json", st, err)
				}
				return
			}
			if !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want a user error saying %q", err, c.want)
			}
			if c.scratch && !strings.Contains(err.Error(), scratch) {
				t.Fatalf("got %v; want it to name the scratch directory %s", err, scratch)
			}
			if copies, _ := filepath.Glob(filepath.Join(scratch, "saved-*")); len(copies) != 0 {
				t.Fatalf("a refused checkpoint_dir left the copies %v", copies)
			}
		})
	}
}

// startInline starts a one-rank trainer that saves, in scratch, running the
// Python program prog with the durabletrain module on its path.
func startInline(t *testing.T, prog, scratch string) *Trainer {
	t.Helper()
	py, _ := filepath.Abs("../../python")
	tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, Scratch: scratch, PythonPath: py, Saves: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	if err := tr.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tr
}

// A checkpoint directory's files keep their names through a real
// checkpoint store, whatever the names: spaces, letters beyond ASCII, two
// dots, names longer than a blob key should be. Each file comes back, under
// its own name, to the program restored from it.
func TestAnyFileNameRoundTripsThroughAStore(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	ctx := context.Background()
	names := []string{"optimizer state.pt", "ü/modèle.bin", "model..pt", "epoch=3-step=100.ckpt", "a%20b", strings.Repeat("long", 60) + "/" + strings.Repeat("name", 60)}
	write := "import os, json, durabletrain as dt\n" +
		"names = " + pyList(names) + "\n" +
		"for epoch in dt.epochs():\n" +
		"    for n in names:\n" +
		"        p = os.path.join('ckpt', n); os.makedirs(os.path.dirname(p), exist_ok=True)\n" +
		"        open(p, 'w').write(n)\n" +
		"    dt.report({'test_accuracy': 0.5}, checkpoint_dir='ckpt')\n"
	a := startInline(t, write, t.TempDir())
	if _, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	store, err := checkpoint.Open(ctx, bloburl.FromPath(t.TempDir())+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w, err := store.Begin(ctx, "names", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Save(ctx, w); err != nil {
		t.Fatalf("saving files named %q: %v", names, err)
	}
	if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
		t.Fatal(err)
	}
	c, err := store.LatestVerified(ctx, "names")
	if err != nil {
		t.Fatal(err)
	}
	// The restored program checks every file, by name and content.
	check := "import os, sys, durabletrain as dt\n" +
		"names = " + pyList(names) + "\n" +
		"for epoch in dt.epochs():\n" +
		"    d = str(dt.get_checkpoint())\n" +
		"    for n in names:\n" +
		"        got = open(os.path.join(d, n)).read()\n" +
		"        if got != n: sys.exit('file %r holds %r' % (n, got))\n" +
		"    dt.report({'test_accuracy': 1.0}, checkpoint_dir=d)\n"
	py, _ := filepath.Abs("../../python")
	b, err := New(Config{Command: []string{"/usr/bin/python3", "-c", check}, World: 1, Scratch: t.TempDir(), PythonPath: py, Saves: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.Restore(ctx, c); err != nil {
		t.Fatalf("restoring files named %q: %v", names, err)
	}
	if _, err := b.TrainEpoch(ctx, 1, trainer.EpochOptions{}); err != nil {
		t.Fatalf("the restored program: %v", err)
	}
}

// pyList writes names as a Python list of strings.
func pyList(names []string) string {
	b, _ := json.Marshal(names)
	return string(b)
}

// A program's output is read whatever its lines: a progress bar that
// redraws its line with '\r' for a whole epoch (tqdm's way) and a line
// longer than any buffer are logged in pieces, never left unread, which
// would block the program on its next write and wedge its gang.
func TestEndlessOutputLinesAreReadAndLogged(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	prog := "import sys, durabletrain as dt\n" +
		"for epoch in dt.epochs():\n" +
		"    for i in range(30000): sys.stderr.write('\\rstep %6d of 30000 |' % i + '#' * 60)\n" + // 3 MiB, no newline
		"    sys.stdout.write('x' * (3 << 20)); sys.stdout.flush()\n" + // one line of 3 MiB
		"    sys.stderr.write('\\rdone\\r\\nlast line\\n'); sys.stderr.flush()\n" +
		"    dt.report({'test_accuracy': 0.5})\n"
	core, logs := observer.New(zap.InfoLevel)
	py, _ := filepath.Abs("../../python")
	tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, Scratch: t.TempDir(), PythonPath: py, Log: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatalf("a program writing endless lines: %v", err)
	}
	// The output is logged as it is read, beside the control socket's
	// messages: once the program has exited, all of it has been.
	tr.Close()
	stderr, stdout := 0, 0
	var lines []string
	for _, e := range logs.All() {
		switch e.ContextMap()["stream"] {
		case "stderr":
			stderr++
			lines = append(lines, e.Message)
			if len(e.Message) > maxOutputLine {
				t.Fatalf("a logged line of %d bytes; want at most %d", len(e.Message), maxOutputLine)
			}
		case "stdout":
			stdout += len(e.Message)
		}
	}
	if stderr < 30000 || stdout != 3<<20 {
		t.Fatalf("logged %d lines of stderr (want the 30,000 redraws and more) and %d bytes of stdout (want 3 MiB)", stderr, stdout)
	}
	// The redraws, then "done" and "last line" (Close may add a traceback
	// after them: the program, between epochs, finds its socket closed).
	if i := slices.Index(lines, "done"); i < 30000 || i+1 >= len(lines) || lines[i+1] != "last line" {
		t.Fatalf("stderr's lines from the 30,000th: %.300q; want \"done\", then \"last line\"", lines[min(30000, len(lines)):])
	}
}

// Lines end at '\n', '\r' and "\r\n" (one end, even when it arrives in two
// reads), and a line that goes on is cut every maxOutputLine bytes.
func TestSplitOutputLines(t *testing.T) {
	long := strings.Repeat("y", maxOutputLine)
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"a\nb\n", []string{"a", "b"}},
		{"a\r\nb", []string{"a", "b"}},
		{"\r10%\r20%\r\n", []string{"", "10%", "20%"}},
		{"a\r", []string{"a"}},
		{"a\n\nb", []string{"a", "", "b"}},
		{long + "zz\n", []string{long, "zz"}},
		{long + "\r\n", []string{long, ""}}, // the cut comes before the end is seen
	} {
		for _, oneByte := range []bool{false, true} {
			if oneByte && len(c.in) > 100 {
				continue // a scanner's buffer full, not its reads, cuts a long line
			}
			var r io.Reader = strings.NewReader(c.in)
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			sc := bufio.NewScanner(r)
			sc.Buffer(make([]byte, 16), maxOutputLine)
			sc.Split(splitOutputLines)
			var got []string
			for sc.Scan() {
				got = append(got, sc.Text())
			}
			if sc.Err() != nil || !slices.Equal(got, c.want) {
				t.Errorf("%.20q (one byte a read: %v): %.60q, %v; want %.60q", c.in, oneByte, got, sc.Err(), c.want)
			}
		}
	}
}

// A program that leaves a process of its own behind, in a session of its
// own (out of reach of the kill of its process group) and holding its
// stdout and stderr, still ends: the worker learns of the exit within
// outputWaitDelay of it, and its error, instead of waiting for the output
// to close, for as long as the leftover lives.
func TestALeftoverHoldingTheOutputDoesNotWedgeTheWorker(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	pidFile := filepath.Join(t.TempDir(), "leftover.pid")
	prog := "import os, subprocess, durabletrain as dt\n" +
		"p = subprocess.Popen(['sleep', '600'], start_new_session=True)\n" + // inherits stdout and stderr
		"open(" + strconv.Quote(pidFile) + ", 'a').write('%d\\n' % p.pid)\n" +
		"for epoch in dt.epochs():\n" +
		"    if epoch == 1: print('failing', flush=True); os._exit(3)\n" +
		"    dt.report({'test_accuracy': 0.5})\n"
	t.Cleanup(func() {
		b, _ := os.ReadFile(pidFile)
		for _, line := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(line); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	py, _ := filepath.Abs("../../python")
	tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, World: 1, Scratch: t.TempDir(), PythonPath: py})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = tr.TrainEpoch(ctx, 1, trainer.EpochOptions{})
	var exit *ExitError
	if !errors.As(err, &exit) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("a program that exited with 3, its leftover holding its output: %v; want its ExitError", err)
	}
	if took := time.Since(start); took > outputWaitDelay+exitStatusWait+5*time.Second {
		t.Fatalf("the exit took %v to learn", took)
	}
	// A program killed while its leftover lives ends as promptly.
	if err := tr.Init(ctx); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	tr.Close()
	if took := time.Since(start); took > outputWaitDelay+10*time.Second {
		t.Fatalf("Close took %v", took)
	}
}

// A worker whose scratch disk cannot hold the copy of a checkpoint
// directory fails the epoch as its own fault (another gang, on another
// worker, may have the room), not as the program's: before, the run
// failed for good as the user's error. (Root only: it mounts a tmpfs.)
func TestAFullScratchDiskIsTheWorkersFaultNotTheProgramsOwn(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	scratch := t.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("mounting a tmpfs: %v (root only)", err)
	}
	t.Cleanup(func() { unix.Unmount(scratch, unix.MNT_DETACH) })
	// The program's checkpoint (1.5 MiB) is elsewhere; the worker's copy of it does not fit in 1 MiB.
	ckpt := filepath.Join(t.TempDir(), "ckpt")
	prog := "import os, durabletrain as dt\n" +
		"os.makedirs(" + strconv.Quote(ckpt) + ", exist_ok=True)\n" +
		"open(os.path.join(" + strconv.Quote(ckpt) + ", 'state.bin'), 'wb').write(b'x' * (1536 << 10))\n" +
		"for epoch in dt.epochs():\n" +
		"    dt._send({'op': 'report', 'epoch': epoch, 'step': 0, 'metrics': {'test_accuracy': 0.5}, 'checkpoint_dir': " + strconv.Quote(ckpt) + ", 'end': True})\n" +
		"    dt._receive()\n"
	tr := startInline(t, prog, scratch)
	_, err := tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
	if err == nil || errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "on this worker") {
		t.Fatalf("a checkpoint the worker's scratch cannot hold: %v; want the worker's error naming its disk's, not the user's", err)
	}
	if copies, _ := filepath.Glob(filepath.Join(scratch, "saved-*")); len(copies) != 0 {
		t.Fatalf("the failed copy left %v", copies)
	}
}

// A program the worker cannot start for want of its own resources (here no
// file descriptor left: a worker that leaks them; likewise a fork refused
// for want of memory or processes) is the worker's fault, which another
// attempt or another worker may not have, not the user's, which ends the
// run for good. The test lowers its own descriptor limit, so it runs in a
// process of its own.
func TestAWorkerOutOfDescriptorsIsTheWorkersFaultNotTheProgramsOwn(t *testing.T) {
	if os.Getenv("EXECTRAINER_TEST_FD_LIMIT") == "" {
		child := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		child.Env = append(os.Environ(), "EXECTRAINER_TEST_FD_LIMIT=1")
		out, err := child.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "started under the limit:") {
			t.Fatalf("the test's own process: %v\n%s", err, out)
		}
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // the poller's own descriptors, opened before counting
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	tr, err := New(Config{Command: []string{"/bin/true"}, Scratch: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	low := lim
	low.Cur = lowestFreeDescriptor(t) + 1 // the control socket's, and no other
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	err = tr.Init(context.Background())
	unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	t.Logf("started under the limit: %v", err)
	if err == nil {
		tr.Close()
		t.Fatal("the program started with no descriptor left for its output")
	}
	if errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "too many open files") || !strings.Contains(err.Error(), "this worker") {
		t.Fatalf("got %v; want the worker's error, naming its limit, not the user's", err)
	}

	// Likewise a worker that cannot open the program's checkpoint
	// directory to keep its copy of it.
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	ckpt := t.TempDir()
	os.WriteFile(filepath.Join(ckpt, "state.bin"), []byte("state"), 0o644)
	prog := "import durabletrain as dt\n" +
		"for epoch in dt.epochs():\n" +
		"    dt._send({'op': 'report', 'epoch': epoch, 'step': 0, 'metrics': {'test_accuracy': 0.5}, 'checkpoint_dir': " + strconv.Quote(ckpt) + ", 'end': True})\n" +
		"    dt._receive()\n"
	tr = startInline(t, prog, t.TempDir())
	low.Cur = lowestFreeDescriptor(t) // no new descriptor
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	_, err = tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
	unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	t.Logf("kept the checkpoint under the limit: %v", err)
	if err == nil || errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "too many open files") || !strings.Contains(err.Error(), "on this worker") {
		t.Fatalf("got %v; want the worker's error, naming its limit, not the user's", err)
	}
}

// lowestFreeDescriptor is the number the next descriptor opened gets: a
// limit of it lets none be opened (the limit bounds numbers, not a count).
func lowestFreeDescriptor(t *testing.T) uint64 {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	fd := f.Fd()
	f.Close()
	return uint64(fd)
}
