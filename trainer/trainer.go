// Package trainer owns what one rank of a data-parallel run does: the Trainer
// interface every backend implements (build or restore state, train an epoch
// on this rank's shard with a gradient all-reduce every step, evaluate, save
// state), and the types they report. Backends live in sub-packages: native
// (pure Go on gonum, the default) and exectrainer (your program per rank),
// each registering itself by name (Register) so that a spec's "trainer"
// picks it and a Go user adds one without touching the workers' code. It
// knows nothing of Temporal: the activities drive a Trainer, and trainertest
// is the conformance suite every backend passes.
package trainer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
)

// Trainer is one rank's replica of the model and optimizer. Calls are not
// concurrent. Every rank of a gang calls the same methods in the same order,
// since most of them communicate.
type Trainer interface {
	// Init builds fresh state from the configured seed; every rank ends with identical state.
	Init(ctx context.Context) error
	// Restore replaces the state with a saved one. On error the trainer keeps
	// the state it had: a corrupt or incompatible checkpoint is never half-loaded.
	Restore(ctx context.Context, from StateReader) error
	// TrainEpoch runs the rest of the given epoch on this rank's shard from the
	// cursor, all-reducing gradients every step. The epoch must be the cursor's.
	// It may end early, at a step every rank agrees on (see EpochOptions); the
	// cursor then stands mid-epoch, and a later call goes on from there.
	TrainEpoch(ctx context.Context, epoch int, opts EpochOptions) (EpochMetrics, error)
	// Evaluate scores the model on the test set, split across the ranks.
	Evaluate(ctx context.Context) (EvalMetrics, error)
	// Save writes the whole state (weights, optimizer, RNG, cursor) deterministically.
	Save(ctx context.Context, to StateWriter) error
	// Cursor is where training stands: the next epoch and the next step within it.
	Cursor() Cursor
	// Close releases what the trainer holds (processes, buffers).
	Close() error
}

// Snapshotter is a Trainer whose whole state lives in its own memory and
// can be copied there at once. A checkpoint within an epoch is then written
// in the background from the copy while the gang trains on
// (checkpoint.async): training stalls only for the copy.
type Snapshotter interface {
	// Snapshot copies the state into memory: the objects Save would write,
	// byte for byte. Training may change the state as soon as it returns.
	Snapshot(ctx context.Context) (MemState, error)
}

// SnapshotRecycler is a Snapshotter that can copy its next snapshot into
// the memory of one its caller has finished with. A state of gigabytes is
// then copied into pages already mapped, not into fresh ones at every
// checkpoint: a fresh page costs a fault, and on a virtual machine whose
// host takes freed memory back, much more than the copy (BENCHMARKS.md).
type SnapshotRecycler interface {
	Snapshotter
	// Recycle hands back a snapshot this trainer made. The caller must not
	// read it, or anything taken from it, again: a later Snapshot may
	// overwrite it. A snapshot handed back twice, or one the trainer did not
	// make, is ignored. Safe to call from any goroutine.
	Recycle(MemState)
}

// Cursor is a position in training: Step steps of Epoch are done.
type Cursor struct {
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
}

// EpochOptions steer one TrainEpoch call. The zero value trains the epoch to its end.
type EpochOptions struct {
	// Progress, if set, is called after every step, or, for a backend whose
	// steps run elsewhere (the exec backend's program), after each step it
	// learns of (where the gang stops to agree; at least the epoch's last).
	Progress func(Progress)
	// Leave, once closed, asks the gang to stop early, as a worker does when it
	// is told to shut down: this rank votes in the next step's all-reduce, and
	// every rank of the gang stops after that same step with the metrics
	// marked Left and the cursor mid-epoch, ready to be saved.
	Leave <-chan struct{}
	// UntilStep, when above the cursor's step, ends the call after that step of
	// the epoch (for a mid-epoch checkpoint). Every rank must pass the same value.
	UntilStep int
}

// Progress is reported after every training step.
type Progress struct {
	Epoch, Step, Steps int
	Loss               float64 // the step's loss, averaged over every rank's batch
	// NoLoss says that the trainer does not know this step's loss (Loss is
	// then not one): a program that reports its loss per epoch, or not at
	// this step. Nothing records a loss for such a step.
	NoLoss bool
}

// EpochMetrics is what an epoch of training measured.
type EpochMetrics struct {
	Epoch            int     `json:"epoch"`
	Steps            int     `json:"steps"`
	TrainLoss        float64 `json:"train_loss"` // mean over the epoch's steps run here
	Samples          int     `json:"samples"`    // over all ranks
	Seconds          float64 `json:"seconds"`
	SamplesPerSecond float64 `json:"samples_per_second"` // over all ranks
	// Left is set when the call ended early because a rank of the gang asked
	// to leave (EpochOptions.Leave); the cursor is then mid-epoch.
	Left bool `json:"left,omitempty"`
}

