// Package speccorpus owns the corpus of malformed training specs and
// searches that every entry point must refuse at once, naming the field:
// spec.Parse and Validate, tune.ParseSpec, the starter, and the workflows
// started straight from the Temporal CLI (package integration).
package speccorpus

import (
	"fmt"
	"strings"
)

// Case is one malformed input and a part of the error it must get.
type Case struct {
	Name  string
	Input string
	Want  string // a part of the one-line error
}

func repeat(s string, n int) string { return strings.Repeat(s, n) }

// Training is the corpus of malformed training specs.
func Training() []Case {
	hugeName := repeat("n", 5<<20)
	args := `"python3"` + repeat(`, "a"`, 300)
	env := ""
	for i := range 200 {
		env += fmt.Sprintf(`%s"V%d": "x"`, map[bool]string{true: "", false: ", "}[i == 0], i)
	}
	deep := repeat("[", 5000) + repeat("]", 5000)
	return []Case{
		// The document
		{"null", `null`, "the input is null; want a JSON object"},
		{"a list", `[1, 2]`, "want an object {...}, got a list (line 1, column 1)"},
		{"a string", `"train"`, `want an object {...}, got the string "train"`},
		{"two documents", `{} {}`, "after top-level value (line 1, column 4)"},
		{"truncated", "{\"hyper\": {\"epochs\": 3}", "the JSON ends before it is complete"},
		{"a trailing comma", "{\"hyper\": {\"epochs\": 3,}}", "invalid character '}' looking for beginning of object key string (line 1, column 24)"},
		{"not UTF-8", "{\"name\": \"\xff\xfe\"}", "not valid UTF-8 text (line 1, column 11)"},
		{"5 MB", `{"name": "` + hugeName + `"}`, "bytes; want at most 16384"},
		// Fields
		{"an unknown field", `{"hyper": {"epochz": 3}}`, `hyper: unknown field "epochz"; want one of batch_size, epochs, lr, momentum, optimizer, seed, weight_decay (line 1, column 12)`},
		{"an unknown section", `{"scheduling": {}}`, `unknown field "scheduling"`},
		{"a field in capitals", `{"Hyper": {"epochs": 3}}`, `did you mean "hyper"?`},
		{"a field given twice", `{"hyper": {"epochs": 3, "epochs": 4}}`, "hyper.epochs: given twice"},
		{"a huge unknown field", `{"` + repeat("k", 10000) + `": 1}`, "unknown field"},
		// Types
		{"a string for a number", `{"hyper": {"epochs": "10"}}`, `hyper.epochs: want a whole number, got the string "10" (line 1, column 22)`},
		{"a fraction for a count", `{"hyper": {"epochs": 2.5}}`, "hyper.epochs: want a whole number, got the number 2.5"},
		{"a negative seed", `{"hyper": {"seed": -1}}`, "hyper.seed: want a whole number, 0 or more, got the number -1"},
		{"a number too large", `{"hyper": {"lr": 1e999}}`, "hyper.lr: want a number, got the number 1e999"},
		{"a bad duration", `{"scaling": {"gang_timeout": "2 minutes"}}`, `scaling.gang_timeout: want a duration such as "10s" or "2m30s", not "2 minutes"`},
		{"a list for a duration", `{"failure": {"heartbeat_timeout": [10]}}`, `failure.heartbeat_timeout: want a duration such as "10s" or a number of seconds`},
		{"a bool for a string", `{"trainer": true}`, "trainer: want a string, got true"},
		{"a list in a list", `{"model": {"hidden": [[64]]}}`, "model.hidden[0]: want a whole number, got a list"},
		{"an object for a list", `{"model": {"hidden": {"a": 1}}}`, "model.hidden: want a list [...], got an object"},
		{"deep nesting", `{"model": {"hidden": ` + deep + `}}`, "model.hidden[0]: want a whole number, got a list"},
		{"a string for a section", `{"scaling": "big"}`, `scaling: want an object {...}, got the string "big"`},
		// Explicit zeros that would become defaults
		{"epochs 0", `{"hyper": {"epochs": 0}}`, "hyper.epochs is 0; want 1 to 100000 (leave it out, or null, for the default)"},
		{"workers 0", `{"scaling": {"workers": 0}}`, "scaling.workers is 0"},
		{"batch 0", `{"hyper": {"batch_size": 0}}`, "hyper.batch_size is 0"},
		{"lr 0", `{"hyper": {"lr": 0}}`, "hyper.lr is 0"},
		{"gang timeout 0s", `{"scaling": {"gang_timeout": "0s"}}`, "scaling.gang_timeout is 0"},
		{"heartbeat 0", `{"failure": {"heartbeat_timeout": 0}}`, "failure.heartbeat_timeout is 0"},
		{"stall 0", `{"failure": {"stall_timeout": "0s"}}`, "failure.stall_timeout is 0; want 250ms to failure.heartbeat_timeout"},
		{"every_epochs 0", `{"checkpoint": {"every_epochs": 0}}`, "checkpoint.every_epochs is 0"},
		// Ranges
		{"epochs 1e6", `{"hyper": {"epochs": 1000000}}`, "hyper.epochs is 1000000; want 1 to 100000"},
		{"9000 workers", `{"scaling": {"workers": 9000}}`, "scaling.workers is 9000; want 1 to 8192 ranks"},
		{"5000 hosts", `{"scaling": {"workers": 5000}}`, "is 5000 hosts; want at most 512"},
		{"workers not a multiple of workers_per_host", `{"scaling": {"workers": 12, "workers_per_host": 8}}`, "scaling.workers is 12; want a multiple of scaling.workers_per_host (8)"},
		{"min_workers not whole hosts", `{"scaling": {"workers": 16, "min_workers": 4, "workers_per_host": 8}}`, "scaling.min_workers is 4; want a multiple of scaling.workers_per_host (8)"},
		{"workers_per_host 0", `{"scaling": {"workers_per_host": 0}}`, "scaling.workers_per_host is 0"},
		{"workers_per_host 65", `{"scaling": {"workers": 65, "workers_per_host": 65}}`, "scaling.workers_per_host is 65; want 1 to 64"},
		{"bucket_bytes 0", `{"scaling": {"workers": 2, "bucket_bytes": 0}}`, "scaling.bucket_bytes is 0; want 4096 (4 KiB) to"},
		{"bucket_bytes too small", `{"scaling": {"workers": 2, "bucket_bytes": 100}}`, "scaling.bucket_bytes is 100; want 4096 (4 KiB) to 1073741824 (1 GiB)"},
		{"bucket_bytes negative", `{"scaling": {"bucket_bytes": -1}}`, "scaling.bucket_bytes is -1; want 4096"},
		{"all_reduce unknown", `{"scaling": {"workers": 8, "workers_per_host": 4, "all_reduce": "tree"}}`, `scaling.all_reduce is "tree"; want "hierarchical"`},
		{"min above workers", `{"scaling": {"workers": 2, "min_workers": 3}}`, "scaling.min_workers is 3; want 1 to scaling.workers (2)"},
		{"lr 100", `{"hyper": {"lr": 100}}`, "hyper.lr is 100; want a number in (0, 10)"},
		{"momentum 1", `{"hyper": {"optimizer": "sgd", "momentum": 1}}`, "hyper.momentum is 1; want a number in [0, 1)"},
		{"negative failures", `{"failure": {"max_failures": -1}}`, "failure.max_failures is -1; want 0 (fail at the first infrastructure failure) to 10000"},
		{"a million failures", `{"failure": {"max_failures": 1000000}}`, "failure.max_failures is 1000000"},
		{"heartbeat 1h", `{"failure": {"heartbeat_timeout": "1h"}}`, "failure.heartbeat_timeout is 1h0m0s; want 1s to 10m"},
		{"stall 10ms", `{"failure": {"stall_timeout": "10ms"}}`, "failure.stall_timeout is 10ms; want 250ms to failure.heartbeat_timeout (10s)"},
		{"stall negative", `{"failure": {"stall_timeout": "-1s"}}`, "failure.stall_timeout is -1s; want 250ms"},
		{"stall past the heartbeat timeout", `{"failure": {"heartbeat_timeout": "4s", "stall_timeout": 5}}`, "failure.stall_timeout is 5s; want 250ms to failure.heartbeat_timeout (4s)"},
		{"gang timeout 1ms", `{"scaling": {"gang_timeout": "1ms"}}`, "scaling.gang_timeout is 1ms; want 1s to 168h"},
		{"keep_last -1", `{"checkpoint": {"keep_last": -1}}`, "checkpoint.keep_last is -1; want 0 (keep every checkpoint) or more"},
		{"two GPUs per worker", `{"scaling": {"gpus_per_worker": 2}}`, "scaling.gpus_per_worker is 2"},
		{"an unknown optimizer", `{"hyper": {"optimizer": "lbfgs"}}`, `hyper.optimizer is "lbfgs"; want "adam" or "sgd"`},
		{"a score that is no metric's name", `{"checkpoint": {"score": "f 1"}}`, `checkpoint.score is "f 1"; want a metric's name`},
		{"an unknown mode", `{"checkpoint": {"mode": "up"}}`, `checkpoint.mode is "up"`},
		// Names and sizes the server or a worker would refuse later
		{"a 300-character name", `{"name": "` + repeat("a", 300) + `"}`, `name is "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"… (300 bytes); want 1-200 letters`},
		{"a name with a slash", `{"name": "a/b"}`, `name is "a/b"`},
		{"a 2000-character task queue", `{"scaling": {"task_queue": "` + repeat("q", 2000) + `"}}`, "scaling.task_queue is"},
		{"a task queue with a space", `{"scaling": {"task_queue": "gpu queue"}}`, `scaling.task_queue is "gpu queue"`},
		{"a system task queue", `{"scaling": {"task_queue": "/_sys/x"}}`, `scaling.task_queue is "/_sys/x"`},
		{"a bad trainer name", `{"trainer": "JAX!"}`, `trainer is "JAX!"`},
		{"a bad format name", `{"dataset": {"format": "../csv"}}`, `dataset.format is "../csv"`},
		{"a bad resume_from", `{"resume_from": "../other"}`, `resume_from is "../other"`},
		{"a model too large", `{"model": {"hidden": [65536, 65536]}}`, "model.hidden [65536 65536] has 4.35e+09 parameters"},
		{"17 layers", `{"model": {"hidden": [1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}}`, "model.hidden is 17 layers; want at most 16 hidden layers"},
		{"a zero width", `{"model": {"hidden": [64, 0]}}`, "model.hidden[1] is 0; want a width from 1 to 65536"},
		// URLs
		{"a path for a URL", `{"dataset": {"url": "/tmp/x"}}`, `dataset.url is "/tmp/x"; want a blob URL`},
		{"a relative file URL", `{"dataset": {"url": "file://data/fashion"}}`, `dataset.url is "file://data/fashion"; want file:///absolute/path (three slashes; "data" reads as a host)`},
		{"an opaque file URL", `{"checkpoint": {"url": "file:ckpt"}}`, `checkpoint.url is "file:ckpt"; want a blob URL`},
		{"a path with ..", `{"checkpoint": {"url": "file:///var/lib/../../etc"}}`, "checkpoint.url is \"file:///var/lib/../../etc\"; want a clean absolute path (/etc"},
		{"s3 without a bucket", `{"checkpoint": {"url": "s3://?region=us-east-1"}}`, "want s3://bucket-name (the bucket is missing)"},
		{"s3 with a path", `{"checkpoint": {"url": "s3://bucket/runs"}}`, "want s3://bucket?prefix=runs/ (a folder goes in ?prefix=, not in the path)"},
		{"s3 with a bad bucket", `{"checkpoint": {"url": "s3://My_Bucket"}}`, "want s3://bucket-name: 3-223 lower-case letters"},
		{"a password in a URL", `{"checkpoint": {"url": "s3://key:secret@bucket"}}`, "want no user or password in the URL"},
		{"an http URL", `{"dataset": {"url": "http://example.com/data"}}`, "want a URL with scheme file://, s3://, gs://, azblob://, mem://"},
		{"a URL with a space", `{"dataset": {"url": "file:///my data"}}`, "want a URL without spaces"},
		{"a bad query", `{"checkpoint": {"url": "file:///x?a=%zz"}}`, "want query parameters that parse"},
		// exec
		{"exec without a command", `{"trainer": "exec"}`, "exec.command is missing"},
		{"an empty command", `{"trainer": "exec", "exec": {"command": []}}`, "exec.command is empty"},
		{"an empty program", `{"trainer": "exec", "exec": {"command": [""]}}`, `exec.command[0] is ""; want the program to run`},
		{"300 arguments", `{"trainer": "exec", "exec": {"command": [` + args + `]}}`, "exec.command has 301 arguments; want at most 256"},
		{"a NUL in an argument", `{"trainer": "exec", "exec": {"command": ["python3", "a\u0000b"]}}`, "exec.command[1] is"},
		{"RANK in exec.env", `{"trainer": "exec", "exec": {"command": ["x"], "env": {"RANK": "3"}}}`, "exec.env.RANK: durabletrain sets it for each rank"},
		{"a bad variable name", `{"trainer": "exec", "exec": {"command": ["x"], "env": {"1A": "x"}}}`, `exec.env has the variable "1A"`},
		{"200 variables", `{"trainer": "exec", "exec": {"command": ["x"], "env": {` + env + `}}}`, "exec.env has 200 variables; want at most 128"},
		{"a number in exec.env", `{"trainer": "exec", "exec": {"command": ["x"], "env": {"LR": 0.1}}}`, "exec.env.LR: want a string, got the number 0.1"},
		{"a relative exec.dir", `{"trainer": "exec", "exec": {"command": ["x"], "dir": "work"}}`, `exec.dir is "work"; want an absolute directory`},
		{"exec with the native trainer", `{"exec": {"command": ["python3"]}}`, `exec is set; want no exec section unless trainer is "exec"`},
		// Internal state
		{"the continued state", `{"continued": {"epoch": 9, "epochs": 10}}`, "continued"},
	}
}

