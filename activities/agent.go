package activities

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
)

// Slot is one unit a gang can reserve: a GPU, or a CPU slot where there is none.
type Slot struct {
	Index  int
	GPU    string // name and UUID, for placements and logs; empty for a CPU slot
	Device string // the CUDA_VISIBLE_DEVICES value that pins a rank to it
}

// Agent serves the activities of one worker process.
type Agent struct {
	Identity  string // the worker's identity, shown in placements
	HostQueue string // a task queue only this worker polls
	Listener  *collective.Listener
	Advertise string // the collective address peers dial; default Listener.Addr()
	Slots     []Slot
	Log       *zap.Logger

	mu       sync.Mutex
	busy     map[int]bool
	replicas map[replicaKey]*replica
	data     map[string]*loadedData
}

type replicaKey struct {
	workflowID string
	generation int
	rank       int
}

// replica is one rank's warm state: its gang membership, its trainer, its store.
type replica struct {
	group *collective.Group
	tr    trainer.Trainer
	store *checkpoint.Store
}

func (r *replica) close() {
	if r.group != nil {
		r.group.Close()
	}
	if r.tr != nil {
		r.tr.Close()
	}
	if r.store != nil {
		r.store.Close()
	}
}

type loadedData struct {
	once        sync.Once
	train, test *dataset.Set
	err         error
}

func (a *Agent) init() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.busy == nil {
		a.busy, a.replicas, a.data = map[int]bool{}, map[replicaKey]*replica{}, map[string]*loadedData{}
	}
	if a.Log == nil {
		a.Log = zap.NewNop()
	}
}

// HoldSlot reserves a free slot for one rank of a gang, tells the workflow
// where it is, and holds it, heartbeating, until the workflow releases it (by
// cancelling) or the worker shuts down (a preemption).
func (a *Agent) HoldSlot(ctx context.Context, in spec.HoldSlotInput) error {
	a.init()
	slot, ok := a.takeSlot()
	if !ok {
		return temporal.NewApplicationError(fmt.Sprintf("no free slot on %s", a.Identity), "durabletrain.NoSlot")
	}
	key := replicaKey{in.WorkflowID, in.Generation, in.Request}
	defer func() {
		a.dropReplica(key)
		a.freeSlot(slot.Index)
	}()
	placement := spec.Placement{Rank: in.Request, Worker: a.Identity, HostQueue: a.HostQueue, Collective: a.advertise(), Slot: slot.Index, GPU: slot.GPU}
	if err := activity.GetClient(ctx).SignalWorkflow(ctx, in.WorkflowID, in.RunID, spec.SignalSlotGranted,
		spec.SlotGranted{Generation: in.Generation, Request: in.Request, Placement: placement}); err != nil {
		return fmt.Errorf("telling workflow %s about slot %d: %w", in.WorkflowID, slot.Index, err)
	}
	a.Log.Info("slot held", zap.String("workflow", in.WorkflowID), zap.Int("generation", in.Generation),
		zap.Int("rank", in.Request), zap.Int("slot", slot.Index), zap.String("gpu", slot.GPU))
	t := time.NewTicker(heartbeatInterval(ctx))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			// Released by the workflow (the gang ended): the expected end of a hold.
			a.Log.Info("slot released", zap.String("workflow", in.WorkflowID), zap.Int("generation", in.Generation), zap.Int("slot", slot.Index))
			return nil
		case <-activity.GetWorkerStopChannel(ctx):
			return preempted(a.Identity)
		case <-t.C:
			activity.RecordHeartbeat(ctx, placement)
		}
	}
}

