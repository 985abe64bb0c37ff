// Command worker runs a durabletrain worker: the TrainingWorkflow, a GPU agent
// (one slot per GPU found by NVML, or -slots CPU slots), or both.
//
//	worker -address 127.0.0.1:7233 -role both -slots 1
//
// It runs the trainer backends and blob drivers it imports: native, exec;
// file://, mem://, s3://. A binary of your own that imports more runs more.
//
// SIGTERM or SIGINT stops taking work and tells running ranks to leave (a
// preemption for their runs), giving them -grace to finish.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"go.uber.org/zap"

	_ "github.com/durabletrain/durabletrain/blobdrivers" // file://, mem://, s3://
	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/gpuworker"
	"github.com/durabletrain/durabletrain/spec"
	_ "github.com/durabletrain/durabletrain/trainer/exectrainer" // "trainer": "exec"
	_ "github.com/durabletrain/durabletrain/trainer/native"      // "trainer": "native"
)

func main() {
	var cfg gpuworker.Config
	var conn connect.Options
	conn.Register(flag.CommandLine)
	role := flag.String("role", "both", "workflows, agent, or both")
	flag.StringVar(&cfg.TaskQueue, "task-queue", spec.DefaultTaskQueue, "task queue the GPU agents take slot requests from (scaling.task_queue)")
	flag.IntVar(&cfg.CPUSlots, "slots", 1, "CPU slots to offer where NVML finds no GPU")
	flag.StringVar(&cfg.CollectiveBind, "collective-bind", ":0", "address the collective listener binds")
	flag.StringVar(&cfg.CollectiveAdvertise, "collective-advertise", "", "address peers dial (default: the bound port on 127.0.0.1; set it on multi-host setups)")
	flag.StringVar(&cfg.CollectiveTransport, "collective-transport", "", `"" (shared memory between ranks on one host, else TCP) or "tcp"`)
	flag.StringVar(&cfg.PythonPath, "python-path", envOr("DURABLETRAIN_PYTHONPATH", pythonNextToBinary()), "directory holding the durabletrain Python module (python/ of the repository), for exec runs")
	flag.StringVar(&cfg.Identity, "identity", "", "worker identity (default hostname-pid)")
	flag.DurationVar(&cfg.Grace, "grace", 10*time.Second, "how long running ranks get to leave on shutdown")
	flag.Parse()
	cfg.ControlQueue = conn.ControlQueue
	switch *role {
	case "workflows":
		cfg.Workflows = true
	case "agent":
		cfg.Agent = true
	case "both":
		cfg.Workflows, cfg.Agent = true, true
	default:
		fmt.Fprintf(os.Stderr, "worker: -role is %q; want workflows, agent or both\n", *role)
		os.Exit(2)
	}
	log, _ := zap.NewProduction()
	defer log.Sync()
	cfg.Log = log
	c, err := conn.Dial(log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "worker: %v\n", err)
		os.Exit(3)
	}
	defer c.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := gpuworker.Run(ctx, c, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// envOr is the environment variable's value, or def where it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// pythonNextToBinary is ../python from the worker binary (bin/worker in a
// checkout), if the durabletrain module is there.
func pythonNextToBinary() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	dir := filepath.Join(filepath.Dir(filepath.Dir(exe)), "python")
	if _, err := os.Stat(filepath.Join(dir, "durabletrain", "__init__.py")); err != nil {
		return ""
	}
	return dir
}
