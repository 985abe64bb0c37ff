package checkpoint_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/testkit/testdata"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
)

// saveEpoch trains the next epoch and checkpoints the trainer at its cursor.
func saveEpoch(t *testing.T, s *checkpoint.Store, tr *native.Trainer) {
	ctx := context.Background()
	if _, err := tr.TrainEpoch(ctx, tr.Cursor().Epoch, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	c := tr.Cursor()
	w, err := s.Begin(ctx, "run", c.Epoch, c.Step)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Save(ctx, w); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
		t.Fatal(err)
	}
}

// TestRestoreLatestFallsBackPastACorruptTrainerState: a real trainer state,
// damaged in the middle, is detected while streaming and never loaded; the
// trainer resumes from the checkpoint before it.
func TestRestoreLatestFallsBackPastACorruptTrainerState(t *testing.T) {
	ctx := context.Background()
	train, _ := dataset.Load(ctx, testdata.FashionMNISTSmall(), dataset.Train)
	test, _ := dataset.Load(ctx, testdata.FashionMNISTSmall(), dataset.Test)
	train = train.Head(512)
	newTrainer := func(hidden int) *native.Trainer {
		tr, err := native.New(native.Config{Hidden: []int{hidden}, Seed: 2}, train, test, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	root := t.TempDir()
	s, _ := checkpoint.Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
	defer s.Close()
	src := newTrainer(16)
	src.Init(ctx)
	saveEpoch(t, s, src) // cursor epoch 1
	saveEpoch(t, s, src) // cursor epoch 2
	object := filepath.Join(root, "run", checkpoint.ID(2, 0), native.StateObject)
	b, _ := os.ReadFile(object)
	b[len(b)/2] ^= 1
	os.WriteFile(object, b, 0o644)

	dst := newTrainer(16)
	c, err := s.RestoreLatest(ctx, "run", func(c *checkpoint.Checkpoint) error { return dst.Restore(ctx, c) })
	if err != nil {
		t.Fatal(err)
	}
	if c.Manifest.ID != checkpoint.ID(1, 0) || dst.Cursor() != (trainer.Cursor{Epoch: 1}) {
		t.Fatalf("restored %s at cursor %+v, want the epoch-1 checkpoint", c.Manifest.ID, dst.Cursor())
	}
	if len(c.Skipped) != 1 || !strings.Contains(c.Skipped[0].Reason, "XXH3-128") {
		t.Fatalf("skipped %+v", c.Skipped)
	}

	// An incompatible trainer is the caller's error, not corruption: no fallback.
	other := newTrainer(32)
	_, err = s.RestoreLatest(ctx, "run", func(c *checkpoint.Checkpoint) error { return other.Restore(ctx, c) })
	var corrupt *checkpoint.CorruptError
	if err == nil || errors.As(err, &corrupt) || !strings.Contains(err.Error(), "model.hidden=[16]") {
		t.Fatalf("restoring into another architecture: %v", err)
	}
}
