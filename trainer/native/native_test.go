package native

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/testkit/testdata"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/trainertest"
)

var (
	loadOnce    sync.Once
	train, test *dataset.Set
)

// subset is the committed real Fashion-MNIST subset (10000 train, 1000 test).
func subset(t testing.TB) (*dataset.Set, *dataset.Set) {
	loadOnce.Do(func() {
		ctx := context.Background()
		var err error
		if train, err = dataset.Load(ctx, testdata.FashionMNISTSmall(), dataset.Train); err != nil {
			t.Fatal(err)
		}
		if test, err = dataset.Load(ctx, testdata.FashionMNISTSmall(), dataset.Test); err != nil {
			t.Fatal(err)
		}
	})
	return train, test
}

func newTrainer(t testing.TB, cfg Config, tr, te *dataset.Set, comm trainer.Reducer) *Trainer {
	t.Helper()
	n, err := New(cfg, tr, te, comm)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestConformance(t *testing.T) {
	tr, te := subset(t)
	small := tr.Head(1024)
	trainertest.Run(t, func(t testing.TB, comm trainer.Reducer) trainer.Trainer {
		return newTrainer(t, Config{Hidden: []int{32}, BatchSize: 64, Seed: 3}, small, te, comm)
	})
}

func TestConformanceWithSGD(t *testing.T) {
	tr, te := subset(t)
	small := tr.Head(512)
	trainertest.Run(t, func(t testing.TB, comm trainer.Reducer) trainer.Trainer {
		return newTrainer(t, Config{Hidden: []int{16, 8}, Optimizer: "sgd", WeightDecay: 1e-4, BatchSize: 32, Seed: 4}, small, te, comm)
	})
}

// TestGradientsMatchFiniteDifferences checks backward() against central
// differences of the loss, in float64 arithmetic on a float32 model.
func TestGradientsMatchFiniteDifferences(t *testing.T) {
	const in, rows = 6, 5
	m := newMLP([]int{in, 5, 4, dataset.Classes})
	m.init(rand.New(rand.NewPCG(1, 2)))
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, rows*in)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	y := []uint8{0, 3, 9, 3, 7}
	loss := func() float64 {
		l, _ := lossAndDelta(m.forward(x, rows), y, dataset.Classes, nil)
		return l / rows
	}
	logits := m.forward(x, rows)
	lossAndDelta(logits, y, dataset.Classes, m.deltas[m.layers()])
	m.backward(rows, 0, nil)
	analytic := slices.Clone(m.grads[:len(m.params)])
	// In blocks of 2 input rows, as a run that overlaps its all-reduce computes
	// it: the same gradient, reported ready from the end of grads to its start.
	clear(m.grads)
	front := len(m.grads)
	m.backward(rows, 2, func(lo int) {
		if lo > front {
			t.Fatalf("ready(%d) after ready(%d): the complete part of grads shrank", lo, front)
		}
		front = lo
	})
	if front != 0 {
		t.Fatalf("the last ready was ready(%d); want ready(0)", front)
	}
	for i, g := range m.grads[:len(m.params)] {
		if d := math.Abs(float64(g - analytic[i])); d > 1e-6*math.Max(1, math.Abs(float64(g))) {
			t.Fatalf("parameter %d: blocked backward gives %v, whole %v", i, g, analytic[i])
		}
	}
	const eps = 1e-2
	worst := 0.0
	for i := range m.params {
		orig := m.params[i]
		m.params[i] = orig + eps
		up := loss()
		m.params[i] = orig - eps
		down := loss()
		m.params[i] = orig
		numeric := (up - down) / (2 * eps)
		diff := math.Abs(numeric - float64(analytic[i]))
		if diff > 2e-3+2e-2*math.Abs(numeric) {
			t.Errorf("parameter %d: backward gives %.6f, finite differences %.6f", i, analytic[i], numeric)
		}
		worst = max(worst, diff)
	}
	t.Logf("%d parameters, largest difference %.2g", len(m.params), worst)
}

func TestSameSeedGivesBitIdenticalWeights(t *testing.T) {
	tr, te := subset(t)
	ctx := context.Background()
	run := func(seed uint64) []float32 {
		n := newTrainer(t, Config{Seed: seed, Hidden: []int{64, 32}}, tr.Head(2000), te, nil)
		if err := n.Init(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := n.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
			t.Fatal(err)
		}
		return slices.Clone(n.Weights())
	}
	a, b, c := run(9), run(9), run(10)
	if !slices.Equal(a, b) {
		t.Fatal("two runs with seed 9 ended with different weights")
	}
	if slices.Equal(a, c) {
		t.Fatal("seeds 9 and 10 ended with the same weights")
	}
}

// trainRanks trains an epoch on world in-process ranks and calls check after
// every step with each rank's weights at that step.
func trainRanks(t *testing.T, world int, cfg Config, tr, te *dataset.Set, check func(step int, weights [][]float32)) [][]float32 {
	return trainRanksWith(t, world, collective.Options{}, cfg, tr, te, check)
}

