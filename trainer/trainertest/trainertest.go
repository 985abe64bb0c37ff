// Package trainertest is the conformance suite every trainer backend passes,
// as gocloud.dev/blob/drivertest is for blob drivers: lifecycle, cursor,
// progress, determinism of saved state, restore that never half-loads, prompt
// cancellation, and bit-identical replicas across ranks of a real gang.
package trainertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/trainer"
)

// Factory makes a fresh, uninitialised trainer for one rank of comm's gang.
// Every call must configure the same model, data and seed.
type Factory func(t testing.TB, comm trainer.Reducer) trainer.Trainer

// Run runs the whole suite against a backend. Every test runs on every
// backend: a backend whose steps run elsewhere (a user's program) must be
// configured to stop at every step for the suite (as exectrainer's
// SyncEvery), since the suite watches and stops training step by step.
func Run(t *testing.T, newTrainer Factory) {
	t.Run("Lifecycle", func(t *testing.T) { testLifecycle(t, newTrainer) })
	t.Run("SaveIsDeterministicAndRestoreRoundTrips", func(t *testing.T) { testSaveRestore(t, newTrainer) })
	t.Run("CorruptStateIsNeverLoaded", func(t *testing.T) { testCorruptState(t, newTrainer) })
	t.Run("CancellationIsPrompt", func(t *testing.T) { testCancellation(t, newTrainer) })
	t.Run("RanksStayIdentical", func(t *testing.T) { testRanksStayIdentical(t, newTrainer) })
	t.Run("MidEpochResumeIsBitIdentical", func(t *testing.T) { testMidEpochResume(t, newTrainer) })
	t.Run("LeaveStopsTheGangAtOneStep", func(t *testing.T) { testLeave(t, newTrainer) })
	t.Run("SnapshotIsTheSavedState", func(t *testing.T) { testSnapshot(t, newTrainer) })
	t.Run("RecycledSnapshotsAreReusedAndNoOthers", func(t *testing.T) { testRecycle(t, newTrainer) })
}

// testRecycle: a SnapshotRecycler copies the next snapshot into the memory
// of one handed back, and is still Save's bytes there; it never writes into
// a snapshot that was not handed back, one handed back twice (into two
// snapshots at once), or one it did not make.
func testRecycle(t *testing.T, newTrainer Factory) {
	ctx := context.Background()
	a := newTrainer(t, trainer.Local{})
	defer a.Close()
	r, ok := a.(trainer.SnapshotRecycler)
	if !ok {
		t.Skip("the backend does not reuse snapshots' memory")
	}
	mustInit(t, a)
	step := 0
	trainOn := func() {
		t.Helper()
		step++
		if _, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: step}); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func() trainer.MemState {
		t.Helper()
		m, err := r.Snapshot(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := sameState(m, save(t, a)); err != nil {
			t.Fatalf("a snapshot at step %d is not the saved state: %v", step, err)
		}
		return m
	}
	// kept is a snapshot with a copy of its bytes, to check that it never changes.
	type kept struct{ snap, bytes trainer.MemState }
	keep := func(m trainer.MemState) kept {
		c := trainer.MemState{}
		for k, v := range m {
			c[k] = bytes.Clone(v)
		}
		return kept{m, c}
	}
	unchanged := func(what string, k kept) {
		t.Helper()
		if err := sameState(k.snap, k.bytes); err != nil {
			t.Fatalf("%s changed: %v", what, err)
		}
	}

	trainOn()
	first := snapshot()
	trainOn()
	r.Recycle(first)
	second := snapshot()
	if !sharesMemory(first, second) {
		t.Fatal("the snapshot after one was handed back did not reuse its memory")
	}
	// Not handed back: never written into.
	notBack := keep(second)
	trainOn()
	third := keep(snapshot())
	unchanged("a snapshot that was not handed back", notBack)
	// Handed back twice, the second time after a snapshot reused its
	// memory: reused once only.
	r.Recycle(third.snap)
	trainOn()
	fourth := keep(snapshot())
	if !sharesMemory(third.snap, fourth.snap) {
		t.Fatal("the snapshot after one was handed back did not reuse its memory")
	}
	r.Recycle(third.snap)
	r.Recycle(third.snap)
	fifth := keep(snapshot())
	if sharesMemory(fourth.snap, fifth.snap) {
		t.Fatal("a snapshot handed back twice was reused by two snapshots")
	}
	unchanged("the snapshot reused once", fourth)
	// Not the trainer's own: ignored.
	foreign := keep(keep(fifth.snap).bytes)
	r.Recycle(foreign.snap)
	trainOn()
	sixth := snapshot()
	if sharesMemory(foreign.snap, sixth) {
		t.Fatal("a snapshot the trainer did not make was reused")
	}
	unchanged("a copy handed back", foreign)
	unchanged("the last snapshot before it", fifth)
}