// RunEpoch trains the epoch the rank's state is at, on this rank's shard.
func (a *Agent) RunEpoch(ctx context.Context, in spec.EpochInput) (spec.EpochResult, error) {
	a.init()
	key := replicaKey{activity.GetInfo(ctx).WorkflowExecution.ID, in.Generation, in.Rank}
	beat := startHeartbeat(ctx)
	defer beat.stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-activity.GetWorkerStopChannel(ctx):
			cancel(errShuttingDown)
		case <-ctx.Done():
		}
	}()

	rep, restored, err := a.replica(ctx, key, in, beat)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, err)
	}
	epoch := rep.tr.Cursor().Epoch
	m, err := rep.tr.TrainEpoch(ctx, epoch, func(p trainer.Progress) {
		beat.set(map[string]any{"epoch": p.Epoch, "step": p.Step, "steps": p.Steps, "loss": p.Loss})
	})
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, err)
	}
	e, err := rep.tr.Evaluate(ctx)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, err)
	}
	res := spec.EpochResult{Rank: in.Rank, Restored: restored, Metrics: spec.EpochMetrics{
		Epoch: epoch, Steps: m.Steps, TrainLoss: m.TrainLoss, TestLoss: e.TestLoss, TestAccuracy: e.TestAccuracy,
		SamplesPerSecond: m.SamplesPerSecond, Seconds: m.Seconds}}
	a.Log.Info("epoch done", zap.String("run", in.Run), zap.Int("generation", in.Generation), zap.Int("rank", in.Rank),
		zap.Int("epoch", epoch), zap.Float64("train_loss", m.TrainLoss), zap.Float64("test_accuracy", e.TestAccuracy),
		zap.Float64("samples_per_second", m.SamplesPerSecond))
	every := max(1, in.Spec.Checkpoint.EveryEpochs)
	if in.Rank == 0 && (in.Checkpoint || (epoch+1)%every == 0 || epoch+1 >= in.Spec.Hyper.Epochs) {
		beat.set(map[string]any{"epoch": epoch, "checkpointing": true})
		ref, err := a.save(ctx, rep, in.Run, in.Spec, len(in.Peers), res.Metrics)
		if err != nil {
			return spec.EpochResult{}, a.classify(ctx, key, err)
		}
		res.Checkpoint = ref
	}
	return res, nil
}

// SaveCheckpoint checkpoints rank 0's warm replica now (on stop).
func (a *Agent) SaveCheckpoint(ctx context.Context, in spec.SaveCheckpointInput) (spec.CheckpointRef, error) {
	a.init()
	key := replicaKey{activity.GetInfo(ctx).WorkflowExecution.ID, in.Generation, 0}
	a.mu.Lock()
	rep := a.replicas[key]
	a.mu.Unlock()
	if rep == nil {
		return spec.CheckpointRef{}, fmt.Errorf("no warm replica of rank 0 for generation %d on %s", in.Generation, a.Identity)
	}
	ref, err := a.save(ctx, rep, in.Run, in.Spec, in.Spec.Scaling.Workers, in.Metrics)
	if err != nil {
		return spec.CheckpointRef{}, err
	}
	return *ref, nil
}

// replica returns the rank's warm replica, or builds one: join the gang,
// load the data, and restore from the latest verified checkpoint (or start
// fresh, or from spec.resume_from).
func (a *Agent) replica(ctx context.Context, key replicaKey, in spec.EpochInput, beat *heartbeat) (*replica, *spec.RestoreReport, error) {
	a.mu.Lock()
	rep := a.replicas[key]
	a.mu.Unlock()
	if rep != nil && rep.tr.Cursor().Step == 0 {
		return rep, nil, nil
	}
	beat.set(map[string]any{"phase": "loading data"})
	train, test, err := a.dataset(ctx, in.Spec.Dataset.URL)
	if err != nil {
		return nil, nil, userError(err)
	}
	store, err := checkpoint.Open(ctx, in.Spec.Checkpoint.URL, a.Log)
	if err != nil {
		return nil, nil, userError(err)
	}
	rep = &replica{store: store}
	beat.set(map[string]any{"phase": "joining gang"})
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	rep.group, err = collective.Join(jctx, a.Listener, collective.Gang{Run: key.workflowID, Generation: uint64(in.Generation), Peers: in.Peers},
		in.Rank, collective.Options{Secret: in.Secret, StallTimeout: stallTimeout(in.Spec), Logger: a.Log})
	if err != nil {
		rep.close()
		return nil, nil, err
	}
	h := in.Spec.Hyper
	rep.tr, err = native.New(native.Config{Hidden: in.Spec.Model.Hidden, Optimizer: h.Optimizer, LR: h.LR, Momentum: h.Momentum,
		WeightDecay: h.WeightDecay, BatchSize: h.BatchSize, Seed: h.Seed}, train, test, rep.group)
	if err != nil {
		rep.close()
		return nil, nil, userError(err)
	}
	beat.set(map[string]any{"phase": "restoring"})
	var report *spec.RestoreReport
	from := in.Run
	if in.Restore == nil {
		from = in.Spec.ResumeFrom
	}
	if from == "" {
		err = rep.tr.Init(ctx)
	} else {
		var c *checkpoint.Checkpoint
		c, err = store.RestoreLatest(ctx, from, func(c *checkpoint.Checkpoint) error { return rep.tr.Restore(ctx, c) })
		if err == nil {
			report = &spec.RestoreReport{From: refOf(c)}
			for _, s := range c.Skipped {
				report.Skipped = append(report.Skipped, spec.SkippedCheckpoint{ID: s.ID, Reason: s.Reason})
			}
			a.Log.Info("restored", zap.String("run", from), zap.String("checkpoint", c.Manifest.ID), zap.Int("rank", in.Rank), zap.Int("skipped", len(c.Skipped)))
		} else if errors.Is(err, checkpoint.ErrNoCheckpoint) {
			err = userError(fmt.Errorf("cannot resume run %s: %w", from, err))
		}
	}
	if err != nil {
		rep.close()
		return nil, nil, err
	}
	a.mu.Lock()
	if old := a.replicas[key]; old != nil {
		old.close()
	}
	a.replicas[key] = rep
	a.mu.Unlock()
	return rep, report, nil
}

