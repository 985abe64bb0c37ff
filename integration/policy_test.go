package integration

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
)

// TestWorkerPolicyCannotBeWidenedByASpec makes the attacks of a user who
// can start workflows, against real workers: a spec that runs a shell on a
// worker with the default policy, one that writes checkpoints outside the
// worker's storage roots, and one that reads the worker's credentials from
// an allowed program's environment. Each fails the run at once as a user
// error; nothing runs, nothing is written, nothing leaks.
func TestWorkerPolicyCannotBeWidenedByASpec(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-policy"
	startWorker(t, "policy-ctl", "workflows", queue)
	// An agent with the default policy (no exec, default storage roots) and,
	// in its environment, a secret of the worker's.
	secret := []string{"AWS_SECRET_ACCESS_KEY=hunter2-" + t.Name()}
	startWorkerWith(t, "policy-default", "agent", queue, nil, secret...)
	c := dial(t)
	dir := t.TempDir()
	refused := func(id string, s spec.Training, want string) {
		t.Helper()
		run := startRun(t, c, id, queue, s)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := run.Get(ctx, nil)
		var app *temporal.ApplicationError
		if !errors.As(err, &app) || app.Type() != spec.ErrUser || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: got %v; want a user error containing %q", id, err, want)
		}
	}
	// 1. A shell on a worker that runs no exec program.
	marker := filepath.Join(dir, "ran")
	s := spec.Training{Trainer: spec.TrainerExec, Exec: &spec.Exec{Command: []string{"/bin/sh", "-c", "touch " + marker}},
		Hyper: spec.Hyper{Epochs: 1}, Scaling: spec.Scaling{TaskQueue: queue}, Failure: spec.Failure{HeartbeatTimeout: spec.Duration(3 * time.Second)}}
	refused("it-policy-exec", s, "runs no exec programs (its -allow-exec is empty)")
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the refused program ran")
	}
	// 2. Checkpoints outside the worker's storage roots (the native trainer,
	// the default data set).
	s = spec.Training{Hyper: spec.Hyper{Epochs: 1}, Scaling: spec.Scaling{TaskQueue: queue}, Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(dir) + "/stolen?create_dir=1"}}
	refused("it-policy-storage", s, "is outside the storage this worker allows (-storage-roots file:///var/lib/durabletrain/,file:///usr/share/datasets/,mem://)")
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("something was written outside the roots: %v", entries)
	}
	// 3. A parameter that would send the worker's requests elsewhere.
	s = spec.Training{Hyper: spec.Hyper{Epochs: 1}, Scaling: spec.Scaling{TaskQueue: queue}, Checkpoint: spec.Checkpoint{URL: "file:///var/lib/durabletrain/x?secret_key_path=/etc/shadow"}}
	refused("it-policy-param", s, `sets ?"secret_key_path"=`)

	// 4. An agent that allows /bin/sh: the program sees the torchrun
	// variables, not the worker's credentials.
	queue2 := "it-policy-env"
	startWorker(t, "policy-env-ctl", "workflows", queue2)
	startWorkerWith(t, "policy-env", "agent", queue2, append(append([]string{}, testPolicy...), "-allow-exec", "/bin/sh"), secret...)
	envFile := filepath.Join(dir, "env")
	s = subsetSpec(t, queue2, 1, 1)
	s.Trainer, s.Exec = spec.TrainerExec, &spec.Exec{Command: []string{"/bin/sh", "-c", "env > " + envFile + "; exit 3"}}
	run := startRun(t, c, "it-policy-env", queue2, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	run.Get(ctx, nil) // the program exits 3: a user error
	env, err := os.ReadFile(envFile)
	if err != nil {
		t.Fatalf("the allowed program did not run: %v", err)
	}
	if strings.Contains(string(env), "hunter2") || !strings.Contains(string(env), "RANK=0") || !strings.Contains(string(env), "PATH=") {
		t.Fatalf("the program's environment:\n%s", env)
	}
}
