// Package spec owns the types that travel through Temporal between the
// workflows and the activities of a training run: the user's Training spec
// (JSON, with Ray Train's vocabulary), its defaults and validation, and the
// inputs and results of the activities. It imports no Temporal package and
// does no I/O, so workflows and activities can both depend on it.
package spec

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/internal/registry"
	"github.com/durabletrain/durabletrain/internal/strictjson"
)

// Training is one training run, as `temporal workflow start --input` or the
// starter gives it. Sections follow Ray Train: scaling (ScalingConfig),
// checkpoint (CheckpointConfig), failure (FailureConfig).
type Training struct {
	// Name names the run's checkpoints in storage; default: the workflow ID.
	Name string `json:"name,omitempty"`
	// Trainer names the backend each rank runs, as registered on the GPU
	// workers (trainer.Register): "native" (default, the Go MLP), "exec"
	// (your own program per rank, see Exec), or one of your own.
	Trainer    string     `json:"trainer,omitempty"`
	Exec       *Exec      `json:"exec,omitempty"`
	Model      Model      `json:"model"`
	Dataset    Dataset    `json:"dataset"`
	Hyper      Hyper      `json:"hyper"`
	Scaling    Scaling    `json:"scaling"`
	Checkpoint Checkpoint `json:"checkpoint"`
	Failure    Failure    `json:"failure"`
	// Config holds the run's hyperparameters by name, as Ray's config (see Config).
	Config Config `json:"config,omitempty"`
	// ResumeFrom starts from the latest verified checkpoint of another run (by name).
	ResumeFrom string `json:"resume_from,omitempty"`
	// SearchAttributes makes the run upsert DurabletrainState (Keyword) and
	// DurabletrainEpoch (Int), so runs can be listed by state and epoch. The
	// namespace must have them (the dev server registers them; elsewhere:
	// `temporal operator search-attribute create`), so it is off by default.
	SearchAttributes bool `json:"search_attributes,omitempty"`
}

// Exec is the program each rank of an "exec" run starts (once per gang),
// with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
// CUDA_VISIBLE_DEVICES set; it imports the durabletrain Python module.
type Exec struct {
	Command []string          `json:"command"`       // e.g. ["python3", "train.py", "--lr", "0.001"]
	Dir     string            `json:"dir,omitempty"` // working directory on the worker
	Env     map[string]string `json:"env,omitempty"`
}

type Model struct {
	Hidden []int `json:"hidden,omitempty"` // hidden layer widths; default [256, 128]
}

type Dataset struct {
	URL string `json:"url,omitempty"` // gocloud.dev/blob URL of the files
	// Format names the loader, as registered on the GPU workers
	// (dataset.Register): "idx" (default: MNIST-style IDX files such as
	// Fashion-MNIST's), or one of your own. Backends that load their own
	// data (exec) ignore it.
	Format string `json:"format,omitempty"`
}

type Hyper struct {
	Epochs      int      `json:"epochs,omitempty"`       // default 10
	BatchSize   int      `json:"batch_size,omitempty"`   // per rank; default 128
	Optimizer   string   `json:"optimizer,omitempty"`    // "adam" (default) or "sgd"
	LR          float64  `json:"lr,omitempty"`           // default 1e-3 (adam), 0.01 (sgd)
	Momentum    *float64 `json:"momentum,omitempty"`     // sgd; default 0.9; 0 is plain SGD
	WeightDecay float64  `json:"weight_decay,omitempty"` // default 0
	Seed        uint64   `json:"seed,omitempty"`         // weights and data order
}

