package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// BenchmarkTemporalVsDirect times the same 2-rank, 10-epoch training run
// twice per iteration: as two plain rank processes (bench train-rank), and
// through Temporal (two warm worker processes, the embedded server, from
// ExecuteWorkflow to completion). It reports the wall-time ratio; the target
// is at most 1.03 (Ray Train reports 2.5% over raw DDP). Full Fashion-MNIST
// when Debian's package is installed, the committed subset otherwise.
//
//	go test -run '^$' -bench TemporalVsDirect -benchtime 3x ./integration
func BenchmarkTemporalVsDirect(b *testing.B) {
	data := spec.DefaultDatasetURL
	if _, err := os.Stat("/usr/share/datasets/fashion-mnist"); err != nil {
		data = testdata.FashionMNISTSmall()
	}
	const epochs = 10
	benchBin := filepath.Join(b.TempDir(), "bench")
	if out, err := exec.Command("go", "build", "-o", benchBin, "../bench").CombinedOutput(); err != nil {
		b.Fatalf("building bench: %v\n%s", err, out)
	}
	queue := "bench-temporal"
	// The same settings as the direct ranks: one OS thread of Go and of BLAS per rank.
	env := []string{"OPENBLAS_NUM_THREADS=1", "GOMAXPROCS=1"}
	startWorker(b, "bench-a", "both", queue, env...)
	startWorker(b, "bench-b", "agent", queue, env...)
	c := dial(b)
	var direct, temporal time.Duration
	for i := range b.N {
		// Direct: the ranks as plain processes, the way bench train runs them.
		start := time.Now()
		if err := runDirect(benchBin, data, epochs); err != nil {
			b.Fatal(err)
		}
		direct += time.Since(start)

		s := spec.Training{Dataset: spec.Dataset{URL: data}, Hyper: spec.Hyper{Epochs: epochs},
			Scaling:    spec.Scaling{Workers: 2, TaskQueue: queue},
			Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(b.TempDir()) + "?metadata=skip", EveryEpochs: epochs}}
		start = time.Now()
		run := startRun(b, c, fmt.Sprintf("bench-temporal-%d-%d", time.Now().UnixNano(), i), queue, s)
		var p *spec.Progress
		if err := run.Get(context.Background(), &p); err != nil {
			b.Fatal(err)
		}
		temporal += time.Since(start)
	}
	b.ReportMetric(direct.Seconds()/float64(b.N), "direct-s")
	b.ReportMetric(temporal.Seconds()/float64(b.N), "temporal-s")
	b.ReportMetric(temporal.Seconds()/direct.Seconds(), "wall-ratio")
}

func runDirect(benchBin, data string, epochs int) error {
	peers := "127.0.0.1:47101,127.0.0.1:47102"
	cmds := make([]*exec.Cmd, 2)
	for r := range cmds {
		cmds[r] = exec.Command(benchBin, "train-rank", "-rank", fmt.Sprint(r), "-peers", peers, "-epochs", fmt.Sprint(epochs), "-data", data)
		cmds[r].Env = append(os.Environ(), "OPENBLAS_NUM_THREADS=1", "GOMAXPROCS=1")
		if err := cmds[r].Start(); err != nil {
			return err
		}
	}
	var errs []string
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			errs = append(errs, fmt.Sprintf("rank %d: %v", r, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("direct run: %s", strings.Join(errs, "; "))
	}
	return nil
}

// BenchmarkPyTorchExecVsDirect times examples/pytorch/train.py for 10 epochs
// on 2 ranks twice per iteration: launched directly with the same
// environment torchrun would give it (two processes, DURABLETRAIN_EPOCHS), and
// as an exec run through durabletrain (the embedded server, two warm worker
// processes, from ExecuteWorkflow to completion, checkpointing every epoch
// as the direct run writes its checkpoint directory every epoch too). It
// reports the wall-time ratio; the target is at most 1.05.
//
//	go test -run '^$' -bench PyTorchExecVsDirect -benchtime 2x ./integration
func BenchmarkPyTorchExecVsDirect(b *testing.B) {
	if err := exec.Command("/usr/bin/python3", "-c", "import torch").Run(); err != nil {
		b.Skip("no PyTorch for /usr/bin/python3 (Debian's python3-torch)")
	}
	data := "/usr/share/datasets/fashion-mnist"
	if _, err := os.Stat(data); err != nil {
		data = testdata.FashionMNISTSmallDir()
	}
	const epochs = 10
	py, _ := filepath.Abs("../python")
	script, _ := filepath.Abs("../examples/pytorch/train.py")
	args := []string{script, "--data", data, "--batch-size", "64"}
	// One thread per rank on both sides, with the same BLAS.
	threads := map[string]string{"OMP_NUM_THREADS": "1", "LD_LIBRARY_PATH": "/usr/lib/x86_64-linux-gnu/openblas-openmp"}
	queue := "bench-exec"
	startWorker(b, "bench-exec-a", "both", queue, "DURABLETRAIN_PYTHONPATH="+py)
	startWorker(b, "bench-exec-b", "agent", queue, "DURABLETRAIN_PYTHONPATH="+py)
	c := dial(b)
	var direct, through time.Duration
	for i := range b.N {
		start := time.Now()
		cmds := make([]*exec.Cmd, 2)
		for r := range cmds {
			cmds[r] = exec.Command("/usr/bin/python3", append(args, "--checkpoint-dir", filepath.Join(b.TempDir(), "ckpt"))...)
			cmds[r].Env = append(os.Environ(), "RANK="+fmt.Sprint(r), "WORLD_SIZE=2", "LOCAL_RANK="+fmt.Sprint(r), "MASTER_ADDR=127.0.0.1",
				"MASTER_PORT=29533", "DURABLETRAIN_EPOCHS="+fmt.Sprint(epochs), "PYTHONPATH="+py, "OMP_NUM_THREADS=1",
				"LD_LIBRARY_PATH="+threads["LD_LIBRARY_PATH"])
			cmds[r].Dir = b.TempDir()
			if err := cmds[r].Start(); err != nil {
				b.Fatal(err)
			}
		}
		for r, cmd := range cmds {
			if err := cmd.Wait(); err != nil {
				b.Fatalf("direct rank %d: %v", r, err)
			}
		}
		direct += time.Since(start)

		s := spec.Training{Trainer: "exec", Exec: &spec.Exec{Command: append([]string{"/usr/bin/python3"}, args...), Env: threads, Dir: b.TempDir()},
			// The program reads its own data; the spec's dataset is one the workers' storage roots allow.
			Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()},
			Hyper:   spec.Hyper{Epochs: epochs}, Scaling: spec.Scaling{Workers: 2, TaskQueue: queue},
			Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(b.TempDir()) + "?metadata=skip"}}
		start = time.Now()
		run := startRun(b, c, fmt.Sprintf("bench-exec-%d-%d", time.Now().UnixNano(), i), queue, s)
		var p *spec.Progress
		if err := run.Get(context.Background(), &p); err != nil {
			b.Fatal(err)
		}
		through += time.Since(start)
		if i == 0 {
			last := p.Metrics[len(p.Metrics)-1]
			b.Logf("through durabletrain: test accuracy %.4f after %d epochs", last.TestAccuracy, p.Epoch)
		}
	}
	b.ReportMetric(direct.Seconds()/float64(b.N), "direct-s")
	b.ReportMetric(through.Seconds()/float64(b.N), "durabletrain-s")
	b.ReportMetric(through.Seconds()/direct.Seconds(), "wall-ratio")
}