// EvalMetrics is what an evaluation measured over the whole test set.
type EvalMetrics struct {
	TestLoss     float64 `json:"test_loss"`
	TestAccuracy float64 `json:"test_accuracy"`
	Examples     int     `json:"examples"`
	// Other is any other metric the backend measured for the epoch, by name
	// (at most spec.MaxOtherMetrics); Absent names those of train_loss,
	// test_loss and test_accuracy it did not (their fields are then 0).
	Other  map[string]float64 `json:"other,omitempty"`
	Absent []string           `json:"absent,omitempty"`
}

// Reducer is the collective a trainer needs; *collective.Group implements it.
type Reducer interface {
	AllReduce(ctx context.Context, buf []float32) error
	Broadcast(ctx context.Context, buf []float32, root int) error
	Rank() int
	World() int
}

// CallerDrivenReducer is a Reducer whose all-reduces a trainer can start
// and then move along from its own goroutine, between pieces of its
// computation, where CallerDriven says that pays (a host whose ranks fill
// its cores: no core is left for a thread that communicates beside the
// one that computes). *collective.Group implements it.
type CallerDrivenReducer interface {
	Reducer
	// CallerDriven reports whether StartAllReduce returns before the
	// operation completes; if not, it completes it first.
	CallerDriven() bool
	// StartAllReduce begins an all-reduce of buf, which stays the
	// reducer's until Wait returns; operations complete in the order
	// started, and any other operation waits for them.
	StartAllReduce(ctx context.Context, buf []float32) error
	// Progress moves the started operations along without waiting.
	Progress() error
	// Wait returns once every started operation is complete.
	Wait() error
}

// StateWriter creates the named objects a trainer saves its state into.
type StateWriter interface {
	Create(ctx context.Context, name string) (io.WriteCloser, error)
}

// StateReader opens the named objects of a saved state.
type StateReader interface {
	Open(ctx context.Context, name string) (io.ReadCloser, error)
}

// PartsRestorer is a Trainer that can restore from every rank's part of a
// sharded checkpoint at once, merged into one state (checkpoint.merge_shards:
// Ray Train's distributed checkpoints, whose directory holds every worker's
// files, as torch.distributed.checkpoint writes them). parts[r] is rank r's.
type PartsRestorer interface {
	RestoreParts(ctx context.Context, parts []StateReader) error
}

// ErrFinished: the program's own training ended before the epochs the run
// asked for (a Ray-style train_loop_per_worker that returned after its last
// report). Not a failure: the run ends there, completed.
var ErrFinished = errors.New("the program finished training")

// ErrNoCheckpoint: the program chose to report an epoch without a
// checkpoint (a Ray-style report of metrics alone), so there is nothing to
// save at this cursor; the run keeps its latest checkpoint, as Ray's does.
var ErrNoCheckpoint = errors.New("the program reported this epoch without a checkpoint")

// ErrDiverged: the loss became NaN or infinite. Retrying the same
// configuration cannot help, so it is a user error (errors.Is(err, ErrUser)).
var ErrDiverged = UserError(errors.New("training diverged"))

// DivergedError says where the loss stopped being finite.
func DivergedError(epoch, step int, loss float64) error {
	return fmt.Errorf("%w: loss is %v at epoch %d step %d; lower the learning rate or check the data", ErrDiverged, loss, epoch, step)
}

// Local is the Reducer of a single rank: every collective is the identity.
type Local struct{}

func (Local) AllReduce(context.Context, []float32) error      { return nil }
func (Local) Broadcast(context.Context, []float32, int) error { return nil }
func (Local) Rank() int                                       { return 0 }
func (Local) World() int                                      { return 1 }

// MemState is an in-memory StateWriter and StateReader, for tests and tools.
type MemState map[string][]byte

func (m MemState) Create(_ context.Context, name string) (io.WriteCloser, error) {
	return &memObject{m: m, name: name}, nil
}

func (m MemState) Open(_ context.Context, name string) (io.ReadCloser, error) {
	b, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("no object %q", name)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// Bytes is the size of the state's objects together.
func (m MemState) Bytes() int64 {
	var n int64
	for _, b := range m {
		n += int64(len(b))
	}
	return n
}

// WriteTo writes every object into w, in name order.
func (m MemState) WriteTo(ctx context.Context, w StateWriter) error {
	for _, name := range slices.Sorted(maps.Keys(m)) {
		o, err := w.Create(ctx, name)
		if err != nil {
			return err
		}
		_, err = o.Write(m[name])
		if err = errors.Join(err, o.Close()); err != nil {
			return err
		}
	}
	return nil
}

type memObject struct {
	bytes.Buffer
	m    MemState
	name string
}

func (o *memObject) Close() error { o.m[o.name] = o.Bytes(); return nil }