type Scaling struct {
	Workers int `json:"workers,omitempty"` // ranks; default 1
	// MinWorkers lets the run go on with fewer ranks (at least this many) when
	// not every slot can be had within the gang timeout, keeping the global
	// batch (batch_size × workers); it grows back at an epoch boundary once
	// slots are free. Default: workers (no elasticity).
	MinWorkers    int `json:"min_workers,omitempty"`
	GPUsPerWorker int `json:"gpus_per_worker,omitempty"` // slots per rank; default 1
	// WorkersPerHost packs this many ranks onto each host (torchrun's
	// nproc_per_node): a gang is workers / workers_per_host hosts, each
	// reserved whole on one worker process and driven by one activity per
	// epoch, so Temporal's traffic grows with hosts, not ranks. Default 1.
	WorkersPerHost int `json:"workers_per_host,omitempty"`
	// AllReduce is how a gang of hosts of several ranks sums gradients:
	// "hierarchical" (the default) sums within each host in memory, then
	// around a ring of hosts, then copies within the host; "ring" is one ring
	// of every rank, whose sums do not depend on how ranks are packed onto
	// hosts (a run moved between layouts stays bit-identical). Hosts of one
	// rank always use the ring.
	AllReduce string `json:"all_reduce,omitempty"`
	// BucketBytes is how much gradient the native trainer hands to the
	// all-reduce at once while its backward pass computes the rest (DDP's
	// bucket_cap_mb): communication overlaps computation. The gradient's
	// size or more: one all-reduce after the backward pass. Default 256 KiB.
	// Every rank of a run uses the same buckets, so its sums are
	// bit-identical across ranks and runs; a run resumed with another bucket
	// size goes on correctly but not bit for bit as it would have.
	BucketBytes int      `json:"bucket_bytes,omitempty"`
	TaskQueue   string   `json:"task_queue,omitempty"`   // the GPU agents' queue; default "durabletrain-gpu"
	GangTimeout Duration `json:"gang_timeout,omitempty"` // to reserve every slot at once; default 2m
}

// The ways a gang sums (scaling.all_reduce).
const (
	AllReduceHierarchical = "hierarchical"
	AllReduceRing         = "ring"
)

// Hierarchical says whether the gang's hosts sum locally first: hosts of
// more than one rank, unless the spec asks for one flat ring.
func (s Scaling) Hierarchical() bool {
	return s.WorkersPerHost > 1 && s.AllReduce != AllReduceRing
}

// Hosts is how many hosts a full gang takes.
func (s Scaling) Hosts() int { return s.Workers / max(1, s.WorkersPerHost) }

type Checkpoint struct {
	URL         string `json:"url,omitempty"`          // gocloud.dev/blob URL; default DefaultCheckpointURL
	EveryEpochs int    `json:"every_epochs,omitempty"` // default 1
	// EverySteps also checkpoints every this many steps within an epoch, so a
	// long epoch loses at most that much work; 0: only at epoch ends.
	EverySteps int    `json:"every_steps,omitempty"`
	KeepLast   *int   `json:"keep_last,omitempty"` // the newest N; default 2; 0 keeps every one
	KeepBest   int    `json:"keep_best,omitempty"` // default 0
	Score      string `json:"score,omitempty"`     // metric for keep_best; default "test_accuracy"
	Mode       string `json:"mode,omitempty"`      // "max" (default) or "min"
	// Sharded: every rank saves its own part of the state (a program that
	// holds a shard on each rank, as FSDP or ZeRO do), under one manifest,
	// and each rank restores its own part; a sharded checkpoint is restored
	// at the world size that saved it.
	Sharded bool `json:"sharded,omitempty"`
	// Async: a checkpoint within an epoch (every_steps) is written and
	// committed in the background from a copy of the state in memory, while
	// the gang trains on; at most one is in flight, and the next checkpoint
	// waits for it. Default true; false: training waits for every checkpoint.
	// Only backends whose state lives in the worker (trainer.Snapshotter:
	// the native trainer) can; the others always save in the foreground.
	Async *bool `json:"async,omitempty"`
}

// AsyncSteps says whether checkpoints within an epoch are saved in the background.
func (c Checkpoint) AsyncSteps() bool { return (c.Async == nil || *c.Async) && !c.Sharded }

