package spec

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/internal/registry"
)

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
	case c.MergeShards && !c.Sharded:
		return fmt.Errorf("spec: checkpoint.merge_shards needs checkpoint.sharded true: it says how a sharded checkpoint is restored (every rank's part merged into one directory)")
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
	if err := t.MLflow.check(); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if t.Exec != nil {
		if err := t.Exec.check(); err != nil {
			return fmt.Errorf("spec: %w", err)
		}
	}
	return nil
}