// sharesMemory reports whether an object of a starts where one of b does.
func sharesMemory(a, b trainer.MemState) bool {
	for _, x := range a {
		for _, y := range b {
			if cap(x) > 0 && cap(y) > 0 && unsafe.SliceData(x[:1]) == unsafe.SliceData(y[:1]) {
				return true
			}
		}
	}
	return false
}

// testSnapshot: a Snapshotter's snapshot is Save's bytes, it restores, and
// training on does not change a snapshot already taken.
func testSnapshot(t *testing.T, newTrainer Factory) {
	ctx := context.Background()
	a := newTrainer(t, trainer.Local{})
	defer a.Close()
	s, ok := a.(trainer.Snapshotter)
	if !ok {
		t.Skip("the backend keeps its state outside its own memory: checkpoints are saved in the foreground")
	}
	mustInit(t, a)
	if _, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: 2}); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	saved := save(t, a)
	if err := sameState(snap, saved); err != nil {
		t.Fatalf("the snapshot is not the saved state: %v", err)
	}
	if _, err := a.TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: 3}); err != nil {
		t.Fatal(err)
	}
	if err := sameState(snap, saved); err != nil {
		t.Fatalf("training on changed a snapshot already taken: %v", err)
	}
	b := newTrainer(t, trainer.Local{})
	defer b.Close()
	if err := b.Restore(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if b.Cursor() != (trainer.Cursor{Epoch: 0, Step: 2}) {
		t.Fatalf("restored from the snapshot at cursor %+v, want epoch 0 step 2", b.Cursor())
	}
}

