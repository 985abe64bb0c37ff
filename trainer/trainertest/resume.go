package trainertest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"

	"github.com/durabletrain/durabletrain/trainer"
)

func testSaveRestore(t *testing.T, newTrainer Factory) {
	ctx := context.Background()
	a := newTrainer(t, trainer.Local{})
	defer a.Close()
	mustInit(t, a)
	if _, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	st := save(t, a)
	if err := sameState(st, save(t, a)); err != nil {
		t.Fatalf("saving the same state twice gave different bytes: %v", err)
	}
	b := newTrainer(t, trainer.Local{})
	defer b.Close()
	if err := b.Restore(ctx, st); err != nil {
		t.Fatal(err)
	}
	if b.Cursor() != a.Cursor() {
		t.Fatalf("restored cursor %+v, saved %+v", b.Cursor(), a.Cursor())
	}
	if err := sameState(st, save(t, b)); err != nil {
		t.Fatalf("restored state saves differently: %v", err)
	}
	// Training on from the restored state is indistinguishable from training on.
	for _, tr := range []trainer.Trainer{a, b} {
		if _, err := tr.TrainEpoch(ctx, 1, trainer.EpochOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := sameState(save(t, a), save(t, b)); err != nil {
		t.Fatalf("after one more epoch the restored replica diverged: %v", err)
	}
	ea, _ := a.Evaluate(ctx)
	eb, _ := b.Evaluate(ctx)
	if !sameEval(ea, eb) {
		t.Fatalf("evaluations differ: %+v vs %+v", ea, eb)
	}
}

func testCorruptState(t *testing.T, newTrainer Factory) {
	ctx := context.Background()
	src := newTrainer(t, trainer.Local{})
	defer src.Close()
	mustInit(t, src)
	if _, err := src.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
		t.Fatal(err)
	}
	good := save(t, src)
	victim := newTrainer(t, trainer.Local{})
	defer victim.Close()
	mustInit(t, victim)
	before := save(t, victim)
	for name, content := range good {
		for _, bad := range []struct {
			what string
			data []byte
		}{
			{"truncated to half", content[:len(content)/2]},
			{"truncated by one byte", content[:len(content)-1]},
			{"empty", nil},
			{"with a byte appended", append(bytes.Clone(content), 0)},
			{"with its header garbled", append([]byte("garbage!"), content[8:]...)},
		} {
			corrupt := trainer.MemState{}
			for n, c := range good {
				corrupt[n] = c
			}
			corrupt[name] = bad.data
			if err := victim.Restore(ctx, corrupt); err == nil {
				t.Errorf("restoring %s %s succeeded", name, bad.what)
			}
			if err := sameState(before, save(t, victim)); err != nil {
				t.Fatalf("a failed restore (%s %s) changed the trainer: %v", name, bad.what, err)
			}
		}
	}
	if err := victim.Restore(ctx, trainer.MemState{}); err == nil {
		t.Error("restoring from an empty checkpoint succeeded")
	}
	// Storage that verifies while streaming reports corruption at the end of
	// an object, in place of io.EOF: the backend must read to the end and fail.
	if err := victim.Restore(ctx, failingAtEOF{good}); !errors.Is(err, errAtEOF) {
		t.Errorf("restoring objects whose reader fails at EOF: got %v, want the reader's error", err)
	}
	if err := sameState(before, save(t, victim)); err != nil {
		t.Fatalf("a restore whose reader failed at EOF changed the trainer: %v", err)
	}
}

var errAtEOF = errors.New("checksum mismatch reported at end of object")

// failingAtEOF serves intact objects whose readers end with errAtEOF.
type failingAtEOF struct{ trainer.MemState }

func (f failingAtEOF) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	r, err := f.MemState.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(io.MultiReader(r, errReader{})), nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errAtEOF }