// Tune is the corpus of malformed searches.
func Tune() []Case {
	grid := func(n int) string {
		v := make([]string, n)
		for i := range v {
			v[i] = fmt.Sprint(i + 1)
		}
		return `{"grid_search": [` + strings.Join(v, ",") + `]}`
	}
	return []Case{
		{"null", `null`, "tune spec: the input is null"},
		{"no param_space", `{"train": {}}`, "tune spec: param_space is empty"},
		{"a million-cell grid", `{"param_space": {"hyper.batch_size": ` + grid(100) + `, "hyper.epochs": ` + grid(100) + `, "hyper.seed": ` + grid(100) + `}, "num_samples": 2000}`,
			"trials (grid_search of param_space.hyper.batch_size and the others, × num_samples 2000); want at most 10000"},
		{"100000 samples", `{"param_space": {"hyper.lr": {"uniform": [0.001, 0.01]}}, "num_samples": 100000}`, "num_samples is 100000; want 1 to 10000"},
		{"num_samples 0", `{"param_space": {"hyper.lr": {"uniform": [0.001, 0.01]}}, "num_samples": 0}`, "num_samples is 0"},
		{"max_concurrent_trials 0", `{"param_space": {"hyper.lr": {"uniform": [0.001, 0.01]}}, "max_concurrent_trials": 0}`, "max_concurrent_trials is 0"},
		{"a path with an empty part", `{"param_space": {"hyper.": {"choice": [1]}}}`, `param_space: "hyper." has an empty part`},
		{"a path to no field", `{"param_space": {"hyper.learning_rate": {"choice": [0.1]}}}`, `param_space: "hyper.learning_rate": unknown field "learning_rate"`},
		{"a path through a value", `{"param_space": {"hyper.lr.x": {"choice": [0.1]}}}`, `"hyper.lr.x": hyper.lr is a single value`},
		{"loguniform from 0", `{"param_space": {"hyper.lr": {"loguniform": [0, 1]}}}`, "param_space.hyper.lr: loguniform: lo must be above 0"},
		{"an unknown domain", `{"param_space": {"hyper.lr": {"normal": [0, 1]}}}`, `param_space.hyper.lr: unknown domain "normal"`},
		{"an empty choice", `{"param_space": {"hyper.lr": {"choice": []}}}`, "param_space.hyper.lr: choice: want a non-empty list of values"},
		{"a value out of range", `{"param_space": {"hyper.lr": {"choice": [20]}}}`, "hyper.lr is 20; want a number in (0, 10)"},
		{"a value of the wrong type", `{"param_space": {"hyper.epochs": {"choice": ["ten"]}}}`, `hyper.epochs: want a whole number, got the string "ten"`},
		{"a bad results_url", `{"param_space": {"hyper.lr": {"choice": [0.1]}}, "results_url": "results"}`, `results_url is "results"; want a blob URL`},
		{"a bad train type", `{"train": {"hyper": {"epochs": "x"}}, "param_space": {"hyper.lr": {"choice": [0.1]}}}`, `train.hyper.epochs: want a whole number, got the string "x"`},
		{"a bad train zero", `{"train": {"hyper": {"epochs": 0}}, "param_space": {"hyper.lr": {"choice": [0.1]}}}`, "train: spec: hyper.epochs is 0"},
		{"a stop on no metric's name", `{"param_space": {"hyper.lr": {"choice": [0.1]}}, "stop": {"val acc": 0.9}}`, "stop.val acc: want training_iteration, or a metric"},
		{"a metric that is no metric's name", `{"param_space": {"hyper.lr": {"choice": [0.1]}}, "metric": "val acc"}`, `metric is "val acc"; want a metric's name`},
		{"an unknown scheduler", `{"param_space": {"hyper.lr": {"choice": [0.1]}}, "scheduler": {"type": "pbt2"}}`, "scheduler"},
		{"an unknown searcher", `{"param_space": {"hyper.lr": {"choice": [0.1]}}, "search_alg": {"type": "hyperopt"}}`, `search_alg.type is "hyperopt"; want "random" (the default) or "tpe"`},
		{"tpe over a grid", `{"param_space": {"hyper.lr": {"grid_search": [0.1, 0.2]}}, "search_alg": {"type": "tpe"}}`, `param_space.hyper.lr is a grid_search; search_alg "tpe" models every dimension`},
		{"tpe with negative startup", `{"param_space": {"hyper.lr": {"uniform": [0.1, 0.2]}}, "search_alg": {"type": "tpe", "n_startup_trials": -3}}`, "search_alg.n_startup_trials is -3"},
		{"a config key the native trainer does not read", `{"param_space": {"config.dropout": {"uniform": [0.1, 0.2]}}}`, "config.dropout: the native trainer reads only"},
		{"a config path too deep", `{"param_space": {"config.lr.x": {"uniform": [0.1, 0.2]}}}`, `"config.lr.x": config.lr is a single value`},
		{"an unknown field", `{"param_space": {"hyper.lr": {"choice": [0.1]}}, "samples": 3}`, `unknown field "samples"`},
		{"a 100 KB search", `{"param_space": {"hyper.lr": {"choice": [` + strings.Repeat("0.1,", 25000) + `0.1]}}}`, "bytes; want at most 65536"},
	}
}
