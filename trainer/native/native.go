package native

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/trainer"
)

// Trainer is one rank of the native backend.
type Trainer struct {
	cfg         Config
	train, test *dataset.Set
	comm        trainer.Reducer
	model       *mlp
	opt         optimizer
	cursor      trainer.Cursor
	x           []float32
	y           []uint8
	snapshots   snapshotMemory
}

var (
	_ trainer.Trainer          = (*Trainer)(nil)
	_ trainer.SnapshotRecycler = (*Trainer)(nil)
)

// evalBatch is the number of test examples scored per forward pass.
const evalBatch = 1000

// New makes a rank's trainer over the given data; comm is the gang's
// collective (trainer.Local{} for a single rank). Call Init or Restore next.
func New(cfg Config, train, test *dataset.Set, comm trainer.Reducer) (*Trainer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if train == nil || test == nil || train.Len() == 0 || test.Len() == 0 {
		return nil, errors.New("native trainer: training and test sets must be loaded and non-empty")
	}
	if train.Features() != test.Features() {
		return nil, fmt.Errorf("native trainer: training examples have %d features, test examples %d", train.Features(), test.Features())
	}
	if comm == nil {
		comm = trainer.Local{}
	}
	if shard := dataset.ShardSize(train.Len(), comm.World()); shard < 1 {
		return nil, fmt.Errorf("native trainer: %d training examples cannot be split over %d ranks", train.Len(), comm.World())
	}
	sizes := append(append([]int{train.Features()}, cfg.Hidden...), dataset.Classes)
	t := &Trainer{cfg: cfg, train: train, test: test, comm: comm, model: newMLP(sizes)}
	t.opt = newOptimizer(cfg, len(t.model.params))
	rows := max(cfg.BatchSize, evalBatch)
	t.x, t.y = make([]float32, rows*train.Features()), make([]uint8, rows)
	return t, nil
}

// Parameters is the number of trainable weights and biases.
func (t *Trainer) Parameters() int { return len(t.model.params) }

// Weights is a view of the model's parameters, for tests and tools.
func (t *Trainer) Weights() []float32 { return t.model.params }

func (t *Trainer) Init(ctx context.Context) error {
	t.model.init(rand.New(rand.NewPCG(t.cfg.Seed, 0x6d6c70)))
	t.opt = newOptimizer(t.cfg, len(t.model.params))
	t.cursor = trainer.Cursor{}
	// Every rank drew the same weights; rank 0's broadcast makes that a guarantee.
	return t.comm.Broadcast(ctx, t.model.params, 0)
}

func (t *Trainer) Cursor() trainer.Cursor { return t.cursor }

func (t *Trainer) TrainEpoch(ctx context.Context, epoch int, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	if epoch != t.cursor.Epoch {
		return trainer.EpochMetrics{}, fmt.Errorf("native trainer: asked to train epoch %d but the state is at epoch %d step %d", epoch, t.cursor.Epoch, t.cursor.Step)
	}
	world := t.comm.World()
	shard := dataset.Shard(dataset.Permutation(t.train.Len(), t.cfg.Seed, epoch), t.comm.Rank(), world)
	b := t.cfg.BatchSize
	steps := (len(shard) + b - 1) / b
	last := steps
	if opts.UntilStep > t.cursor.Step && opts.UntilStep < steps {
		last = opts.UntilStep
	}
	m := trainer.EpochMetrics{Epoch: epoch, Steps: steps}
	start := time.Now()
	var lossSum float64
	ran := 0
	scale := 1 / float32(world) // grads hold the ranks' sum: their mean is sum*scale
	var reduce *buckets         // nil: a single rank, nothing to reduce
	if world > 1 {
		reduce = newBuckets(ctx, t.comm, t.model.grads, t.cfg.BucketBytes)
		defer reduce.close()
	}
	for step := t.cursor.Step; step < last; step++ {
		if err := ctx.Err(); err != nil {
			return m, err
		}
		idx := shard[step*b : min((step+1)*b, len(shard))]
		rows := len(idx)
		t.train.Gather(idx, t.x, t.y)
		logits := t.model.forward(t.x, rows)
		loss, _ := lossAndDelta(logits, t.y[:rows], dataset.Classes, t.model.deltas[t.model.layers()])
		grads := t.model.grads
		// The two last slots ride the all-reduce: the leave votes and the loss.
		grads[len(grads)-2] = 0
		if leaving(opts.Leave) {
			grads[len(grads)-2] = 1
		}
		grads[len(grads)-1] = float32(loss / float64(rows))
		if reduce == nil {
			t.model.backward(rows, 0, nil)
		} else {
			reduce.begin()
			t.model.backward(rows, reduce.floats, reduce.ready)
			if err := reduce.wait(); err != nil {
				return m, err
			}
		}
		globalLoss := float64(grads[len(grads)-1] * scale)
		if math.IsNaN(globalLoss) || math.IsInf(globalLoss, 0) {
			return m, trainer.DivergedError(epoch, step, globalLoss)
		}
		t.opt.begin()
		t.opt.update(t.model.params, grads, scale, 0, len(t.model.params))
		t.cursor.Step = step + 1
		lossSum += globalLoss
		ran++
		m.Samples += rows * world
		if opts.Progress != nil {
			opts.Progress(trainer.Progress{Epoch: epoch, Step: step + 1, Steps: steps, Loss: globalLoss})
		}
		if grads[len(grads)-2] > 0 && step+1 < steps {
			m.Left = true // every rank saw the same votes: the gang stops here together
			break
		}
	}
	m.Seconds = time.Since(start).Seconds()
	if ran > 0 {
		m.TrainLoss = lossSum / float64(ran)
	}
	if m.Seconds > 0 {
		m.SamplesPerSecond = float64(m.Samples) / m.Seconds
	}
	if t.cursor.Step == steps {
		t.cursor = trainer.Cursor{Epoch: epoch + 1}
	}
	return m, nil
}

// leaving reports whether the leave channel is closed, without waiting.
func leaving(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (t *Trainer) Evaluate(ctx context.Context) (trainer.EvalMetrics, error) {
	lo, hi := dataset.EvalRange(t.test.Len(), t.comm.Rank(), t.comm.World())
	var loss float64
	var correct int
	idx := make([]int32, 0, evalBatch)
	for start := lo; start < hi; start += evalBatch {
		idx = idx[:0]
		for i := start; i < min(start+evalBatch, hi); i++ {
			idx = append(idx, int32(i))
		}
		t.test.Gather(idx, t.x, t.y)
		logits := t.model.forward(t.x, len(idx))
		l, c := lossAndDelta(logits, t.y[:len(idx)], dataset.Classes, nil)
		loss += l
		correct += c
	}
	sums := []float32{float32(loss), float32(correct), float32(hi - lo)}
	if err := t.comm.AllReduce(ctx, sums); err != nil {
		return trainer.EvalMetrics{}, err
	}
	n := float64(sums[2])
	return trainer.EvalMetrics{TestLoss: float64(sums[0]) / n, TestAccuracy: float64(sums[1]) / n, Examples: int(n)}, nil
}

func (t *Trainer) Close() error { return nil }