type Failure struct {
	MaxFailures      *int     `json:"max_failures,omitempty"`      // infrastructure failures tolerated; default 3; 0: none
	MaxPreemptions   *int     `json:"max_preemptions,omitempty"`   // SIGTERMed workers tolerated; default 20; 0: none
	HeartbeatTimeout Duration `json:"heartbeat_timeout,omitempty"` // a rank silent this long is lost; default 10s
	// StallTimeout: a rank whose ring neighbour sends nothing, not even the
	// keepalives every neighbour sends five times within it, for this long
	// declares that neighbour stalled (a stopped or hung process, a cut
	// link), and the gang breaks at once instead of waiting for Temporal's
	// heartbeat timeout. Default 2s, or half of heartbeat_timeout where that
	// is shorter, but not under 1s; at most heartbeat_timeout.
	// Shorter finds a hang sooner; too short for the hosts (a VM paused for
	// longer, a host starved of CPU for longer) breaks healthy gangs. Left
	// out, the run chooses it: the default at first, raised after a stall
	// that proved false (Progress.StallTimeout, IncidentFalseStall).
	StallTimeout Duration `json:"stall_timeout,omitempty"`
	// RecoverFromPeers: when a gang breaks, its surviving ranks keep their
	// state at the last step every rank completed, and the next gang takes
	// it from a survivor over its collective instead of reading the latest
	// checkpoint from storage, when the survivor's is as new or newer.
	// Default true; false: every new gang restores from storage. Only
	// backends whose state lives in the worker (trainer.Snapshotter) can.
	RecoverFromPeers *bool `json:"recover_from_peers,omitempty"`
}

// DefaultStallTimeout is failure.stall_timeout's default, where half the
// heartbeat timeout is no shorter.
const DefaultStallTimeout = 2 * time.Second

// RingStallTimeout is failure.stall_timeout, or its default: the shorter of
// DefaultStallTimeout and half of heartbeat_timeout (which itself defaults to
// 10s), so that the rank that sees a stall reports it before Temporal times the
// stalled rank out, but not under a second.
func (f Failure) RingStallTimeout() time.Duration {
	if f.StallTimeout != 0 {
		return time.Duration(f.StallTimeout) // Validate refuses what is out of range
	}
	hb := time.Duration(f.HeartbeatTimeout)
	if hb <= 0 {
		hb = 10 * time.Second
	}
	return min(DefaultStallTimeout, max(time.Second, hb/2))
}

// PeersRecover says whether a new gang may take its state from a survivor of the last.
func (f Failure) PeersRecover() bool { return f.RecoverFromPeers == nil || *f.RecoverFromPeers }

// Backends and data set formats built in; workers may register more.
const (
	TrainerNative = "native"
	TrainerExec   = "exec"
)

const (
	DefaultTaskQueue     = "durabletrain-gpu"
	DefaultDatasetURL    = "file:///usr/share/datasets/fashion-mnist" // where Debian's dataset-fashion-mnist installs it
	DefaultDatasetFormat = "idx"
	DefaultCheckpointURL = "file:///var/lib/durabletrain/checkpoints?create_dir=1"
	MaxWorkers           = 8192
	// MaxWorkersPerHost bounds scaling.workers_per_host (hosts have 8 GPUs, a
	// few 16; CPU hosts may run more ranks).
	MaxWorkersPerHost = 64
	// DefaultBucketBytes, MinBucketBytes and MaxBucketBytes are
	// scaling.bucket_bytes's default and range: below 4 KiB a bucket costs
	// more in per-operation overhead than it hides.
	DefaultBucketBytes = 256 << 10
	MinBucketBytes     = 4 << 10
	MaxBucketBytes     = 1 << 30
	// MaxHosts bounds the hosts of a gang: each holds a HoldSlot and a
	// RunEpoch activity, and Temporal fails a workflow past 2,000 pending
	// activities (limit.numPendingActivities.error); and the workflow task
	// that takes a gang's grants must stay within the SDK's one-second
	// deadlock detector (measured up to 512 hosts).
	MaxHosts = 512
)

// Parse decodes a spec strictly: a field it does not know, a value of the
// wrong type, or an explicit 0 where 0 would silently become a default is an
// error naming the field (with its line and column), so a typo cannot fall
// back to a default. null, like leaving a field out, takes the default.
func Parse(data []byte) (Training, error) {
	var t Training
	if len(data) > MaxSpecBytes {
		return t, fmt.Errorf("spec: the spec is %d bytes; want at most %d (it travels with every epoch of every rank)", len(data), MaxSpecBytes)
	}
	if err := strictjson.Decode(data, &t); err != nil {
		return t, fmt.Errorf("spec: %w", err)
	}
	if err := refuseExplicitZeros(data); err != nil {
		return t, err
	}
	return t, nil
}

