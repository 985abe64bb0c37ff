package native

import (
	"context"

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
	t, err := New(ConfigOf(r.Spec, batch), train, test, r.Comm)
	if err != nil {
		return nil, trainer.UserError(err)
	}
	return t, nil
}

// ConfigOf is the native trainer's configuration for a spec, with the given
// batch per rank.
func ConfigOf(s spec.Training, batch int) Config {
	h := s.Hyper
	return Config{Hidden: s.Model.Hidden, Optimizer: h.Optimizer, LR: h.LR, Momentum: h.Momentum,
		WeightDecay: h.WeightDecay, BatchSize: batch, Seed: h.Seed}
}
