package simfleet

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/durabletrain/durabletrain/trainer"
)

// Backend is the spec's "trainer" that the fleet's agents run.
const Backend = "sim"

// simTrainer stands in for a GPU's work: each epoch is StepsPerEpoch steps
// that each sleep their share of the epoch time and all-reduce a small
// buffer for real over the gang's collective (with the leave vote, as the
// real trainers do). Its state, a vector the all-reduced "gradients" move,
// is saved and restored, so every rank ends identical and a restored rank
// goes on where it stopped.
type simTrainer struct {
	comm      trainer.Reducer
	epochTime time.Duration
	weights   []float32
	cursor    trainer.Cursor
}

// StepsPerEpoch is how many all-reduces one simulated epoch makes.
const StepsPerEpoch = 4

func (t *simTrainer) Init(context.Context) error {
	t.weights = make([]float32, len(t.weights))
	t.cursor = trainer.Cursor{}
	return nil
}

type simState struct {
	Weights []float32      `json:"weights"`
	Cursor  trainer.Cursor `json:"cursor"`
}

func (t *simTrainer) Restore(ctx context.Context, from trainer.StateReader) error {
	r, err := from.Open(ctx, "sim.json")
	if err != nil {
		return err
	}
	defer r.Close()
	var st simState
	if err := json.NewDecoder(io.LimitReader(r, 64<<20)).Decode(&st); err != nil {
		return fmt.Errorf("sim state: %w", err)
	}
	if len(st.Weights) != len(t.weights) {
		return fmt.Errorf("sim state has %d weights; want %d", len(st.Weights), len(t.weights))
	}
	t.weights, t.cursor = st.Weights, st.Cursor
	return nil
}

func (t *simTrainer) Save(ctx context.Context, to trainer.StateWriter) error {
	w, err := to.Create(ctx, "sim.json")
	if err != nil {
		return err
	}
	if err := json.NewEncoder(w).Encode(simState{Weights: t.weights, Cursor: t.cursor}); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

func (t *simTrainer) TrainEpoch(ctx context.Context, epoch int, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	if epoch != t.cursor.Epoch {
		return trainer.EpochMetrics{}, fmt.Errorf("sim trainer: asked for epoch %d at cursor %+v", epoch, t.cursor)
	}
	start := time.Now()
	m := trainer.EpochMetrics{Epoch: epoch, Steps: StepsPerEpoch}
	buf := make([]float32, len(t.weights)+1)
	for t.cursor.Step < StepsPerEpoch {
		select {
		case <-time.After(t.epochTime / StepsPerEpoch):
		case <-ctx.Done():
			return m, ctx.Err()
		}
		for i := range t.weights {
			buf[i] = float32((t.comm.Rank()+t.cursor.Step+i)%7) / 7
		}
		buf[len(t.weights)] = 0
		select {
		case <-opts.Leave:
			buf[len(t.weights)] = 1
		default:
		}
		if err := t.comm.AllReduce(ctx, buf); err != nil {
			return m, err
		}
		for i := range t.weights {
			t.weights[i] -= 0.01 * buf[i] / float32(t.comm.World())
		}
		t.cursor.Step++
		if opts.Progress != nil {
			opts.Progress(trainer.Progress{Epoch: epoch, Step: t.cursor.Step, Steps: StepsPerEpoch, Loss: 1 / float64(1+epoch)})
		}
		if buf[len(t.weights)] > 0 {
			m.Left = true
			break
		}
		if opts.UntilStep > 0 && t.cursor.Step >= opts.UntilStep && t.cursor.Step < StepsPerEpoch {
			break
		}
	}
	if t.cursor.Step == StepsPerEpoch {
		t.cursor = trainer.Cursor{Epoch: epoch + 1}
	}
	m.Seconds = time.Since(start).Seconds()
	m.TrainLoss = 1 / float64(1+epoch)
	return m, nil
}

func (t *simTrainer) Evaluate(context.Context) (trainer.EvalMetrics, error) {
	return trainer.EvalMetrics{TestLoss: 1 / float64(1+t.cursor.Epoch), TestAccuracy: 1 - 1/float64(2+t.cursor.Epoch), Examples: 1}, nil
}

func (t *simTrainer) Cursor() trainer.Cursor { return t.cursor }
func (t *simTrainer) Close() error           { return nil }
