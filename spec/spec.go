// Package spec owns the types that travel through Temporal between the
// workflows and the activities of a training run: the user's Training spec
// (JSON, with Ray Train's vocabulary), its defaults and validation, and the
// inputs and results of the activities. It imports no Temporal package and
// does no I/O, so workflows and activities can both depend on it.
package spec

import (
	"encoding/json"
	"fmt"
	"time"

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
	// MLflow, if set, logs the run to an MLflow tracking server (see MLflow).
	MLflow *MLflow `json:"mlflow,omitempty"`
}

// Exec is the program each rank of an "exec" run starts (once per gang),
// with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and
// CUDA_VISIBLE_DEVICES set; it imports the durabletrain Python module.
type Exec struct {
	Command []string          `json:"command"`       // e.g. ["python3", "train.py", "--lr", "0.001"]
	Dir     string            `json:"dir,omitempty"` // working directory on the worker
	Env     map[string]string `json:"env,omitempty"` // added to every rank's environment
	// WarmSpare: each rank of the Python front door (a TorchTrainer's
	// `python -m durabletrain._rank`) keeps a spare process on its worker,
	// its interpreter up and PyTorch imported, which the rank's next start
	// there takes: a new gang after a failure trains again about 2 s sooner
	// (on a 2-core VM), at the cost of an idle process per rank (about
	// 300 MB). Other commands ignore it. Python: FailureConfig(warm_spares=True).
	WarmSpare bool `json:"warm_spare,omitempty"`
}

// Model shapes the native trainer's MLP (exec programs build their own).
type Model struct {
	Hidden []int `json:"hidden,omitempty"` // hidden layer widths; default [256, 128]
}

// Dataset says where the training data is and how to read it.
type Dataset struct {
	URL string `json:"url,omitempty"` // gocloud.dev/blob URL of the files
	// Format names the loader, as registered on the GPU workers
	// (dataset.Register): "idx" (default: MNIST-style IDX files such as
	// Fashion-MNIST's), or one of your own. Backends that load their own
	// data (exec) ignore it.
	Format string `json:"format,omitempty"`
}

// Hyper holds the optimisation hyperparameters the backends share.
type Hyper struct {
	Epochs      int      `json:"epochs,omitempty"`       // default 10
	BatchSize   int      `json:"batch_size,omitempty"`   // per rank; default 128
	Optimizer   string   `json:"optimizer,omitempty"`    // "adam" (default) or "sgd"
	LR          float64  `json:"lr,omitempty"`           // default 1e-3 (adam), 0.01 (sgd)
	Momentum    *float64 `json:"momentum,omitempty"`     // sgd; default 0.9; 0 is plain SGD
	WeightDecay float64  `json:"weight_decay,omitempty"` // default 0
	Seed        uint64   `json:"seed,omitempty"`         // weights and data order
}

// Scaling is how many ranks train and where (Ray's ScalingConfig).
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

// Checkpoint is where and how often a run saves its state (Ray's CheckpointConfig).
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
	// MergeShards (with sharded): on restore each rank is handed every
	// rank's part, merged into one directory, not its own part alone: Ray
	// Train's distributed checkpoints, whose directory holds every worker's
	// files (a torch.distributed.checkpoint directory, as FSDP's sharded
	// state dict writes it: each rank's shard files and rank 0's metadata,
	// which every rank reads). A file two ranks saved must then have the
	// same contents on both.
	MergeShards bool `json:"merge_shards,omitempty"`
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

// Failure is how much a run survives and how fast it notices (Ray's FailureConfig).
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
