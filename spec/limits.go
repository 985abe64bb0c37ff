package spec

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/strictjson"
)

// Limits of a spec. Some are Temporal's: a run's spec travels in the input
// of every RunEpoch of every rank, so it is kept far below the server's 2 MiB
// payload limit; names become task queues and workflow IDs, which the server
// caps at 1,000 characters. The others keep one run from exhausting a worker.
const (
	MaxSpecBytes     = 16 << 10 // the whole JSON spec
	MaxEpochs        = 100000
	MaxFailureBudget = 10000    // failure.max_failures, failure.max_preemptions
	MaxParameters    = 64 << 20 // the native model's weights: 256 MiB of float32 per copy
	MaxExecArgs      = 256
	MaxExecEnv       = 128
	maxExecString    = 4096 // one argument, one environment value, exec.dir
)

// MinStallTimeout bounds failure.stall_timeout from below: every link
// carries a keepalive each fifth of it, and a healthy process can be off
// its core for tens of milliseconds.
const MinStallTimeout = 250 * time.Millisecond

// accepted is what Validate says each field accepts.
var accepted = map[string]string{
	"name":                      "1-200 letters, digits or ._=+@-, starting with a letter or digit",
	"trainer":                   `"native", "exec", or the name of a backend registered on the workers (lower-case letters, digits, - and _)`,
	"exec.command":              `the program each rank runs, e.g. ["python3", "train.py"]`,
	"model.hidden":              "at most 16 hidden layers",
	"dataset.format":            `"idx", or the name of a loader registered on the workers (lower-case letters, digits, - and _)`,
	"hyper.epochs":              fmt.Sprintf("1 to %d", MaxEpochs),
	"hyper.batch_size":          "1 to 65536 examples per rank",
	"hyper.optimizer":           `"adam" or "sgd"`,
	"hyper.lr":                  "a number in (0, 10)",
	"hyper.momentum":            "a number in [0, 1) (0: plain SGD)",
	"hyper.weight_decay":        "a number in [0, 1)",
	"scaling.workers":           fmt.Sprintf("1 to %d ranks", MaxWorkers),
	"scaling.min_workers":       "1 to scaling.workers",
	"scaling.gpus_per_worker":   "1 (one rank per GPU slot)",
	"scaling.workers_per_host":  fmt.Sprintf("1 to %d ranks per host, dividing scaling.workers and scaling.min_workers", MaxWorkersPerHost),
	"scaling.all_reduce":        `"hierarchical" (within each host, then a ring of hosts; the default) or "ring" (one ring of every rank)`,
	"scaling.bucket_bytes":      fmt.Sprintf("%d (4 KiB) to %d (1 GiB) bytes of gradient per all-reduce bucket", MinBucketBytes, MaxBucketBytes),
	"scaling.task_queue":        "1-200 letters, digits or ._=+@:- (the GPU agents' -task-queue), starting with a letter or digit",
	"scaling.gang_timeout":      "1s to 168h",
	"checkpoint.every_epochs":   "1 or more",
	"checkpoint.every_steps":    "0 (only at epoch ends) or more",
	"checkpoint.keep_last":      "0 (keep every checkpoint) or more",
	"checkpoint.keep_best":      "0 or more",
	"failure.max_failures":      fmt.Sprintf("0 (fail at the first infrastructure failure) to %d", MaxFailureBudget),
	"failure.max_preemptions":   fmt.Sprintf("0 (fail at the first preemption) to %d", MaxFailureBudget),
	"failure.heartbeat_timeout": "1s to 10m",
	"failure.stall_timeout":     MinStallTimeout.String() + " to failure.heartbeat_timeout",
	"resume_from":               "the name of an earlier run",
}

var taskQueuePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._=+@:-]{0,199}$`)

// quoted shows a user's string in an error, bounded.
func quoted(s string) string { return strictjson.Quote(s) }

// parameters counts the native model's weights and biases for Fashion-MNIST's
// 784 inputs and 10 classes.
func parameters(hidden []int) float64 {
	n, in := 0.0, 784.0
	for _, w := range hidden {
		n += in*float64(w) + float64(w)
		in = float64(w)
	}
	return n + in*10 + 10
}

// explicitZeros mirrors the fields whose zero value means "take the
// default": a 0 written there is refused rather than silently replaced.
type explicitZeros struct {
	Hyper struct {
		Epochs    *int     `json:"epochs"`
		BatchSize *int     `json:"batch_size"`
		LR        *float64 `json:"lr"`
	} `json:"hyper"`
	Scaling struct {
		Workers        *int      `json:"workers"`
		MinWorkers     *int      `json:"min_workers"`
		GPUsPerWorker  *int      `json:"gpus_per_worker"`
		WorkersPerHost *int      `json:"workers_per_host"`
		GangTimeout    *Duration `json:"gang_timeout"`
		BucketBytes    *int      `json:"bucket_bytes"`
	} `json:"scaling"`
	Checkpoint struct {
		EveryEpochs *int `json:"every_epochs"`
	} `json:"checkpoint"`
	Failure struct {
		HeartbeatTimeout *Duration `json:"heartbeat_timeout"`
		StallTimeout     *Duration `json:"stall_timeout"`
	} `json:"failure"`
}

// refuseExplicitZeros names the first field written as 0 whose 0 would
// otherwise be read as "left out". data has passed the strict decoder.
func refuseExplicitZeros(data []byte) error {
	var z explicitZeros
	if err := json.Unmarshal(data, &z); err != nil {
		return nil // the strict decoder has judged the types
	}
	for _, f := range []struct {
		field string
		zero  bool
	}{
		{"hyper.epochs", z.Hyper.Epochs != nil && *z.Hyper.Epochs == 0},
		{"hyper.batch_size", z.Hyper.BatchSize != nil && *z.Hyper.BatchSize == 0},
		{"hyper.lr", z.Hyper.LR != nil && *z.Hyper.LR == 0},
		{"scaling.workers", z.Scaling.Workers != nil && *z.Scaling.Workers == 0},
		{"scaling.min_workers", z.Scaling.MinWorkers != nil && *z.Scaling.MinWorkers == 0},
		{"scaling.gpus_per_worker", z.Scaling.GPUsPerWorker != nil && *z.Scaling.GPUsPerWorker == 0},
		{"scaling.workers_per_host", z.Scaling.WorkersPerHost != nil && *z.Scaling.WorkersPerHost == 0},
		{"scaling.gang_timeout", z.Scaling.GangTimeout != nil && *z.Scaling.GangTimeout == 0},
		{"scaling.bucket_bytes", z.Scaling.BucketBytes != nil && *z.Scaling.BucketBytes == 0},
		{"checkpoint.every_epochs", z.Checkpoint.EveryEpochs != nil && *z.Checkpoint.EveryEpochs == 0},
		{"failure.heartbeat_timeout", z.Failure.HeartbeatTimeout != nil && *z.Failure.HeartbeatTimeout == 0},
		{"failure.stall_timeout", z.Failure.StallTimeout != nil && *z.Failure.StallTimeout == 0},
	} {
		if f.zero {
			return fmt.Errorf("spec: %s is 0; want %s (leave it out, or null, for the default)", f.field, accepted[f.field])
		}
	}
	return nil
}

// BlobSchemes are the URL schemes a spec may name (package blobdrivers
// registers a driver for each).
func BlobSchemes() []string { return bloburl.Schemes() }

// CheckURL checks a blob URL by the rule package bloburl owns (the checkpoint
// store checks the same): a known scheme; for file://, an absolute, clean
// path and no host; for s3, gs and azblob, a bucket name and no path (a
// folder goes in ?prefix=); query parameters that parse. field names it in
// the error.
func CheckURL(field, raw string) error { return bloburl.Check(field, raw) }

// FileURL is the file:// URL of an absolute local path, escaped where a URL
// needs it (a space as %20, '#' as %23, '?' as %3F, ',' as %2C), for a spec's
// dataset.url or checkpoint.url: "file://" + path is refused for a space and
// names another folder when path has a '#' or '?'.
func FileURL(path string) string { return bloburl.FromPath(path) }

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// execReserved are the variables durabletrain sets for each rank.
var execReserved = []string{"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "NODE_RANK",
	"ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
	"MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"}

// check refuses an exec section no worker could start: an empty program,
// NUL bytes, a relative directory, variables durabletrain sets itself, and
// sizes beyond what one rank's command line and environment need.
func (x *Exec) check() error {
	switch {
	case len(x.Command) == 0:
		return fmt.Errorf("exec.command is empty; want %s", accepted["exec.command"])
	case len(x.Command) > MaxExecArgs:
		return fmt.Errorf("exec.command has %d arguments; want at most %d", len(x.Command), MaxExecArgs)
	case strings.TrimSpace(x.Command[0]) == "":
		return fmt.Errorf("exec.command[0] is %s; want the program to run (a name on the worker's PATH, or a path)", quoted(x.Command[0]))
	case len(x.Env) > MaxExecEnv:
		return fmt.Errorf("exec.env has %d variables; want at most %d", len(x.Env), MaxExecEnv)
	case x.Dir != "" && !strings.HasPrefix(x.Dir, "/"):
		return fmt.Errorf("exec.dir is %s; want an absolute directory on the worker", quoted(x.Dir))
	case len(x.Dir) > maxExecString || strings.ContainsRune(x.Dir, 0):
		return fmt.Errorf("exec.dir is %s; want a directory of at most %d bytes, without NUL", quoted(x.Dir), maxExecString)
	}
	for i, a := range x.Command {
		if len(a) > maxExecString || strings.ContainsRune(a, 0) {
			return fmt.Errorf("exec.command[%d] is %s; want at most %d bytes, without NUL", i, quoted(a), maxExecString)
		}
	}
	for k, v := range x.Env {
		switch {
		case !envNamePattern.MatchString(k):
			return fmt.Errorf("exec.env has the variable %s; want names of letters, digits and _, not starting with a digit", quoted(k))
		case strings.HasPrefix(k, "DURABLETRAIN_") || slices.Contains(execReserved, k):
			return fmt.Errorf("exec.env.%s: durabletrain sets it for each rank; want a variable of your own", k)
		case len(v) > maxExecString || strings.ContainsRune(v, 0):
			return fmt.Errorf("exec.env.%s is %s; want at most %d bytes, without NUL", k, quoted(v), maxExecString)
		}
	}
	return nil
}

// MaxIDLength is the Temporal server's default limit on workflow IDs and
// task queue names (limit.maxIDLength).
const MaxIDLength = 1000

// CheckWorkflowID checks a workflow ID a client is about to start, leaving
// room for suffix more bytes (a search's trials are "<id>-trial-000").
func CheckWorkflowID(field, id string, suffix int) error {
	switch {
	case id == "" || len(id)+suffix > MaxIDLength:
		return fmt.Errorf("%s is %d bytes; want 1 to %d (the server's limit on workflow IDs, less %d for what is added to it)", field, len(id), MaxIDLength-suffix, suffix)
	case !utf8.ValidString(id) || strings.ContainsFunc(id, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return fmt.Errorf("%s is %s; want printable UTF-8 text", field, quoted(id))
	}
	return nil
}
