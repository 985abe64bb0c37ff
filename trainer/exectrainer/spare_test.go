package exectrainer

import (
	"context"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/trainer"
)

// frontDoorRank is a rank of the Python front door (python -m
// durabletrain._rank) running testdata/sparefn.py's loop, in dir.
func frontDoorRank(t *testing.T, dir string, spare bool) *Trainer {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	py, _ := filepath.Abs("../../python")
	data, _ := filepath.Abs("testdata")
	tr, err := New(Config{Command: []string{"/usr/bin/python3", "-m", "durabletrain._rank"}, Dir: dir, World: 1, Rank: 0, Epochs: 3,
		Env:     map[string]string{"DTPY_FUNCTION": "sparefn:loop", "PYTHONPATH": py + ":" + data, "DTPY_FRAMEWORK": "none", "WANT_DIR": dir},
		Scratch: t.TempDir(), PythonPath: py, Saves: true, Spare: spare})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

func trainedBy(t *testing.T, tr *Trainer, epoch int) map[string]float64 {
	t.Helper()
	if _, err := tr.TrainEpoch(context.Background(), epoch, trainer.EpochOptions{}); err != nil {
		t.Fatalf("epoch %d: %v", epoch, err)
	}
	e, err := tr.Evaluate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return e.Other
}

// A rank started again on its worker (a new gang after its program was
// killed) becomes the spare its first start left: the same interpreter,
// started ahead, now with the rank's environment and working directory;
// the spare after it is started in turn. Without warm_spare there is none.
func TestARankStartedAgainTakesItsSpare(t *testing.T) {
	defer func(d time.Duration) { spareDelay = d }(spareDelay)
	spareDelay = 0
	dir := t.TempDir()
	first := frontDoorRank(t, dir, true)
	if err := first.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := trainedBy(t, first, 0)
	if m["spare"] != 0 || m["in_dir"] != 1 || m["scratch_ok"] != 1 {
		t.Fatalf("the first start reports %v; want its own process, in %s", m, dir)
	}
	key, _ := first.spareKey()
	var sparePid int
	deadline := time.Now().Add(30 * time.Second)
	for sparePid == 0 && time.Now().Before(deadline) {
		spares.mu.Lock()
		if ps := spares.idle[key]; len(ps) == 1 {
			sparePid = ps[0].cmd.Process.Pid
		}
		spares.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	if sparePid == 0 {
		t.Fatal("no spare started for the rank")
	}
	syscall.Kill(-first.cmd.Process.Pid, syscall.SIGKILL) // the rank dies
	first.Close()

	again := frontDoorRank(t, dir, true)
	if err := again.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	m = trainedBy(t, again, 0)
	if m["spare"] != 1 || int(m["pid"]) != sparePid || m["in_dir"] != 1 || m["scratch_ok"] != 1 || m["rank"] != 0 {
		t.Fatalf("the second start reports %v; want the spare, process %d, in %s with its own scratch directory", m, sparePid, dir)
	}
	if m := trainedBy(t, again, 1); int(m["pid"]) != sparePid {
		t.Fatalf("epoch 1 was trained by %v", m)
	}

	plain := frontDoorRank(t, t.TempDir(), false)
	if err := plain.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	if k, ok := plain.spareKey(); ok {
		t.Fatalf("a rank without warm_spare keeps spares (key %s)", k)
	}
}

// Spares no rank keeps any more are stopped once spareIdle has passed.
func TestSparesNobodyKeepsAreStopped(t *testing.T) {
	defer func(d, i time.Duration) { spareDelay, spareIdle = d, i }(spareDelay, spareIdle)
	spareDelay, spareIdle = 0, 100*time.Millisecond
	tr := frontDoorRank(t, t.TempDir(), true)
	if err := tr.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	key, _ := tr.spareKey()
	var ps []*process
	for deadline := time.Now().Add(10 * time.Second); len(ps) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		spares.mu.Lock()
		ps = append([]*process(nil), spares.idle[key]...)
		spares.mu.Unlock()
	}
	if len(ps) != 1 {
		t.Fatalf("%d spares; want 1", len(ps))
	}
	tr.Close()
	select {
	case <-ps[0].exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the spare of a closed rank is still running")
	}
}