func mustInit(t testing.TB, tr trainer.Trainer) {
	t.Helper()
	if err := tr.Init(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func save(t testing.TB, tr trainer.Trainer) trainer.MemState {
	t.Helper()
	st := trainer.MemState{}
	if err := tr.Save(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return st
}

func sameState(a, b trainer.MemState) error {
	if len(a) != len(b) {
		return fmt.Errorf("%d objects vs %d", len(a), len(b))
	}
	for name, v := range a {
		if !bytes.Equal(v, b[name]) {
			return fmt.Errorf("object %q differs", name)
		}
	}
	return nil
}

func testLifecycle(t *testing.T, newTrainer Factory) {
	ctx := context.Background()
	tr := newTrainer(t, trainer.Local{})
	defer tr.Close()
	mustInit(t, tr)
	if c := tr.Cursor(); c != (trainer.Cursor{}) {
		t.Fatalf("cursor after Init is %+v, want epoch 0 step 0", c)
	}
	if _, err := tr.TrainEpoch(ctx, 1, trainer.EpochOptions{}); err == nil {
		t.Fatal("training epoch 1 before epoch 0 succeeded")
	}
	var reports []trainer.Progress
	m, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{Progress: func(p trainer.Progress) { reports = append(reports, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if m.Steps == 0 || m.Samples == 0 || len(reports) != m.Steps {
		t.Fatalf("epoch metrics %+v with %d progress reports", m, len(reports))
	}
	for i, p := range reports {
		if p.Step != i+1 || p.Steps != m.Steps || p.Epoch != 0 || math.IsNaN(p.Loss) || p.Loss <= 0 {
			t.Fatalf("progress report %d is %+v", i, p)
		}
	}
	if math.IsNaN(m.TrainLoss) || m.TrainLoss <= 0 || m.SamplesPerSecond <= 0 {
		t.Fatalf("epoch metrics %+v", m)
	}
	if c := tr.Cursor(); c != (trainer.Cursor{Epoch: 1}) {
		t.Fatalf("cursor after epoch 0 is %+v, want epoch 1 step 0", c)
	}
	e, err := tr.Evaluate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if e.Examples == 0 || e.TestAccuracy < 0 || e.TestAccuracy > 1 || math.IsNaN(e.TestLoss) {
		t.Fatalf("evaluation %+v", e)
	}
}

func testCancellation(t *testing.T, newTrainer Factory) {
	tr := newTrainer(t, trainer.Local{})
	defer tr.Close()
	mustInit(t, tr)
	ctx, cancel := context.WithCancel(context.Background())
	steps := 0
	_, err := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{Progress: func(p trainer.Progress) {
		if steps++; steps == 2 {
			cancel()
		}
	}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("TrainEpoch after cancel returned %v, want context.Canceled", err)
	}
	if steps > 3 {
		t.Fatalf("%d steps ran after cancellation", steps-2)
	}
	if c := tr.Cursor(); c.Epoch != 0 {
		t.Fatalf("cursor after a cancelled epoch is %+v; want epoch 0 still", c)
	}
}

func testRanksStayIdentical(t *testing.T, newTrainer Factory) {
	const world = 2
	groups := Gang(t, world)
	trainers := make([]trainer.Trainer, world)
	for r := range world {
		trainers[r] = newTrainer(t, groups[r])
		defer trainers[r].Close()
	}
	states := make([]trainer.MemState, world)
	evals := make([]trainer.EvalMetrics, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, tr := range trainers {
		wg.Go(func() {
			ctx := context.Background()
			if errs[r] = tr.Init(ctx); errs[r] != nil {
				return
			}
			if _, errs[r] = tr.TrainEpoch(ctx, 0, trainer.EpochOptions{}); errs[r] != nil {
				return
			}
			evals[r], errs[r] = tr.Evaluate(ctx)
			states[r] = trainer.MemState{}
			if errs[r] == nil {
				errs[r] = tr.Save(ctx, states[r])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if err := sameState(states[0], states[1]); err != nil {
		t.Fatalf("ranks hold different states after an epoch: %v", err)
	}
	if !sameEval(evals[0], evals[1]) {
		t.Fatalf("ranks evaluate differently: %+v vs %+v", evals[0], evals[1])
	}
}

// Gang joins world in-process ranks over loopback with a real collective.
func Gang(t testing.TB, world int) []*collective.Group {
	t.Helper()
	return GangWith(t, world, collective.Options{})
}

// GangWith is Gang with the groups' options (the secret is the suite's).
func GangWith(t testing.TB, world int, opts collective.Options) []*collective.Group {
	t.Helper()
	opts.Secret = []byte("trainertest-secret-0123456789")
	peers := make([]string, world)
	lns := make([]*collective.Listener, world)
	for r := range world {
		ln, err := collective.Listen("127.0.0.1:0", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		lns[r], peers[r] = ln, ln.Addr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	groups := make([]*collective.Group, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := range world {
		wg.Go(func() {
			groups[r], errs[r] = collective.Join(ctx, lns[r], collective.Gang{Run: "trainertest", Generation: 1, Peers: peers}, r, opts)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, g := range groups {
			g.Close()
		}
	})
	return groups
}

// sameEval compares what an evaluation measured of the model: the test
// loss, accuracy and examples (a program's other metrics may be of itself,
// such as its own timing, and differ from run to run).
func sameEval(a, b trainer.EvalMetrics) bool {
	return a.TestLoss == b.TestLoss && a.TestAccuracy == b.TestAccuracy && a.Examples == b.Examples
}
