package exectrainer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/trainer"
)

// A Ray-style program (durabletrain._rank: a function with its own loop)
// reports its epochs, the last one's metrics alone, then says its training
// finished at the next epoch: TrainEpoch says ErrFinished (the run ends
// there, completed) and Save after the metrics-only report says
// ErrNoCheckpoint (the run keeps its latest checkpoint).
func TestAProgramMayFinishEarlyAndReportWithoutACheckpoint(t *testing.T) {
	prog := `import os, durabletrain as dt
out = os.path.abspath("ck")
os.makedirs(out, exist_ok=True)
open(os.path.join(out, "w"), "w").write("1")
for epoch in dt.epochs():
    if epoch == 2:
        dt._send({"op": "finished", "epoch": epoch})
        dt._receive()
        break
    if epoch == 0:
        dt.report({"train_loss": 1.0}, checkpoint_dir=out)
    else:
        dt.report({"train_loss": 0.5}, checkpoint_optional=True)
`
	tr := startInline(t, prog, t.TempDir())
	ctx := context.Background()
	if _, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Save(ctx, trainer.MemState{}); err != nil {
		t.Fatalf("Save after a report with a checkpoint: %v", err)
	}
	if _, err := tr.TrainEpoch(ctx, 1, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := tr.Save(ctx, trainer.MemState{}); !errors.Is(err, trainer.ErrNoCheckpoint) {
		t.Fatalf("Save after a report of metrics alone: %v; want ErrNoCheckpoint", err)
	}
	if _, err := tr.TrainEpoch(ctx, 2, trainer.EpochOptions{}); !errors.Is(err, trainer.ErrFinished) {
		t.Fatalf("TrainEpoch of an epoch the program will not train: %v; want ErrFinished", err)
	}
}

// finished is the program's first answer to an epoch or a user error: a
// program that trained steps of the epoch and then says it finished would
// lose them silently.
func TestFinishedAfterTrainingStepsIsAUserError(t *testing.T) {
	prog := `import durabletrain as dt
for epoch in dt.epochs():
    for step in dt.steps(3):
        pass
    dt._send({"op": "finished", "epoch": epoch})
    dt._receive()
`
	tr := startInline(t, prog, t.TempDir())
	_, err := tr.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
	if !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "finished") {
		t.Fatalf("got %v; want a user error about finishing mid-epoch", err)
	}
}

// A program that could not bind its rendezvous port (another process took
// it between the worker's choice and the program's bind, on a busy host)
// failed for the host's reason, not its own: not a user error, so the run
// forms a new gang, with a new port, instead of failing.
func TestARendezvousPortTakenIsNotTheProgramsFault(t *testing.T) {
	taken := &ExitError{Rank: 0, What: "exited", MasterPort: 28822, Err: errors.New("exit status 1"), Stderr: []string{
		"W20261202 01:55:25.160533 21594 socket.cpp:426] [c10d] The server socket has failed to bind to [::]:28822 (errno: 98 - Address already in use).",
		"RuntimeError: The server socket has failed to listen on any local network address."}}
	if errors.Is(taken, trainer.ErrUser) {
		t.Fatalf("%v: a user error; want the host's", taken)
	}
	other := &ExitError{Rank: 0, What: "exited", MasterPort: 28822, Err: errors.New("exit status 1"), Stderr: []string{
		"OSError: [Errno 98] Address already in use: ('127.0.0.1', 8080)"}}
	if !errors.Is(other, trainer.ErrUser) {
		t.Fatalf("%v: a port of the program's own taken is its own error", other)
	}
}