// trainRanksWith is trainRanks on groups joined with opts.
func trainRanksWith(t *testing.T, world int, opts collective.Options, cfg Config, tr, te *dataset.Set, check func(step int, weights [][]float32)) [][]float32 {
	groups := trainertest.GangWith(t, world, opts)
	trainers := make([]*Trainer, world)
	for r := range world {
		trainers[r] = newTrainer(t, cfg, tr, te, groups[r])
	}
	snapshots := make([][][]float32, world) // [rank][step]
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r, n := range trainers {
		wg.Go(func() {
			ctx := context.Background()
			if errs[r] = n.Init(ctx); errs[r] != nil {
				return
			}
			_, errs[r] = n.TrainEpoch(ctx, 0, trainer.EpochOptions{Progress: func(trainer.Progress) {
				if check != nil {
					snapshots[r] = append(snapshots[r], slices.Clone(n.Weights()))
				}
			}})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if check != nil {
		for step := range snapshots[0] {
			ws := make([][]float32, world)
			for r := range world {
				ws[r] = snapshots[r][step]
			}
			check(step, ws)
		}
	}
	out := make([][]float32, world)
	for r, n := range trainers {
		out[r] = n.Weights()
	}
	return out
}

func TestRanksHoldBitIdenticalWeightsAfterEveryStep(t *testing.T) {
	tr, te := subset(t)
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", world), func(t *testing.T) {
			steps := 0
			trainRanks(t, world, Config{Hidden: []int{32}, BatchSize: 16, Seed: 5}, tr.Head(600), te, func(step int, ws [][]float32) {
				steps++
				for r := 1; r < len(ws); r++ {
					if !slices.Equal(ws[0], ws[r]) {
						t.Fatalf("after step %d rank %d's weights differ from rank 0's", step+1, r)
					}
				}
			})
			if steps == 0 {
				t.Fatal("no steps were checked")
			}
		})
	}
}

// Buckets all-reduced by backward's own thread and by a goroutine beside
// it give the same weights, bit for bit, on every rank after every step:
// with 4 KiB buckets, a step starts 25 all-reduces while backward runs.
func TestBucketsDrivenByBackwardMatchAGoroutineBitForBit(t *testing.T) {
	tr, te := subset(t)
	cfg := Config{Hidden: []int{32}, BatchSize: 16, Seed: 5, BucketBytes: MinBucketBytes}
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", world), func(t *testing.T) {
			final := map[string][]float32{}
			for _, mode := range progressModes {
				final[mode.name] = trainRanksWith(t, world, collective.Options{Progress: mode.progress}, cfg, tr.Head(600), te, func(step int, ws [][]float32) {
					for r := 1; r < len(ws); r++ {
						if !slices.Equal(ws[0], ws[r]) {
							t.Fatalf("%s: after step %d rank %d's weights differ from rank 0's", mode.name, step+1, r)
						}
					}
				})[0]
			}
			a, b := final[progressModes[0].name], final[progressModes[1].name]
			if !slices.Equal(a, b) {
				t.Fatalf("the weights differ between buckets %s and %s", progressModes[0].name, progressModes[1].name)
			}
		})
	}
}

// TestRanksMatchOneRankWithTheGlobalBatch: N ranks with batch B follow the
// same trajectory as one rank with batch N*B, to floating-point tolerance.
func TestRanksMatchOneRankWithTheGlobalBatch(t *testing.T) {
	tr, te := subset(t)
	data := tr.Head(1536)
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprintf("ranks=%d", world), func(t *testing.T) {
			const b = 16
			cfg := Config{Hidden: []int{32}, Optimizer: "sgd", LR: 0.05, Seed: 8}
			cfg.BatchSize = b
			many := trainRanks(t, world, cfg, data, te, nil)[0]
			cfg.BatchSize = b * world
			one := newTrainer(t, cfg, data, te, nil)
			ctx := context.Background()
			one.Init(ctx)
			if _, err := one.TrainEpoch(ctx, 0, trainer.EpochOptions{}); err != nil {
				t.Fatal(err)
			}
			var worst, scale float64
			for i, w := range one.Weights() {
				worst = max(worst, math.Abs(float64(w-many[i])))
				scale = max(scale, math.Abs(float64(w)))
			}
			t.Logf("largest weight difference %.3g (largest weight %.3g)", worst, scale)
			if worst > 1e-4 {
				t.Fatalf("%d ranks with batch %d drifted %.3g from one rank with batch %d", world, b, worst, b*world)
			}
		})
	}
}

