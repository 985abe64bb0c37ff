package exectrainer

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/trainer"
)

// keepaliveProgram trains epochs of steps through the real helper; each
// step runs body (Python, indented for the loop), with os, time and
// signal imported.
func keepaliveProgram(t *testing.T, body string, stall time.Duration) *Trainer {
	t.Helper()
	prog := "import os, signal, time\nimport durabletrain as dt\nfor epoch in dt.epochs():\n" +
		"    for step, _ in dt.steps(range(20)):\n" + body + "\n" +
		"    os.makedirs('ck', exist_ok=True)\n    dt.report({'train_loss': 1.0}, checkpoint_dir='ck')\n"
	return watchedProgram(t, prog, 2, stall)
}

// watchedProgram is the Python program prog as a rank of epochs epochs,
// started, whose keepalives are watched with stall.
func watchedProgram(t *testing.T, prog string, epochs int, stall time.Duration) *Trainer {
	t.Helper()
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	py, _ := filepath.Abs("../../python")
	tr, err := New(Config{Command: []string{"/usr/bin/python3", "-c", prog}, Dir: t.TempDir(), World: 1, Epochs: epochs,
		Scratch: t.TempDir(), PythonPath: py, Saves: true, StallTimeout: stall})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	if err := tr.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
	return tr
}

// A program stopped mid-epoch (SIGSTOP: a hang its process cannot get out
// of) is found within the stall timeout by its missing keepalives, killed,
// and its epoch fails as the rank's fault (not a user error), so the gang
// re-forms in seconds instead of waiting, blocked in a collective, for ever.
func TestAStoppedProgramIsFoundByItsMissingKeepalivesAndKilled(t *testing.T) {
	const stall = time.Second
	tr := keepaliveProgram(t, "        if step == 5:\n            os.kill(os.getpid(), signal.SIGSTOP)\n        time.sleep(0.01)", stall)
	pid := tr.cmd.Process.Pid
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{})
	took := time.Since(start)
	var stalled *StalledError
	if !errors.As(err, &stalled) {
		t.Fatalf("TrainEpoch: %v; want a StalledError", err)
	}
	if errors.Is(err, trainer.ErrUser) {
		t.Fatalf("%v is a user error; want the rank's fault, which a new gang may retry", err)
	}
	if stalled.Silence < stall || took > stall+3*time.Second {
		t.Fatalf("found after %v of silence, %v into the epoch; want at least %v of silence, within %v", stalled.Silence, took, stall, stall+3*time.Second)
	}
	for _, want := range []string{"rank 0", "keepalive", "failure.stall_timeout", "SIGSTOP"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error %q does not say %q", err, want)
		}
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("the stopped program, process %d, is still there", pid)
	}
}

// A program that is slow but running (a step of 3 stall timeouts, the main
// thread asleep as one blocked in a collective or a long kernel is) keeps
// its keepalives coming, and trains its epochs.
func TestASlowStepIsNotAStall(t *testing.T) {
	const stall = 500 * time.Millisecond
	tr := keepaliveProgram(t, "        if step == 3:\n            time.sleep(1.5)", stall)
	for epoch := range 2 {
		if _, err := tr.TrainEpoch(context.Background(), epoch, trainer.EpochOptions{}); err != nil {
			t.Fatalf("epoch %d: %v", epoch, err)
		}
	}
}

// A program that speaks the protocol without the helper, and so sends no
// keepalive, is not watched: a pause longer than the stall timeout between
// its messages (1.5 s of steps before its report) is no stall.
func TestAProgramThatSendsNoKeepaliveIsNotWatched(t *testing.T) {
	const stall = 300 * time.Millisecond
	// The helper with its keepalive thread switched off: DURABLETRAIN_KEEPALIVE empty.
	prog := "import os\nos.environ['DURABLETRAIN_KEEPALIVE'] = ''\nimport time\nimport durabletrain as dt\nfor epoch in dt.epochs():\n" +
		"    for step, _ in dt.steps(range(5)):\n        time.sleep(0.3)\n" +
		"    os.makedirs('ck', exist_ok=True)\n    dt.report({'train_loss': 1.0}, checkpoint_dir='ck')\n"
	quiet := watchedProgram(t, prog, 1, stall)
	if _, err := quiet.TrainEpoch(context.Background(), 0, trainer.EpochOptions{}); err != nil {
		t.Fatalf("a program without keepalives: %v", err)
	}
}
