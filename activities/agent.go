package activities

import (
	"context"
	"errors"
	"fmt"
	"os"
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
	"github.com/durabletrain/durabletrain/trainer/exectrainer"
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
	Devices   DeviceStats // reads GPU utilisation and memory for heartbeats and logs; nil on CPU slots
	Log       *zap.Logger
	// PythonPath is where the durabletrain Python module is, for exec runs
	// (prepended to their PYTHONPATH).
	PythonPath string
	// Transport is the collective's transport: "" (shared memory between
	// ranks on one host, else TCP) or "tcp" (always TCP: hosts that share a
	// kernel but should not share memory, as network namespaces do).
	Transport string
	// LeaveTimeout bounds how long ranks of a stopping worker take to stop
	// with their gang and checkpoint before they are cut off; default 8s.
	// Keep it below the worker's stop grace.
	LeaveTimeout time.Duration

	mu       sync.Mutex
	busy     map[int]bool
	replicas map[replicaKey]*replica
	// By slot index: a slot serves one rank of one gang at a time.
	epochs map[int]chan struct{}       // closed when the slot's running RunEpoch returns
	refs   map[int]*spec.CheckpointRef // the latest checkpoint the slot's gang committed
	data   map[string]*loadedData
}

// DeviceStats reads what a GPU slot is doing; gpuworker implements it with NVML.
type DeviceStats interface {
	Stats(slot Slot) (GPUStats, bool)
}

// GPUStats is a GPU's load, as heartbeats and logs show it.
type GPUStats struct {
	UtilizationPercent int    `json:"gpu_utilization_percent"`
	MemoryUsedBytes    uint64 `json:"gpu_memory_used_bytes"`
	MemoryTotalBytes   uint64 `json:"gpu_memory_total_bytes"`
}

type replicaKey struct {
	workflowID string
	generation int
	rank       int
}

// replica is one rank's warm state: its gang membership, its trainer, its store.
type replica struct {
	slot    int    // the slot index it runs on
	scratch string // an exec rank's directory, removed with the replica
	group   *collective.Group
	tr      trainer.Trainer
	store   *checkpoint.Store
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
	if r.scratch != "" {
		os.RemoveAll(r.scratch)
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
		a.epochs, a.refs = map[int]chan struct{}{}, map[int]*spec.CheckpointRef{}
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
	defer func() {
		a.dropReplicasOn(in.WorkflowID, slot.Index)
		a.mu.Lock()
		delete(a.refs, slot.Index)
		a.mu.Unlock()
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
			// Let the rank's epoch stop with its gang and checkpoint first:
			// a lease lost now would cancel the gang mid-checkpoint.
			a.waitEpoch(ctx, slot.Index)
			a.Log.Info("slot given up: the worker is stopping", zap.String("workflow", in.WorkflowID), zap.Int("generation", in.Generation), zap.Int("slot", slot.Index))
			return a.preempted(slot.Index)
		case <-t.C:
			activity.RecordHeartbeat(ctx, placement)
		}
	}
}

