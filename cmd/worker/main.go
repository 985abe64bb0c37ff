// Command worker runs a durabletrain worker: the TrainingWorkflow, a GPU agent
// (one slot per GPU found by NVML, or -slots CPU slots), or both.
//
//	worker -address 127.0.0.1:7233 -role both -slots 1
//
// It runs the trainer backends and blob drivers it imports: native, exec;
// file://, mem://, s3://. A binary of your own that imports more runs more.
//
// SIGTERM or SIGINT stops taking work and tells running ranks to leave (a
// preemption for their runs), giving them -grace to finish.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	_ "github.com/durabletrain/durabletrain/blobdrivers" // file://, mem://, s3://
	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/gpuworker"
	"github.com/durabletrain/durabletrain/internal/blobwatch"
	"github.com/durabletrain/durabletrain/internal/buildinfo"
	"github.com/durabletrain/durabletrain/internal/keyfile"
	"github.com/durabletrain/durabletrain/internal/logging"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/telemetry"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
	_ "github.com/durabletrain/durabletrain/trainer/exectrainer" // "trainer": "exec"
	_ "github.com/durabletrain/durabletrain/trainer/native"      // "trainer": "native"
)

func main() {
	var cfg gpuworker.Config
	var conn connect.Options
	conn.Register(flag.CommandLine)
	role := flag.String("role", "both", "workflows, agent, or both")
	flag.StringVar(&cfg.TaskQueue, "task-queue", spec.DefaultTaskQueue, "task queue the GPU agents take slot requests from (scaling.task_queue)")
	flag.IntVar(&cfg.CPUSlots, "slots", 1, "CPU slots to offer where NVML finds no GPU")
	flag.StringVar(&cfg.CollectiveBind, "collective-bind", "", "address the collective listener binds (default: the -collective-advertise address, else 127.0.0.1:0; \":7070\" listens on every interface)")
	flag.StringVar(&cfg.CollectiveAdvertise, "collective-advertise", "", "address peers dial (default: the bound address, with this host's IP for an unspecified host; set it on multi-host setups)")
	flag.StringVar(&cfg.CollectiveTransport, "collective-transport", "", `"" (shared memory between ranks on one host, else TCP) or "tcp"`)
	flag.StringVar(&cfg.PythonPath, "python-path", envOr("DURABLETRAIN_PYTHONPATH", pythonNextToBinary()), "directory holding the durabletrain Python module (python/ of the repository), for exec runs")
	flag.StringVar(&cfg.Identity, "identity", "", "worker identity (default hostname-pid)")
	flag.DurationVar(&cfg.Grace, "grace", 10*time.Second, "how long running ranks get to leave on shutdown")
	flag.DurationVar(&cfg.StickyTimeout, "sticky-timeout", gpuworker.DefaultStickyTimeout, "how long a workflow task waits on this workflow worker's own queue before any worker may take it: a killed workflow worker's runs wait this long; a shorter one sends a busy worker's tasks elsewhere, to replay their history")
	// The worker's policy: what a spec may make it do (package policy).
	allowExec := flag.String("allow-exec", "", `programs "exec" runs may start, comma-separated: absolute paths, names on PATH, directories ending in /, or * (default: none, exec is off)`)
	execDirs := flag.String("exec-dirs", "", "directories exec.dir may name, comma-separated (default: none; programs run in their scratch directory)")
	passEnv := flag.String("exec-pass-env", strings.Join(policy.DefaultPassEnv, ","), "this worker's environment variables exec programs also get, comma-separated (never its credentials unless listed)")
	ncclIfname := flag.String("nccl-socket-ifname", "", "network interface(s) NCCL uses between hosts, for every exec program (NCCL_SOCKET_IFNAME, such as ib0 or ^lo,docker); empty: NCCL's choice")
	glooIfname := flag.String("gloo-socket-ifname", "", "network interface gloo uses (GLOO_SOCKET_IFNAME), for every exec program; empty: gloo's choice")
	ncclAsync := flag.Bool("nccl-async-error-handling", true, "have NCCL errors and collective timeouts abort the rank's program instead of hanging it (TORCH_NCCL_ASYNC_ERROR_HANDLING)")
	roots := flag.String("storage-roots", strings.Join(policy.DefaultStorageRoots, ","),
		"blob URLs (or absolute local paths) that dataset, checkpoint and results URLs must fall under, comma-separated; a root's query parameters (endpoint=, region=, profile=) are the worker's and added to the spec's")
	trackers := flag.String("trackers", "", "MLflow tracking servers a spec's mlflow.tracking_uri may name, comma-separated http(s) URLs (paths at or under each), or * for any (default: none; this worker's MLFLOW_TRACKING_TOKEN, or _USERNAME and _PASSWORD, authenticate)")
	poolKey := flag.String("pool-key-file", os.Getenv("DURABLETRAIN_POOL_KEY_FILE"),
		"file holding the secret all workers of this pool share (at least 32 bytes, mode 600): it signs slot grants and checkpoints, so nobody outside the pool can join a gang or forge a checkpoint")
	flag.Int64Var(&cfg.Policy.MaxRankMemory, "max-rank-memory", 0, "bytes one rank's model may take (default: half the worker's memory or cgroup limit, shared among its slots)")
	flag.Int64Var(&cfg.Policy.MaxDatasetMemory, "max-dataset-memory", 0, "bytes one data set's examples may take in memory, both splits (default: a quarter of the worker's memory or cgroup limit)")
	flag.DurationVar(&cfg.Policy.StorageStallTimeout, "storage-stall-timeout", blobwatch.DefaultStallTimeout, "how long a call to blob storage (a checkpoint object written or read, a listing, a data set file) may move nothing before it fails and the gang re-forms: a hung or unreachable store")
	// Operations: logs, metrics, health, tracing, versioning.
	var logOpts logging.Options
	logOpts.Register(flag.CommandLine, "json")
	metricsListen := flag.String("metrics-listen", os.Getenv("DURABLETRAIN_METRICS_LISTEN"), "address to serve /metrics (Prometheus), /healthz and /readyz on, such as :9090 (default $DURABLETRAIN_METRICS_LISTEN; empty: none)")
	var tel telemetry.Options
	flag.BoolVar(&tel.Tracing, "tracing", false, "export OpenTelemetry spans (Temporal's interceptor, and gang, epoch and checkpoint spans) over OTLP/gRPC to -otlp-endpoint or $OTEL_EXPORTER_OTLP_ENDPOINT")
	flag.StringVar(&tel.OTLPEndpoint, "otlp-endpoint", "", "host:port of the OpenTelemetry collector (default $OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317)")
	flag.BoolVar(&tel.OTLPInsecure, "otlp-insecure", false, "send spans without TLS (a collector on this host or in this pod)")
	flag.DurationVar(&tel.RunRetention, "metrics-run-retention", telemetry.DefaultRunRetention, "how long a run's per-rank series (run and rank labels) stay on /metrics after the last update of any of them on this worker; a worker forgets the series of runs gone from it")
	flag.IntVar(&tel.MaxRunSeries, "metrics-max-run-series", telemetry.DefaultMaxRunSeries, "the most per-rank series a worker keeps on /metrics; past it new ones are counted (durabletrain_metric_series_refused_total) and not kept")
	flag.StringVar(&cfg.Deployment, "deployment-name", "", "Temporal worker deployment this worker is a version of (worker versioning; the version is this binary's build ID, see -version); empty: unversioned")
	version := flag.Bool("version", false, "print the version and build ID, and exit")
	flag.Parse()
	if *version {
		fmt.Println(buildinfo.String("worker"))
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "worker: unexpected argument %q; every setting is a flag (worker -h lists them)\n", flag.Arg(0))
		os.Exit(2)
	}
	log, err := logOpts.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	defer log.Sync()
	cfg.Log = log
	cfg.BuildID = buildinfo.BuildID()
	cfg.Policy.Exec, cfg.Policy.ExecDirs = list(*allowExec), list(*execDirs)
	cfg.Policy.PassEnv = list(*passEnv)
	if cfg.Policy.StorageRoots, err = policy.ParseStorageRoots("-storage-roots", *roots); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	if cfg.Policy.Trackers, err = policy.ParseTrackers("-trackers", *trackers); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	cfg.Policy.ProgramEnv = policy.NCCLEnv(*ncclIfname, *glooIfname, *ncclAsync)
	if cfg.Policy.PassEnv == nil {
		cfg.Policy.PassEnv = []string{}
	}
	if *poolKey != "" {
		key, err := keyfile.Read(*poolKey, "-pool-key-file")
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(2)
		}
		cfg.PoolKey = key
	}
	cfg.ControlQueue = conn.ControlQueue
	switch *role {
	case "workflows":
		cfg.Workflows = true
	case "agent":
		cfg.Agent = true
	case "both":
		cfg.Workflows, cfg.Agent = true, true
	default:
		fmt.Fprintf(os.Stderr, "worker: -role is %q; want workflows, agent or both\n", *role)
		os.Exit(2)
	}
	for _, m := range []struct {
		flag  string
		bytes int64
	}{{"-max-rank-memory", cfg.Policy.MaxRankMemory}, {"-max-dataset-memory", cfg.Policy.MaxDatasetMemory}} {
		if m.bytes < 0 {
			fmt.Fprintf(os.Stderr, "worker: %s is %d; want a number of bytes, such as 8589934592 for 8 GiB, or 0 for the default\n", m.flag, m.bytes)
			os.Exit(2)
		}
	}
	if cfg.Policy.StorageStallTimeout < time.Second {
		fmt.Fprintf(os.Stderr, "worker: -storage-stall-timeout is %v; want 1s or more, such as %v (the default)\n", cfg.Policy.StorageStallTimeout, blobwatch.DefaultStallTimeout)
		os.Exit(2)
	}
	if cfg.StickyTimeout <= 0 {
		fmt.Fprintf(os.Stderr, "worker: -sticky-timeout is %v; want a positive duration such as %v (the default)\n", cfg.StickyTimeout, gpuworker.DefaultStickyTimeout)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	tel.Service, tel.Version = "worker", buildinfo.ReleaseVersion()
	t, err := telemetry.New(ctx, tel, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	defer func() {
		// Flush the spans not yet exported, but never hold the exit for an unreachable collector.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		t.Close(ctx)
	}()
	t.Metrics.WithTags(map[string]string{"version": buildinfo.ReleaseVersion(), "build_id": cfg.BuildID, "worker": cfg.Identity}).Gauge(metricname.WorkerInfo).Update(1)
	if *metricsListen != "" {
		addr, err := t.Listen(*metricsListen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			os.Exit(2)
		}
		log.Info("serving /metrics, /healthz and /readyz", zap.String("address", addr))
	}
	opts, err := conn.ClientOptions(log)
	if err != nil { // a configuration error: retrying cannot mend it
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	opts.MetricsHandler, opts.Interceptors = t.Metrics, append(opts.Interceptors, t.Interceptors...)
	c, err := dialUntilUp(ctx, opts, t.Health, log)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(3)
	}
	defer c.Close()
	cfg.Metrics, cfg.Namespace = t.Metrics, opts.Namespace
	cfg.OnReady = t.Health.SetReady
	cfg.OnStopping = func() { t.Health.SetNotReady("shutting down") }
	log.Info("starting", zap.String("version", buildinfo.ReleaseVersion()), zap.String("build_id", cfg.BuildID))
	if err := gpuworker.Run(ctx, c, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

// dialUntilUp connects to Temporal, and while it cannot, tries again with
// backoff (1 s doubling to 30 s) until ctx ends: a worker started before its
// server, as in a Kubernetes roll-out, waits instead of exiting.
func dialUntilUp(ctx context.Context, opts client.Options, health *telemetry.Health, log *zap.Logger) (client.Client, error) {
	wait := time.Second
	for attempt := 1; ; attempt++ {
		health.SetNotReady(fmt.Sprintf("connecting to Temporal at %s (attempt %d)", opts.HostPort, attempt))
		dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := client.DialContext(dialCtx, opts)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("reached Temporal", zap.String("address", opts.HostPort), zap.Int("attempts", attempt))
			}
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("stopped while connecting to Temporal at %s: %w", opts.HostPort, err)
		}
		log.Warn("cannot reach Temporal yet; trying again", zap.String("address", opts.HostPort), zap.String("namespace", opts.Namespace),
			zap.Int("attempt", attempt), zap.Duration("in", wait), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped while connecting to Temporal at %s: %w", opts.HostPort, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}

// envOr is the environment variable's value, or def where it is unset.
func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// pythonNextToBinary is ../python from the worker binary (bin/worker in a
// checkout), if the durabletrain module is there.
func pythonNextToBinary() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	dir := filepath.Join(filepath.Dir(filepath.Dir(exe)), "python")
	if _, err := os.Stat(filepath.Join(dir, "durabletrain", "__init__.py")); err != nil {
		return ""
	}
	return dir
}

// list splits a comma-separated flag, dropping empty items.
func list(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