// TestLearnsFashionMNIST trains on the committed real subset: a broken
// forward pass, gradient or optimizer cannot reach this accuracy.
func TestLearnsFashionMNIST(t *testing.T) {
	tr, te := subset(t)
	n := newTrainer(t, Config{Seed: 1}, tr.Head(4000), te, nil)
	ctx := context.Background()
	n.Init(ctx)
	before, _ := n.Evaluate(ctx)
	var last trainer.EpochMetrics
	for epoch := range 4 {
		m, err := n.TrainEpoch(ctx, epoch, trainer.EpochOptions{})
		if err != nil {
			t.Fatal(err)
		}
		last = m
	}
	after, err := n.Evaluate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("test accuracy %.3f -> %.3f, train loss %.3f, %s, %.0f samples/s", before.TestAccuracy, after.TestAccuracy, last.TrainLoss, BLAS(), last.SamplesPerSecond)
	if after.TestAccuracy < 0.77 {
		t.Fatalf("test accuracy %.3f after 4 epochs on 4000 examples; want at least 0.77", after.TestAccuracy)
	}
}

func TestNaNLossIsADivergenceError(t *testing.T) {
	tr, te := subset(t)
	poisoned := &dataset.Set{Images: slices.Clone(tr.Images[:64*784]), Labels: tr.Labels[:64], Rows: 28, Cols: 28}
	poisoned.Images[5] = float32(math.NaN())
	n := newTrainer(t, Config{BatchSize: 64}, poisoned, te, nil)
	n.Init(context.Background())
	_, err := n.TrainEpoch(context.Background(), 0, trainer.EpochOptions{})
	if !errors.Is(err, trainer.ErrDiverged) {
		t.Fatalf("got %v, want ErrDiverged", err)
	}
}

func TestBadConfigNamesTheField(t *testing.T) {
	tr, te := subset(t)
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Hidden: []int{0}}, "model.hidden[0] is 0"},
		{Config{Optimizer: "lbfgs"}, `hyper.optimizer is "lbfgs"; want "adam" or "sgd"`},
		{Config{LR: -1}, "hyper.lr is -1"},
		{Config{Optimizer: "sgd", Momentum: ptr(1.5)}, "hyper.momentum is 1.5"},
		{Config{BatchSize: -3}, "hyper.batch_size is -3"},
	} {
		if _, err := New(tc.cfg, tr, te, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v): got %v, want an error containing %q", tc.cfg, err, tc.want)
		}
	}
}

func TestRestoreRefusesAnotherArchitecture(t *testing.T) {
	tr, te := subset(t)
	ctx := context.Background()
	a := newTrainer(t, Config{Hidden: []int{16}}, tr, te, nil)
	a.Init(ctx)
	st := trainer.MemState{}
	a.Save(ctx, st)
	b := newTrainer(t, Config{Hidden: []int{32}}, tr, te, nil)
	if err := b.Restore(ctx, st); err == nil || !strings.Contains(err.Error(), "model.hidden=[16]") {
		t.Fatalf("got %v, want an error naming the checkpoint's architecture", err)
	}
}
func ptr(v float64) *float64 { return &v }

// The estimate is of the order of what the trainer allocates, and a model
// over a worker's allowance is refused before anything is allocated.
func TestMemoryNeeded(t *testing.T) {
	cfg := Config{Hidden: []int{256, 128}}
	need := MemoryNeeded(cfg, 784)
	params := int64(784*256 + 256 + 256*128 + 128 + 128*10 + 10)
	if need < 4*4*params || need > 4*4*params+64<<20 {
		t.Fatalf("estimate %d bytes for %d parameters", need, params)
	}
	huge := MemoryNeeded(Config{Hidden: []int{65536, 65536}}, 784)
	if huge < 60<<30 {
		t.Fatalf("[65536, 65536] estimated at %d bytes", huge)
	}
}

// TestParallelCopyCopiesEveryByteOnce lays copies of odd lengths (empty ones
// among them) end to end and splits them between 1 to 5 goroutines: every
// destination must end up equal to its source, and nothing past it touched.
func TestParallelCopyCopiesEveryByteOnce(t *testing.T) {
	lengths := []int{0, 1, parallelCopyMin + 3, 5, 0, parallelCopyMin + 7, 2*parallelCopyMin - 1, 9}
	for k := 1; k <= 5; k++ {
		var copies []byteCopy
		var dsts [][]byte
		for i, n := range lengths {
			src := make([]byte, n)
			for j := range src {
				src[j] = byte(j*7 + i + k)
			}
			dst := make([]byte, n+1) // one byte past the copy, which must stay 0xee
			for j := range dst {
				dst[j] = 0xee
			}
			dsts = append(dsts, dst)
			copies = append(copies, byteCopy{dst: dst[:n], src: src})
		}
		parallelCopy(copies, k)
		for i, c := range copies {
			if !bytes.Equal(c.dst, c.src) {
				t.Fatalf("%d goroutines: copy %d (%d bytes) differs from its source", k, i, lengths[i])
			}
			if dsts[i][lengths[i]] != 0xee {
				t.Fatalf("%d goroutines: copy %d wrote past its end", k, i)
			}
		}
	}
}
