package exectrainer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/durabletrain/durabletrain/trainer"
)

// TrainEpoch has the program train the rest of the epoch.
//
// A program that trains in durabletrain.steps() stops between two steps at
// the steps the gang's workers agree on (about every SyncEvery), and there
// learns whether to go on, or to save and stop: because a rank's worker is
// leaving (opts.Leave; every rank stops at that same step, and the metrics
// say Left), or because the caller asked to stop at opts.UntilStep. It then
// waits, its state saved at that step, until the next call lets it go on.
// A report with a checkpoint inside the loop ends the call at its step,
// for the caller to checkpoint. A program that does not use steps() stops
// only at epoch ends.
func (t *Trainer) TrainEpoch(ctx context.Context, epoch int, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	if t.conn == nil {
		return trainer.EpochMetrics{}, errors.New("exec trainer: the program is not running (call Init or Restore)")
	}
	if epoch != t.cursor.Epoch {
		return trainer.EpochMetrics{}, fmt.Errorf("exec trainer: asked to train epoch %d but the state is at epoch %d", epoch, t.cursor.Epoch)
	}
	start := time.Now()
	from := t.cursor.Step
	until := 0
	if opts.UntilStep > from {
		until = opts.UntilStep
	}
	// Every rank's worker begins a call alike: the program stops after one
	// step, and from the time it took rank 0 chooses the next stop.
	first := from + 1
	if t.paused {
		t.paused = false
		if err := t.send(message{Op: "go", Sync: first}); err != nil {
			return trainer.EpochMetrics{}, err
		}
	} else {
		if _, err := t.expect(ctx, "ready", "ask for an epoch"); err != nil {
			return trainer.EpochMetrics{}, err
		}
		t.epoch = epochPace{reported: from}
		if err := t.send(message{Op: "epoch", Epoch: epoch, StartStep: from, Sync: first}); err != nil {
			return trainer.EpochMetrics{}, err
		}
	}
	t.epoch.lastAt, t.epoch.lastStep = time.Now(), from
	var stops stopTally
	defer stops.log(t.cfg.Log, t.cfg.Rank, epoch, start)
	doing := fmt.Sprintf("train epoch %d and report it", epoch)
	for answered := false; ; answered = true {
		m, err := t.next(ctx, doing)
		if err != nil {
			return trainer.EpochMetrics{}, err
		}
		arrived := time.Now()
		if m.Op == "finished" {
			// The program's training ended (its function returned) before
			// this epoch: only as its first answer to the epoch, at its start.
			if answered || m.Epoch != epoch || t.paused {
				t.kill()
				return trainer.EpochMetrics{}, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program said its training finished at epoch %d after it began training epoch %d; "+
					"a program ends its training only between epochs, after its last report", t.cfg.Rank, m.Epoch, epoch))
			}
			return trainer.EpochMetrics{Epoch: epoch, Steps: from}, trainer.ErrFinished
		}
		if m.Epoch != epoch {
			t.kill()
			return trainer.EpochMetrics{}, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program sent a %q of epoch %d while it trains epoch %d", t.cfg.Rank, m.Op, m.Epoch, epoch))
		}
		if m.Metrics != nil {
			if err := checkMetrics(epoch, m.Metrics); err != nil {
				t.kill()
				return trainer.EpochMetrics{}, err
			}
			t.noteLoss(m.Metrics, m.Step)
		}
		if m.Steps > 0 {
			t.epoch.steps = m.Steps
		}
		switch {
		case m.Op == "metrics":
		case m.Op == "report" && m.End:
			return t.endEpoch(ctx, epoch, m, start, opts)
		case m.Op == "sync", m.Op == "report":
			if m.Step <= from || m.Step > maxStep {
				t.kill()
				return trainer.EpochMetrics{}, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program sent a %q at step %d of epoch %d, which began at step %d; want a step after it, at most %d",
					t.cfg.Rank, m.Op, m.Step, epoch, from, maxStep))
			}
			t.epoch.observe(m.Step, time.Now())
			t.cursor.Step = m.Step
			t.progress(opts, epoch, m.Step)
			if m.Op == "report" { // a checkpoint at this step: the caller saves it
				leaving, _, err := t.vote(ctx, atCheckpoint, m.Step, 0, opts.Leave)
				if err != nil {
					return trainer.EpochMetrics{}, err
				}
				if err := t.keep(m.CheckpointDir, t.cursor); err != nil {
					t.kill()
					return trainer.EpochMetrics{}, err
				}
				t.paused = true
				return t.partial(epoch, start, leaving), nil
			}
			leaving, next, err := t.vote(ctx, atSync, m.Step, t.proposal(m.Step, until), opts.Leave)
			if err != nil {
				return trainer.EpochMetrics{}, err
			}
			if leaving || until > 0 && m.Step >= until {
				if err := t.saveAt(ctx, epoch, m.Step, leaving); err != nil {
					return trainer.EpochMetrics{}, err
				}
				return t.partial(epoch, start, leaving), nil
			}
			if err := t.send(message{Op: "go", Sync: next}); err != nil {
				return trainer.EpochMetrics{}, err
			}
			stops.add(m.Step, arrived.Sub(start), time.Since(arrived))
		default:
			t.kill()
			return trainer.EpochMetrics{}, trainer.UserError(fmt.Errorf("exec trainer: rank %d's program sent %q while it trains epoch %d", t.cfg.Rank, m.Op, epoch))
		}
	}
}

