package integration

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/internal/testdata"
	"github.com/durabletrain/durabletrain/spec"
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
	data := strings.TrimPrefix(testdata.FashionMNISTSmall(), "file://")
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
	s.Exec = &spec.Exec{Command: []string{"/usr/bin/python3", script, "--data", data, "--batch-size", "64"},
		Env: map[string]string{"OMP_NUM_THREADS": "1"}, Dir: t.TempDir()}
	run := startRun(t, c, "it-exec-1", queue, s)

	deadline := time.Now().Add(2 * time.Minute)
	killed := 0
	for killed == 0 && time.Now().Before(deadline) {
		p := progress(t, c, "it-exec-1")
		if p != nil && p.Epoch >= 1 && p.State == spec.StateTraining {
			out, _ := exec.Command("pgrep", "-f", script).Output()
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
