package native

import (
	"context"
	"fmt"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Name is the backend's name in a spec's "trainer".
const Name = spec.TrainerNative

func init() { trainer.Register(Name, trainer.BackendFunc(NewRank)) }

// NewRank is the native backend: the spec's model and hyper section over the
// run's data set, reducing over the rank's gang.
func NewRank(ctx context.Context, r trainer.Rank) (trainer.Trainer, error) {
	train, test, err := r.Data(ctx)
	if err != nil {
		return nil, err
	}
	h := r.Spec.Hyper
	batch := h.BatchSize
	if r.BatchSize > 0 {
		batch = r.BatchSize
	}
	cfg := ConfigOf(r.Spec, batch)
	if need := MemoryNeeded(cfg, train.Features()); r.MemoryLimit > 0 && need > r.MemoryLimit {
		return nil, trainer.UserError(fmt.Errorf("model.hidden %v with hyper.batch_size %d needs about %d MiB per rank; this worker allows %d MiB (-max-rank-memory)",
			cfg.Hidden, batch, need>>20, r.MemoryLimit>>20))
	}
	t, err := New(cfg, train, test, r.Comm)
	if err != nil {
		return nil, trainer.UserError(err)
	}
	return t, nil
}

// MemoryNeeded estimates what a rank of cfg takes for examples of the given
// features, in bytes: the weights, their gradients and the optimizer's
// state (Adam: two moments; SGD: a velocity), and the activations and
// deltas of a batch (or of an evaluation batch, if larger). The data set is
// shared by the worker's ranks and not counted.
func MemoryNeeded(cfg Config, features int) int64 {
	cfg = cfg.WithDefaults()
	widths := append(append([]int{features}, cfg.Hidden...), dataset.Classes)
	params, units := int64(0), int64(0)
	for i := 1; i < len(widths); i++ {
		params += int64(widths[i-1])*int64(widths[i]) + int64(widths[i])
	}
	for _, w := range widths {
		units += int64(w)
	}
	copies := int64(4) // weights, gradients, Adam's two moments
	if cfg.Optimizer == "sgd" {
		copies = 3
	}
	rows := int64(max(cfg.BatchSize, evalBatch))
	return 4 * (copies*params + 2*rows*units)
}

// ConfigOf is the native trainer's configuration for a spec, with the given
// batch per rank.
func ConfigOf(s spec.Training, batch int) Config {
	h := s.Hyper
	return Config{Hidden: s.Model.Hidden, Optimizer: h.Optimizer, LR: h.LR, Momentum: h.Momentum,
		WeightDecay: h.WeightDecay, BatchSize: batch, Seed: h.Seed, BucketBytes: s.Scaling.BucketBytes}
}