func (a *Agent) save(ctx context.Context, rep *replica, run string, s spec.Training, world int, m spec.EpochMetrics) (*spec.CheckpointRef, error) {
	c := rep.tr.Cursor()
	w, err := rep.store.Begin(ctx, run, c.Epoch, c.Step)
	if err != nil {
		return nil, err
	}
	if err := rep.tr.Save(ctx, w); err != nil {
		return nil, err
	}
	manifest, err := w.Commit(ctx, checkpoint.Info{WorldSize: world, Meta: map[string]string{"trainer": s.Trainer, "worker": a.Identity},
		Metrics: map[string]float64{"test_accuracy": m.TestAccuracy, "test_loss": m.TestLoss, "train_loss": m.TrainLoss}})
	if err != nil {
		return nil, err
	}
	cp := s.Checkpoint
	if deleted, err := rep.store.Prune(ctx, run, checkpoint.Retention{KeepLast: cp.KeepLast, KeepBest: cp.KeepBest, Score: cp.Score, Mode: cp.Mode}); err != nil {
		a.Log.Warn("checkpoint retention failed", zap.String("run", run), zap.Error(err))
	} else if len(deleted) > 0 {
		a.Log.Info("checkpoints pruned", zap.String("run", run), zap.Strings("deleted", deleted))
	}
	return &spec.CheckpointRef{URL: rep.store.URL(), Run: run, ID: manifest.ID, Epoch: manifest.Epoch, Step: manifest.Step}, nil
}

func refOf(c *checkpoint.Checkpoint) spec.CheckpointRef {
	r := c.Ref()
	return spec.CheckpointRef{URL: r.URL, Run: r.Run, ID: r.ID, Epoch: c.Manifest.Epoch, Step: c.Manifest.Step}
}

func (a *Agent) dataset(ctx context.Context, url string) (*dataset.Set, *dataset.Set, error) {
	a.mu.Lock()
	d := a.data[url]
	if d == nil {
		d = &loadedData{}
		a.data[url] = d
	}
	a.mu.Unlock()
	d.once.Do(func() {
		if d.train, d.err = dataset.Load(ctx, url, dataset.Train); d.err == nil {
			d.test, d.err = dataset.Load(ctx, url, dataset.Test)
		}
	})
	if d.err != nil {
		a.mu.Lock()
		delete(a.data, url) // try again next time
		a.mu.Unlock()
	}
	return d.train, d.test, d.err
}

func (a *Agent) takeSlot() (Slot, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, s := range a.Slots {
		if !a.busy[s.Index] {
			a.busy[s.Index] = true
			return s, true
		}
	}
	return Slot{}, false
}

func (a *Agent) freeSlot(i int) {
	a.mu.Lock()
	delete(a.busy, i)
	a.mu.Unlock()
}

func (a *Agent) dropReplica(key replicaKey) {
	a.mu.Lock()
	rep := a.replicas[key]
	delete(a.replicas, key)
	a.mu.Unlock()
	if rep != nil {
		rep.close()
	}
}

func (a *Agent) advertise() string {
	if a.Advertise != "" {
		return a.Advertise
	}
	return a.Listener.Addr()
}

var errShuttingDown = errors.New("the worker is shutting down")

// classify turns an error into what the workflow's failure policy reads, and
// drops the replica: after a failed step its gang is gone.
func (a *Agent) classify(ctx context.Context, key replicaKey, err error) error {
	a.dropReplica(key)
	var app *temporal.ApplicationError
	switch {
	case errors.Is(context.Cause(ctx), errShuttingDown):
		return preempted(a.Identity)
	case errors.As(err, &app):
		return err
	case errors.Is(err, trainer.ErrDiverged):
		return userError(err)
	}
	return err
}

func userError(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, err)
}

func preempted(worker string) error {
	return temporal.NewApplicationError(fmt.Sprintf("worker %s is shutting down", worker), spec.ErrPreempted)
}

// stallTimeout: a silent peer is declared stalled within half the heartbeat timeout,
// so the rank that sees it reports before Temporal times the rank out.
func stallTimeout(s spec.Training) time.Duration {
	return max(time.Second, time.Duration(s.Failure.HeartbeatTimeout)/2)
}