// Int, Float64 and Bool are for the fields where 0 (or false) means 0 and
// leaving it out means the default: Training{Failure: Failure{MaxFailures: spec.Int(0)}}.
func Int(v int) *int             { return &v }
func Float64(v float64) *float64 { return &v }
func Bool(v bool) *bool          { return &v }

// WithDefaults fills what was left out.
func (t Training) WithDefaults() Training {
	if t.Trainer == "" {
		t.Trainer = TrainerNative
	}
	if t.Trainer == TrainerNative {
		t.applyNativeConfig()
	}
	if t.Model.Hidden == nil {
		t.Model.Hidden = []int{256, 128}
	}
	if t.Dataset.URL == "" {
		t.Dataset.URL = DefaultDatasetURL
	}
	if t.Dataset.Format == "" {
		t.Dataset.Format = DefaultDatasetFormat
	}
	h := &t.Hyper
	if h.Epochs == 0 {
		h.Epochs = 10
	}
	if h.BatchSize == 0 {
		h.BatchSize = 128
	}
	if h.Optimizer == "" {
		h.Optimizer = "adam"
	}
	if h.LR == 0 {
		h.LR = map[string]float64{"adam": 1e-3, "sgd": 0.01}[h.Optimizer]
	}
	h.Momentum = Float64(h.MomentumOf())
	s := &t.Scaling
	if s.Workers == 0 {
		s.Workers = 1
	}
	if s.MinWorkers == 0 {
		s.MinWorkers = s.Workers
	}
	if s.GPUsPerWorker == 0 {
		s.GPUsPerWorker = 1
	}
	if s.WorkersPerHost == 0 {
		s.WorkersPerHost = 1
	}
	if s.AllReduce == "" {
		s.AllReduce = AllReduceHierarchical
	}
	if s.BucketBytes == 0 {
		s.BucketBytes = DefaultBucketBytes
	}
	if s.TaskQueue == "" {
		s.TaskQueue = DefaultTaskQueue
	}
	if s.GangTimeout == 0 {
		s.GangTimeout = Duration(2 * time.Minute)
	}
	c := &t.Checkpoint
	if c.URL == "" {
		c.URL = DefaultCheckpointURL
	}
	if c.EveryEpochs == 0 {
		c.EveryEpochs = 1
	}
	c.KeepLast = Int(c.KeepLastN())
	if c.Score == "" {
		c.Score = MetricTestAccuracy
	}
	if c.Mode == "" {
		c.Mode = ModeMax
	}
	f := &t.Failure
	f.MaxFailures, f.MaxPreemptions = Int(f.FailureBudget()), Int(f.PreemptionBudget())
	if f.HeartbeatTimeout == 0 {
		f.HeartbeatTimeout = Duration(10 * time.Second)
	}
	if f.StallTimeout == 0 {
		f.StallTimeout = Duration(f.RingStallTimeout())
	}
	return t
}

// KeepLastN is checkpoint.keep_last, its default if left out (0: every one).
func (c Checkpoint) KeepLastN() int { return deref(c.KeepLast, 2) }

// FailureBudget and PreemptionBudget are failure.max_failures and
// failure.max_preemptions, their defaults if left out.
func (f Failure) FailureBudget() int    { return deref(f.MaxFailures, 3) }
func (f Failure) PreemptionBudget() int { return deref(f.MaxPreemptions, 20) }

// MomentumOf is hyper.momentum, its default for the optimizer if left out.
func (h Hyper) MomentumOf() float64 {
	return deref(h.Momentum, map[string]float64{"sgd": 0.9}[h.Optimizer])
}