// maxStep bounds an epoch's steps: the gang's votes carry steps as float32,
// exact up to 2^24.
const maxStep = 1 << 24

// saveAt has the program save its state at the step the gang stopped at;
// it then waits for word to go on.
func (t *Trainer) saveAt(ctx context.Context, epoch, step int, leaving bool) error {
	if err := t.send(message{Op: "save"}); err != nil {
		return err
	}
	m, err := t.expect(ctx, "saved", fmt.Sprintf("save its checkpoint at epoch %d step %d", epoch, step))
	if err != nil {
		return err
	}
	if m.CheckpointDir == "" {
		if leaving { // not the user's fault: the run goes on from its latest checkpoint
			return fmt.Errorf("exec trainer: the gang stopped at epoch %d step %d because a worker is shutting down, but the program cannot save there: "+
				"it passes no save= to durabletrain.steps()", epoch, step)
		}
		return trainer.UserError(fmt.Errorf("exec trainer: a checkpoint is due at epoch %d step %d (checkpoint.every_steps), but the program cannot save there: "+
			"it passes no save= to durabletrain.steps()", epoch, step))
	}
	if err := t.keep(m.CheckpointDir, trainer.Cursor{Epoch: epoch, Step: step}); err != nil {
		t.kill()
		return err
	}
	t.paused = true
	return nil
}

// endEpoch takes the epoch's report.
func (t *Trainer) endEpoch(ctx context.Context, epoch int, m message, start time.Time, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	if _, _, err := t.vote(ctx, atEpochEnd, m.Step, 0, nil); err != nil {
		return trainer.EpochMetrics{}, err
	}
	next := trainer.Cursor{Epoch: epoch + 1}
	t.skipped = trainer.Cursor{}
	if m.CheckpointDir == "" && m.NoCheckpoint {
		t.skipped = next
	}
	if m.CheckpointDir != "" {
		if err := t.keep(m.CheckpointDir, next); err != nil {
			t.kill()
			return trainer.EpochMetrics{}, err
		}
	}
	if err := t.send(message{Op: "ack"}); err != nil {
		return trainer.EpochMetrics{}, err
	}
	steps := max(t.epoch.steps, m.Step, 1) // a program outside steps() trains its epoch as one step
	t.epoch.steps = steps
	t.last, t.cursor = m, next
	t.progress(opts, epoch, steps)
	em := trainer.EpochMetrics{Epoch: epoch, Steps: steps, TrainLoss: m.Metrics["train_loss"], Seconds: time.Since(start).Seconds(),
		Samples: int(m.Metrics["samples"])}
	if em.Seconds > 0 {
		em.SamplesPerSecond = float64(em.Samples) / em.Seconds
	}
	return em, nil
}

// partial is what a call that stopped mid-epoch measured.
func (t *Trainer) partial(epoch int, start time.Time, left bool) trainer.EpochMetrics {
	return trainer.EpochMetrics{Epoch: epoch, Steps: max(t.epoch.steps, t.cursor.Step), TrainLoss: t.epoch.loss,
		Seconds: time.Since(start).Seconds(), Left: left}
}

// noteLoss keeps the loss a program reported at step (its train_loss, or
// its loss), if it reported one.
func (t *Trainer) noteLoss(metrics map[string]float64, step int) {
	if v, ok := metrics["train_loss"]; ok {
		t.epoch.loss, t.epoch.lossAt = v, step
	} else if v, ok := metrics["loss"]; ok {
		t.epoch.loss, t.epoch.lossAt = v, step
	}
}

// progress tells the caller where the program stands, once per step it learns of.
func (t *Trainer) progress(opts trainer.EpochOptions, epoch, step int) {
	if opts.Progress == nil || step <= t.epoch.reported {
		return
	}
	t.epoch.reported = step
	// The program's newest loss is this step's only if it reported it at this step.
	known := t.epoch.lossAt == step
	opts.Progress(trainer.Progress{Epoch: epoch, Step: step, Steps: max(t.epoch.steps, step), Loss: t.epoch.loss, NoLoss: !known})
}
