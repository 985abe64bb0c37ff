package native

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/trainertest"
)

// The conformance suite again with 4 KiB buckets: a 784-32-10 model's
// gradient (about 100 KB) goes out in 26 all-reduces a step, overlapped with
// backward. Ranks must stay bit-identical and a resumed epoch must match one
// run straight through.
func TestConformanceWithSmallBuckets(t *testing.T) {
	tr, te := subset(t)
	small := tr.Head(1024)
	trainertest.Run(t, func(t testing.TB, comm trainer.Reducer) trainer.Trainer {
		return newTrainer(t, Config{Hidden: []int{32}, BatchSize: 64, Seed: 3, BucketBytes: MinBucketBytes}, small, te, comm)
	})
}

// countingReducer passes to the real collective and counts its all-reduces;
// from the failAt-th on, it closes the group first, as a rank whose process
// ends mid-step would.
type countingReducer struct {
	*collective.Group
	calls, failAt atomic.Int64
}

func (c *countingReducer) AllReduce(ctx context.Context, buf []float32) error {
	c.count()
	return c.Group.AllReduce(ctx, buf)
}

func (c *countingReducer) StartAllReduce(ctx context.Context, buf []float32) error {
	c.count()
	return c.Group.StartAllReduce(ctx, buf)
}

func (c *countingReducer) count() {
	if n := c.calls.Add(1); c.failAt.Load() > 0 && n >= c.failAt.Load() {
		c.Group.Close()
	}
}

// progressModes are the two ways a step's buckets are all-reduced: started
// and moved along by backward's own thread, or by a goroutine beside it.
var progressModes = []struct{ name, progress string }{
	{"driven by backward", collective.ProgressCaller},
	{"on a goroutine", collective.ProgressNever},
}

// A step whose all-reduce fails after some of its buckets went through must
// leave the weights and the optimizer at the last completed step on every
// rank: that is the replica a survivor hands to the next gang.
func TestAStepWhoseBucketFailsIsNotApplied(t *testing.T) {
	for _, mode := range progressModes {
		t.Run(mode.name, func(t *testing.T) { testAStepWhoseBucketFailsIsNotApplied(t, mode.progress) })
	}
}

func testAStepWhoseBucketFailsIsNotApplied(t *testing.T, progress string) {
	tr, te := subset(t)
	small := tr.Head(512)
	const world = 2
	groups := trainertest.GangWith(t, world, collective.Options{Progress: progress})
	if groups[0].CallerDriven() != (progress == collective.ProgressCaller) {
		t.Fatalf("Progress %q: CallerDriven() = %v", progress, groups[0].CallerDriven())
	}
	comms := make([]*countingReducer, world)
	trainers := make([]*Trainer, world)
	cfg := Config{Hidden: []int{32}, BatchSize: 64, Seed: 3, BucketBytes: MinBucketBytes}
	for r := range world {
		comms[r] = &countingReducer{Group: groups[r]}
		trainers[r] = newTrainer(t, cfg, small, te, comms[r])
	}
	each := func(f func(r int) error) []error {
		errs := make([]error, world)
		var wg sync.WaitGroup
		for r := range world {
			wg.Go(func() { errs[r] = f(r) })
		}
		wg.Wait()
		return errs
	}
	ctx := context.Background()
	// Two steps, to learn how many all-reduces a step takes.
	if err := errors.Join(each(func(r int) error {
		if err := trainers[r].Init(ctx); err != nil {
			return err
		}
		comms[r].calls.Store(0)
		_, err := trainers[r].TrainEpoch(ctx, 0, trainer.EpochOptions{UntilStep: 2})
		return err
	})...); err != nil {
		t.Fatal(err)
	}
	perStep := comms[0].calls.Load() / 2
	if perStep < 3 {
		t.Fatalf("a step took %d all-reduces; want the gradient in several buckets", perStep)
	}
	before := make([]trainer.MemState, world)
	for r := range world {
		before[r] = trainer.MemState{}
		if err := trainers[r].Save(ctx, before[r]); err != nil {
			t.Fatal(err)
		}
	}
	// Rank 1 closes its group at the middle bucket of the next step.
	comms[1].calls.Store(0)
	comms[1].failAt.Store(perStep/2 + 1)
	errs := each(func(r int) error {
		_, err := trainers[r].TrainEpoch(ctx, 0, trainer.EpochOptions{})
		return err
	})
	for r, err := range errs {
		if err == nil {
			t.Fatalf("rank %d trained on after its peer's group closed mid-step", r)
		}
		if c := trainers[r].Cursor(); c.Epoch != 0 || c.Step != 2 {
			t.Fatalf("rank %d is at epoch %d step %d after the failed step; want epoch 0 step 2", r, c.Epoch, c.Step)
		}
		after := trainer.MemState{}
		if err := trainers[r].Save(ctx, after); err != nil {
			t.Fatal(err)
		}
		for name, b := range before[r] {
			if !slices.Equal(b, after[name]) {
				t.Fatalf("rank %d: %s changed in a step whose all-reduce failed", r, name)
			}
		}
	}
}