// RunEpoch trains the epoch the rank's state is at, on this rank's shard.
//
// When the worker is told to shut down (SIGTERM, a preemption) the rank does
// not drop out: it votes to leave in the next step's all-reduce, the whole
// gang stops after that same step, rank 0 checkpoints there (mid-epoch), and
// every rank returns a preemption that carries the checkpoint's reference.
// Only if that takes longer than LeaveTimeout is the rank cut off.
func (a *Agent) RunEpoch(ctx context.Context, in spec.EpochInput) (spec.EpochResult, error) {
	a.init()
	key := replicaKey{activity.GetInfo(ctx).WorkflowExecution.ID, in.Generation, in.Rank}
	defer a.running(in.Slot)()
	beat := startHeartbeat(ctx, a.gpuStats(in.Slot))
	defer beat.stop()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	leave := make(chan struct{})
	go func() {
		select {
		case <-activity.GetWorkerStopChannel(ctx):
			close(leave)
			a.Log.Info("worker stopping: the gang leaves at the next step", zap.String("run", in.Run),
				zap.Int("generation", in.Generation), zap.Int("rank", in.Rank), zap.Duration("leave_timeout", a.leaveTimeout()))
			select {
			case <-time.After(a.leaveTimeout()):
				cancel(errShuttingDown)
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()

	rep, restored, err := a.replica(ctx, key, in, beat)
	if err == nil && isClosed(leave) {
		err = errShuttingDown // joined or restored while stopping: nothing trained, nothing to save
	}
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	epoch := rep.tr.Cursor().Epoch
	m, err := a.trainEpoch(ctx, key, rep, in, leave, beat)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	if m.Left {
		return spec.EpochResult{}, a.leaveGang(ctx, key, rep, in, leave, beat)
	}
	e, err := rep.tr.Evaluate(ctx)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	res := spec.EpochResult{Rank: in.Rank, Restored: restored, Metrics: spec.EpochMetrics{
		Epoch: epoch, Steps: m.Steps, TrainLoss: m.TrainLoss, TestLoss: e.TestLoss, TestAccuracy: e.TestAccuracy,
		SamplesPerSecond: m.SamplesPerSecond, Seconds: m.Seconds}}
	fields := []zap.Field{zap.String("run", in.Run), zap.Int("generation", in.Generation), zap.Int("rank", in.Rank),
		zap.Int("epoch", epoch), zap.Float64("train_loss", m.TrainLoss), zap.Float64("test_accuracy", e.TestAccuracy),
		zap.Float64("samples_per_second", m.SamplesPerSecond)}
	if gpu := a.gpuStats(in.Slot); gpu != nil {
		if g, ok := gpu(); ok {
			fields = append(fields, zap.Int("gpu_utilization_percent", g.UtilizationPercent), zap.Uint64("gpu_memory_used_bytes", g.MemoryUsedBytes))
		}
	}
	a.Log.Info("epoch done", fields...)
	// A rank whose worker began stopping during the epoch's last step or the
	// evaluation asks for a checkpoint now, so its gang's successor loses nothing.
	leaving, err := a.anyLeaving(ctx, rep, leave)
	if err != nil {
		return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
	}
	every := max(1, in.Spec.Checkpoint.EveryEpochs)
	if in.Checkpoint || leaving || (epoch+1)%every == 0 || epoch+1 >= in.Spec.Hyper.Epochs {
		beat.set(map[string]any{"epoch": epoch, "checkpointing": true})
		ref, err := a.checkpointTogether(ctx, key, rep, in, &res.Metrics)
		if err != nil {
			return spec.EpochResult{}, a.classify(ctx, key, in.Slot, err, leave)
		}
		res.Checkpoint = ref
	}
	return res, nil
}

// trainEpoch trains the rest of the replica's epoch, stopping every
// checkpoint.every_steps steps for a mid-epoch checkpoint, and returns the
// metrics of all the steps it ran.
func (a *Agent) trainEpoch(ctx context.Context, key replicaKey, rep *replica, in spec.EpochInput, leave chan struct{}, beat *heartbeat) (trainer.EpochMetrics, error) {
	epoch := rep.tr.Cursor().Epoch
	every := in.Spec.Checkpoint.EverySteps
	var total trainer.EpochMetrics
	var lossSum float64
	ran := 0
	for {
		from := rep.tr.Cursor().Step
		opts := trainer.EpochOptions{Leave: leave, Progress: func(p trainer.Progress) {
			beat.set(map[string]any{"epoch": p.Epoch, "step": p.Step, "steps": p.Steps, "loss": p.Loss})
		}}
		if every > 0 {
			opts.UntilStep = (from/every + 1) * every
		}
		m, err := rep.tr.TrainEpoch(ctx, epoch, opts)
		if err != nil {
			return m, err
		}
		c := rep.tr.Cursor()
		n := m.Steps - from // steps run when the epoch ended
		if c.Epoch == epoch {
			n = c.Step - from
		}
		total.Epoch, total.Steps, total.Left = epoch, m.Steps, m.Left
		total.Samples += m.Samples
		total.Seconds += m.Seconds
		lossSum += m.TrainLoss * float64(n)
		ran += n
		if ran > 0 {
			total.TrainLoss = lossSum / float64(ran)
		}
		if total.Seconds > 0 {
			total.SamplesPerSecond = float64(total.Samples) / total.Seconds
		}
		if m.Left || c.Epoch != epoch {
			return total, nil
		}
		// Stopped at an every_steps boundary: checkpoint there and go on.
		beat.set(map[string]any{"epoch": epoch, "step": c.Step, "checkpointing": true})
		if _, err := a.checkpointTogether(ctx, key, rep, in, nil); err != nil {
			return total, err
		}
	}
}

// leaveGang ends an epoch the gang voted to leave: checkpoint where every
// rank stopped, then report the preemption with that checkpoint.
func (a *Agent) leaveGang(ctx context.Context, key replicaKey, rep *replica, in spec.EpochInput, leave chan struct{}, beat *heartbeat) error {
	c := rep.tr.Cursor()
	beat.set(map[string]any{"epoch": c.Epoch, "step": c.Step, "checkpointing": true, "leaving": true})
	ref, err := a.checkpointTogether(ctx, key, rep, in, nil)
	a.dropReplica(key)
	msg := fmt.Sprintf("worker %s is shutting down", a.Identity)
	if !isClosed(leave) {
		msg = "stopped with its gang: another rank's worker is shutting down"
	}
	if err != nil {
		a.Log.Warn("leaving without a checkpoint", zap.String("run", in.Run), zap.Int("rank", in.Rank), zap.Error(err))
		return temporal.NewApplicationError(msg+"; the checkpoint on leaving failed: "+err.Error(), spec.ErrPreempted)
	}
	a.Log.Info("left the gang after a checkpoint", zap.String("run", in.Run), zap.Int("rank", in.Rank), zap.String("checkpoint", ref.ID))
	return temporal.NewApplicationError(fmt.Sprintf("%s; checkpointed at epoch %d step %d", msg, ref.Epoch, ref.Step), spec.ErrPreempted, *ref)
}

// anyLeaving asks the gang whether any rank's worker is stopping (one float all-reduce).
func (a *Agent) anyLeaving(ctx context.Context, rep *replica, leave chan struct{}) (bool, error) {
	vote := []float32{0}
	if isClosed(leave) {
		vote[0] = 1
	}
	if err := rep.group.AllReduce(ctx, vote); err != nil {
		return false, err
	}
	return vote[0] > 0, nil
}

// checkpointTogether has rank 0 save and commit, then tells every rank
// whether the commit succeeded, so each can report the same reference (the
// workflow learns it from whichever rank answers first). metrics is nil for
// a mid-epoch checkpoint.
func (a *Agent) checkpointTogether(ctx context.Context, key replicaKey, rep *replica, in spec.EpochInput, metrics *spec.EpochMetrics) (*spec.CheckpointRef, error) {
	ok := []float32{0}
	var saveErr error
	if in.Rank == 0 {
		if _, saveErr = a.save(ctx, rep, in.Run, in.Spec, len(in.Peers), metrics); saveErr == nil {
			ok[0] = 1
		}
	}
	if err := rep.group.AllReduce(ctx, ok); err != nil {
		return nil, errors.Join(saveErr, err)
	}
	switch {
	case saveErr != nil:
		return nil, saveErr
	case ok[0] == 0:
		return nil, errors.New("rank 0 could not commit the checkpoint")
	}
	c := rep.tr.Cursor()
	ref := &spec.CheckpointRef{URL: rep.store.URL(), Run: in.Run, ID: checkpoint.ID(c.Epoch, c.Step), Epoch: c.Epoch, Step: c.Step}
	a.mu.Lock()
	a.refs[in.Slot] = ref
	a.mu.Unlock()
	return ref, nil
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
	ref, err := a.save(ctx, rep, in.Run, in.Spec, in.Spec.Scaling.Workers, &in.Metrics)
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
	var train, test *dataset.Set
	var err error
	if in.Spec.Trainer != "exec" { // an exec program loads its own data
		beat.set(map[string]any{"phase": "loading data"})
		if train, test, err = a.dataset(ctx, in.Spec.Dataset.URL); err != nil {
			return nil, nil, userError(err)
		}
	}
	store, err := checkpoint.Open(ctx, in.Spec.Checkpoint.URL, a.Log)
	if err != nil {
		return nil, nil, userError(err)
	}
	rep = &replica{store: store, slot: in.Slot}
	beat.set(map[string]any{"phase": "joining gang"})
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	rep.group, err = collective.Join(jctx, a.Listener, collective.Gang{Run: key.workflowID, Generation: uint64(in.Generation), Peers: in.Peers},
		in.Rank, collective.Options{Secret: in.Secret, StallTimeout: stallTimeout(in.Spec), Transport: a.Transport, Logger: a.Log})
	if err != nil {
		rep.close()
		return nil, nil, err
	}
	if in.Spec.Trainer == "exec" {
		rep.tr, err = a.execTrainer(ctx, rep, in)
	} else {
		h := in.Spec.Hyper
		batch := h.BatchSize
		if in.BatchSize > 0 {
			batch = in.BatchSize
		}
		rep.tr, err = native.New(native.Config{Hidden: in.Spec.Model.Hidden, Optimizer: h.Optimizer, LR: h.LR, Momentum: h.Momentum,
			WeightDecay: h.WeightDecay, BatchSize: batch, Seed: h.Seed}, train, test, rep.group)
	}
	if err != nil {
		rep.close()
		if errors.Is(err, errGangBroken) {
			return nil, nil, err
		}
		return nil, nil, userError(err)
	}
	beat.set(map[string]any{"phase": "restoring"})
	report, err := a.restore(ctx, store, rep, in)
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

// restore brings a cold replica to where its run stands: the run's latest
// verified checkpoint once the run has trained before (Resume, or a known
// checkpoint), else spec.resume_from's, else fresh weights.
func (a *Agent) restore(ctx context.Context, store *checkpoint.Store, rep *replica, in spec.EpochInput) (*spec.RestoreReport, error) {
	sources := []string{}
	if in.Restore != nil || in.Resume {
		sources = append(sources, in.Run)
	}
	if in.Spec.ResumeFrom != "" {
		sources = append(sources, in.Spec.ResumeFrom)
	}
	for i, from := range sources {
		c, err := store.RestoreLatest(ctx, from, func(c *checkpoint.Checkpoint) error { return rep.tr.Restore(ctx, c) })
		switch {
		case err == nil:
			report := &spec.RestoreReport{From: refOf(c)}
			for _, s := range c.Skipped {
				report.Skipped = append(report.Skipped, spec.SkippedCheckpoint{ID: s.ID, Reason: s.Reason})
			}
			a.Log.Info("restored", zap.String("run", from), zap.String("checkpoint", c.Manifest.ID), zap.Int("rank", in.Rank), zap.Int("skipped", len(c.Skipped)))
			if len(report.Skipped) > 0 && in.Rank == 0 {
				// Tell the run now: this epoch may yet fail and its result be lost.
				info := activity.GetInfo(ctx)
				if err := activity.GetClient(ctx).SignalWorkflow(ctx, info.WorkflowExecution.ID, info.WorkflowExecution.RunID, spec.SignalCheckpointSkipped,
					spec.CheckpointsSkipped{Generation: in.Generation, Epoch: c.Manifest.Epoch, Step: c.Manifest.Step, Skipped: report.Skipped}); err != nil {
					a.Log.Warn("could not report the skipped checkpoints", zap.String("run", from), zap.Error(err))
				}
			}
			return report, nil
		case !errors.Is(err, checkpoint.ErrNoCheckpoint):
			return nil, err
		case from == in.Spec.ResumeFrom && i == len(sources)-1:
			return nil, userError(fmt.Errorf("cannot resume from run %s: %w", from, err))
		case in.Restore != nil:
			// The workflow saw this checkpoint committed: its loss is not a fresh start.
			return nil, fmt.Errorf("run %s: checkpoint %s was committed but no verified checkpoint is left: %w", in.Run, in.Restore.ID, err)
		}
		// The run trained before but never committed a checkpoint: go on to the next source.
	}
	return nil, rep.tr.Init(ctx)
}

func (a *Agent) save(ctx context.Context, rep *replica, run string, s spec.Training, world int, m *spec.EpochMetrics) (*spec.CheckpointRef, error) {
	c := rep.tr.Cursor()
	w, err := rep.store.Begin(ctx, run, c.Epoch, c.Step)
	if err != nil {
		return nil, err
	}
	if err := rep.tr.Save(ctx, w); err != nil {
		return nil, err
	}
	info := checkpoint.Info{WorldSize: world, Meta: map[string]string{"trainer": s.Trainer, "worker": a.Identity}}
	if m != nil { // a mid-epoch checkpoint has no evaluation to rank it by
		info.Metrics = map[string]float64{"test_accuracy": m.TestAccuracy, "test_loss": m.TestLoss, "train_loss": m.TrainLoss}
	}
	manifest, err := w.Commit(ctx, info)
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

// dropReplicasOn drops the workflow's replicas that ran on a released slot.
func (a *Agent) dropReplicasOn(workflowID string, slot int) {
	a.mu.Lock()
	var drop []*replica
	for k, rep := range a.replicas {
		if k.workflowID == workflowID && rep.slot == slot {
			drop = append(drop, rep)
			delete(a.replicas, k)
		}
	}
	a.mu.Unlock()
	for _, rep := range drop {
		rep.close()
	}
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
func (a *Agent) classify(ctx context.Context, key replicaKey, slot int, err error, leave chan struct{}) error {
	a.dropReplica(key)
	var app *temporal.ApplicationError
	switch {
	case errors.Is(err, errShuttingDown) || errors.Is(context.Cause(ctx), errShuttingDown) || isClosed(leave):
		return a.preempted(slot)
	case errors.As(err, &app):
		return err
	case errors.Is(err, trainer.ErrDiverged):
		return userError(err)
	}
	var exit *exectrainer.ExitError
	if errors.As(err, &exit) && !exit.Killed() {
		return userError(err) // the program failed on its own: retrying will not help
	}
	return err
}

func userError(err error) error {
	return temporal.NewNonRetryableApplicationError(err.Error(), spec.ErrUser, err)
}

// preempted is the error of a rank or slot whose worker is stopping, with the
// latest checkpoint its gang committed, if any, as details.
func (a *Agent) preempted(slot int) error {
	msg := fmt.Sprintf("worker %s is shutting down", a.Identity)
	a.mu.Lock()
	ref := a.refs[slot]
	a.mu.Unlock()
	if ref != nil {
		return temporal.NewApplicationError(fmt.Sprintf("%s; checkpointed at epoch %d step %d", msg, ref.Epoch, ref.Step), spec.ErrPreempted, *ref)
	}
	return temporal.NewApplicationError(msg, spec.ErrPreempted)
}

// gpuStats reads the load of the GPU the slot pins, or is nil.
func (a *Agent) gpuStats(index int) func() (GPUStats, bool) {
	if a.Devices == nil {
		return nil
	}
	for _, slot := range a.Slots {
		if slot.Index == index && slot.GPU != "" {
			return func() (GPUStats, bool) { return a.Devices.Stats(slot) }
		}
	}
	return nil
}

// running marks the slot's epoch as running until the returned func is called.
func (a *Agent) running(slot int) func() {
	done := make(chan struct{})
	a.mu.Lock()
	a.epochs[slot] = done
	a.mu.Unlock()
	return func() {
		a.mu.Lock()
		if a.epochs[slot] == done {
			delete(a.epochs, slot)
		}
		a.mu.Unlock()
		close(done)
	}
}

// waitEpoch waits until the slot's running epoch, if any, has returned.
func (a *Agent) waitEpoch(ctx context.Context, slot int) {
	a.mu.Lock()
	done := a.epochs[slot]
	a.mu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(a.leaveTimeout() + time.Second):
	}
}

func (a *Agent) leaveTimeout() time.Duration {
	if a.LeaveTimeout > 0 {
		return a.LeaveTimeout
	}
	return 8 * time.Second
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// stallTimeout: a silent peer is declared stalled within half the heartbeat timeout,
// so the rank that sees it reports before Temporal times the rank out.
func stallTimeout(s spec.Training) time.Duration {
	return max(time.Second, time.Duration(s.Failure.HeartbeatTimeout)/2)
}
