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

// TestRunsCannotTakeEachOthersCheckpoints: a second run that names the same
// checkpoint run as a finished one (the same spec "name" in the same storage)
// fails at once as a user error naming the owner, and the first run's
// checkpoints are all still there, unchanged; a run that starts from them
// with resume_from may read them.
func TestRunsCannotTakeEachOthersCheckpoints(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-own"
	startWorker(t, "own-worker", "both", queue)
	c := dial(t)
	s := subsetSpec(t, queue, 1, 2)
	s.Name = "shared-name"
	first := awaitRun(t, startRun(t, c, "it-own-first", queue, s), 2*time.Minute)
	if first.State != spec.StateCompleted {
		t.Fatalf("first run ended %s", first.State)
	}
	dir, err := bloburl.LocalPath("checkpoint.url", s.Checkpoint.URL)
	if err != nil {
		t.Fatal(err)
	}
	snapshot := func() map[string]time.Time {
		m := map[string]time.Time{}
		filepath.Walk(filepath.Join(dir, "shared-name"), func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				m[p] = fi.ModTime()
			}
			return nil
		})
		return m
	}
	before := snapshot()

	run := startRun(t, c, "it-own-second", queue, s)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = run.Get(ctx, nil)
	var app *temporal.ApplicationError
	if !errors.As(err, &app) || app.Type() != spec.ErrUser || !strings.Contains(err.Error(), "belongs to it-own-first") {
		t.Fatalf("second run with the same name: %v; want a user error naming the owner", err)
	}
	after := snapshot()
	if len(after) != len(before) {
		t.Fatalf("the first run's files changed: %d before, %d after", len(before), len(after))
	}
	for p, mt := range before {
		if !after[p].Equal(mt) {
			t.Fatalf("%s was rewritten", p)
		}
	}

	// Starting from its checkpoints under a name of one's own is allowed.
	s2 := s
	s2.Name, s2.ResumeFrom, s2.Hyper.Epochs = "", "shared-name", 3
	third := awaitRun(t, startRun(t, c, "it-own-third", queue, s2), 2*time.Minute)
	if third.State != spec.StateCompleted || third.Run == "shared-name" {
		t.Fatalf("resume_from run: %s as %s", third.State, third.Run)
	}
}