// testMidEpochResume stops an epoch part-way (UntilStep), saves, restores into
// a fresh trainer and finishes the epoch there: the result must be
// bit-identical to an epoch run straight through, because the shuffle order,
// the RNG state and the step cursor are all part of the state.
func testMidEpochResume(t *testing.T, newTrainer Factory) {
	ctx := context.Background()
	straight := newTrainer(t, trainer.Local{})
	defer straight.Close()
	mustInit(t, straight)
	full, err := straight.TrainEpoch(ctx, 0, trainer.EpochOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if full.Steps < 3 {
		t.Fatalf("an epoch of %d steps is too short for this test", full.Steps)
	}
	half := full.Steps / 2

	first := newTrainer(t, trainer.Local{})
	defer first.Close()
	mustInit(t, first)
	m, err := first.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: half})
	if err != nil {
		t.Fatal(err)
	}
	if c := first.Cursor(); c != (trainer.Cursor{Epoch: 0, Step: half}) || m.Left {
		t.Fatalf("after UntilStep %d: cursor %+v, metrics %+v", half, c, m)
	}
	st := save(t, first)
	second := newTrainer(t, trainer.Local{})
	defer second.Close()
	if err := second.Restore(ctx, st); err != nil {
		t.Fatal(err)
	}
	if c := second.Cursor(); c != (trainer.Cursor{Epoch: 0, Step: half}) {
		t.Fatalf("restored mid-epoch cursor %+v, want epoch 0 step %d", c, half)
	}
	var steps []int
	if _, err := second.TrainEpoch(ctx, 0, trainer.EpochOptions{Progress: func(p trainer.Progress) { steps = append(steps, p.Step) }}); err != nil {
		t.Fatal(err)
	}
	if len(steps) != full.Steps-half || steps[0] != half+1 {
		t.Fatalf("the resumed epoch ran steps %v, want %d..%d", steps, half+1, full.Steps)
	}
	if c := second.Cursor(); c != (trainer.Cursor{Epoch: 1}) {
		t.Fatalf("cursor after the resumed epoch %+v, want epoch 1 step 0", c)
	}
	if err := sameState(save(t, straight), save(t, second)); err != nil {
		t.Fatalf("an epoch resumed mid-way differs from one run straight through: %v", err)
	}
}

// testLeave closes one rank's Leave channel part-way through an epoch: every
// rank must stop after the same step, report Left, and hold identical state.
func testLeave(t *testing.T, newTrainer Factory) {
	const world = 2
	groups := Gang(t, world)
	leave := make(chan struct{})
	states := make([]trainer.MemState, world)
	metrics := make([]trainer.EpochMetrics, world)
	cursors := make([]trainer.Cursor, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		tr := newTrainer(t, groups[r])
		defer tr.Close()
		wg.Go(func() {
			ctx := context.Background()
			if errs[r] = tr.Init(ctx); errs[r] != nil {
				return
			}
			opts := trainer.EpochOptions{}
			if r == 1 {
				opts.Leave = leave
				opts.Progress = func(p trainer.Progress) {
					if p.Step == 2 {
						close(leave)
					}
				}
			}
			if metrics[r], errs[r] = tr.TrainEpoch(ctx, 0, opts); errs[r] != nil {
				return
			}
			cursors[r] = tr.Cursor()
			states[r] = trainer.MemState{}
			errs[r] = tr.Save(ctx, states[r])
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range world {
		if !metrics[r].Left {
			t.Fatalf("rank %d did not report leaving: %+v", r, metrics[r])
		}
		// Rank 1 asked after step 2: a backend votes in that step's
		// agreement (2) or the next step's all-reduce (3).
		if cursors[r] != cursors[0] || cursors[r].Epoch != 0 || cursors[r].Step < 2 || cursors[r].Step > 3 {
			t.Fatalf("rank %d stopped at %+v (rank 0 at %+v), want both at epoch 0 step 2 or 3", r, cursors[r], cursors[0])
		}
	}
	if err := sameState(states[0], states[1]); err != nil {
		t.Fatalf("ranks hold different states after leaving: %v", err)
	}
}