func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// pluginName is what a registered backend or data set format may be called.
var pluginName = registry.Name

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._=+@-]{0,199}$`)

// CheckName checks a run's name (or a search's): what checkpoints are
// stored under.
func CheckName(field, name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("%s is %s; want %s", field, quoted(name), accepted["name"])
	}
	return nil
}

// Validate names the first field out of range, its value, and what is
// accepted. Call it on a spec with defaults filled.
func (t Training) Validate() error {
	if err := t.Config.check(t.Trainer == TrainerNative); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	return t.fromConfig(t.validateFields())
}

func (t Training) validateFields() error {
	bad := func(field string, value any) error {
		return fmt.Errorf("spec: %s is %v; want %s", field, value, accepted[field])
	}
	q := func(s string) string { return quoted(s) }
	h, s, c, f := t.Hyper, t.Scaling, t.Checkpoint, t.Failure
	switch {
	case t.Name != "" && !namePattern.MatchString(t.Name):
		return bad("name", q(t.Name))
	case !pluginName.MatchString(t.Trainer):
		return bad("trainer", q(t.Trainer))
	case t.Trainer != TrainerExec && t.Exec != nil:
		return fmt.Errorf(`spec: exec is set; want no exec section unless trainer is "exec" (trainer is %s)`, q(t.Trainer))
	case t.Trainer == TrainerExec && t.Exec == nil:
		return bad("exec.command", "missing")
	case len(t.Model.Hidden) > 16:
		return bad("model.hidden", fmt.Sprintf("%d layers", len(t.Model.Hidden)))
	case !pluginName.MatchString(t.Dataset.Format):
		return bad("dataset.format", q(t.Dataset.Format))
	case h.Epochs < 1 || h.Epochs > MaxEpochs:
		return bad("hyper.epochs", h.Epochs)
	case h.BatchSize < 1 || h.BatchSize > 65536:
		return bad("hyper.batch_size", h.BatchSize)
	case h.Optimizer != "adam" && h.Optimizer != "sgd":
		return bad("hyper.optimizer", q(h.Optimizer))
	case !(h.LR > 0 && h.LR < 10):
		return bad("hyper.lr", h.LR)
	case h.Momentum != nil && !(*h.Momentum >= 0 && *h.Momentum < 1):
		return bad("hyper.momentum", *h.Momentum)
	case !(h.WeightDecay >= 0 && h.WeightDecay < 1):
		return bad("hyper.weight_decay", h.WeightDecay)
	case s.Workers < 1 || s.Workers > MaxWorkers:
		return bad("scaling.workers", s.Workers)
	case s.MinWorkers < 1 || s.MinWorkers > s.Workers:
		return fmt.Errorf("spec: scaling.min_workers is %d; want 1 to scaling.workers (%d)", s.MinWorkers, s.Workers)
	case s.GPUsPerWorker != 1:
		return bad("scaling.gpus_per_worker", s.GPUsPerWorker)
	case s.WorkersPerHost < 1 || s.WorkersPerHost > MaxWorkersPerHost:
		return bad("scaling.workers_per_host", s.WorkersPerHost)
	case s.AllReduce != AllReduceHierarchical && s.AllReduce != AllReduceRing:
		return bad("scaling.all_reduce", q(s.AllReduce))
	case s.BucketBytes < MinBucketBytes || s.BucketBytes > MaxBucketBytes:
		return bad("scaling.bucket_bytes", s.BucketBytes)
	case s.Workers%s.WorkersPerHost != 0:
		return fmt.Errorf("spec: scaling.workers is %d; want a multiple of scaling.workers_per_host (%d): every host runs the same number of ranks", s.Workers, s.WorkersPerHost)
	case s.MinWorkers%s.WorkersPerHost != 0:
		return fmt.Errorf("spec: scaling.min_workers is %d; want a multiple of scaling.workers_per_host (%d): a gang shrinks by whole hosts", s.MinWorkers, s.WorkersPerHost)
	case s.Hosts() > MaxHosts:
		return fmt.Errorf("spec: scaling.workers / scaling.workers_per_host is %d hosts; want at most %d (2 pending activities each, under Temporal's 2,000, and one workflow task to take their grants): pack more ranks per host", s.Hosts(), MaxHosts)
	case !taskQueuePattern.MatchString(s.TaskQueue) || strings.HasPrefix(s.TaskQueue, "/_sys/"):
		return bad("scaling.task_queue", q(s.TaskQueue))
	case s.GangTimeout < Duration(time.Second) || s.GangTimeout > Duration(7*24*time.Hour):
		return bad("scaling.gang_timeout", s.GangTimeout)
	case c.EveryEpochs < 1:
		return bad("checkpoint.every_epochs", c.EveryEpochs)
	case c.EverySteps < 0:
		return bad("checkpoint.every_steps", c.EverySteps)
	case c.KeepLast != nil && *c.KeepLast < 0:
		return bad("checkpoint.keep_last", *c.KeepLast)
	case c.KeepBest < 0:
		return bad("checkpoint.keep_best", c.KeepBest)
	case c.Sharded && t.Trainer == TrainerNative:
		return fmt.Errorf("spec: checkpoint.sharded is for programs whose ranks each hold a part of the state (trainer exec); the native trainer's ranks hold identical replicas: leave it false")
	case c.Sharded && c.EveryEpochs != 1:
		return fmt.Errorf("spec: checkpoint.sharded needs checkpoint.every_epochs 1 (it is %d): a stop between checkpoints saves rank 0's state only", c.EveryEpochs)
	case c.Sharded && s.MinWorkers != s.Workers:
		return fmt.Errorf("spec: checkpoint.sharded needs scaling.min_workers equal to scaling.workers (%d, not %d): a sharded checkpoint is restored at the world size that saved it", s.Workers, s.MinWorkers)
	case CheckMetric("checkpoint.score", c.Score) != nil:
		return CheckMetric("spec: checkpoint.score", c.Score)
	case CheckMode("checkpoint.mode", c.Mode) != nil:
		return CheckMode("spec: checkpoint.mode", c.Mode)
	case f.MaxFailures != nil && (*f.MaxFailures < 0 || *f.MaxFailures > MaxFailureBudget):
		return bad("failure.max_failures", *f.MaxFailures)
	case f.MaxPreemptions != nil && (*f.MaxPreemptions < 0 || *f.MaxPreemptions > MaxFailureBudget):
		return bad("failure.max_preemptions", *f.MaxPreemptions)
	case f.HeartbeatTimeout < Duration(time.Second) || f.HeartbeatTimeout > Duration(10*time.Minute):
		return bad("failure.heartbeat_timeout", f.HeartbeatTimeout)
	case f.StallTimeout != 0 && (f.StallTimeout < Duration(MinStallTimeout) || f.StallTimeout > f.HeartbeatTimeout):
		return fmt.Errorf("spec: failure.stall_timeout is %v; want %s (%v)", f.StallTimeout, accepted["failure.stall_timeout"], f.HeartbeatTimeout)
	case t.ResumeFrom != "" && !namePattern.MatchString(t.ResumeFrom):
		return bad("resume_from", q(t.ResumeFrom))
	}
	for i, w := range t.Model.Hidden {
		if w < 1 || w > 65536 {
			return fmt.Errorf("spec: model.hidden[%d] is %d; want a width from 1 to 65536", i, w)
		}
	}
	if n := parameters(t.Model.Hidden); n > MaxParameters {
		return fmt.Errorf("spec: model.hidden %v has %.3g parameters (for 784 inputs and 10 classes); want at most %d (each rank holds weights, gradients and optimizer state)", t.Model.Hidden, n, MaxParameters)
	}
	if err := CheckURL("dataset.url", t.Dataset.URL); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if err := CheckURL("checkpoint.url", c.URL); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if t.Exec != nil {
		if err := t.Exec.check(); err != nil {
			return fmt.Errorf("spec: %w", err)
		}
	}
	return nil
}

// Duration is a time.Duration written in JSON as "10s", "2m30s" (or a number of seconds).
type Duration time.Duration

func (d Duration) String() string { return time.Duration(d).String() }

func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf(`want a duration such as "10s" or "2m30s", not %s`, quoted(s))
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf(`want a duration such as "10s" or a number of seconds, not %s`, quoted(string(b)))
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}
