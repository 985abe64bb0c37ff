// Package gpuworker owns a durabletrain worker process: it discovers GPUs
// with NVML (CPU slots where there are none), owns the slots, the
// host-specific task queue and the collective listener, and registers the
// workflows and activities on Temporal workers. Roles: workflows (the control
// queue), agent (GPU slots and rank work), or both.
package gpuworker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/activities"
	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/workflows"
)

// DefaultStickyTimeout is Config.StickyTimeout's default. A workflow task
// stuck on a dead workflow worker's sticky queue waits this long before any
// worker may take it (Temporal's default is 5 s): the bulk of the time a run
// takes to react to a killed workflow worker. Measured (BENCHMARKS.md): 1 s
// made a kill-9 of that worker cost 1.1 s, 500 ms about half; 250 ms sent
// tasks of live, busy workers elsewhere to be replayed where 500 ms and 1 s
// sent none.
const DefaultStickyTimeout = 500 * time.Millisecond

// Config is a worker process. Reach Temporal with package connect.
type Config struct {
	ControlQueue string // workflows' queue; default spec.DefaultControlQueue
	Namespace    string // the client's namespace, for the queue backlog the workflow role reports; default "default"
	TaskQueue    string // GPU agents' shared queue; default spec.DefaultTaskQueue

	Workflows bool // run workflows
	Agent     bool // offer slots and run ranks

	CPUSlots            int           // slots where NVML finds no GPU; default 1
	CollectiveBind      string        // default: the advertised host, port 0; with no -collective-advertise, 127.0.0.1:0
	CollectiveAdvertise string        // host:port peers dial; default the bind address, with this host's IP for an unspecified host
	CollectiveTransport string        // "" (shared memory on one host, else TCP) or "tcp"
	PythonPath          string        // the directory holding the durabletrain Python module, for exec runs
	Identity            string        // default hostname-pid
	Grace               time.Duration // on shutdown, how long running activities get to finish; default 10s
	// StickyTimeout is how long a workflow task waits on this workflow
	// worker's own (sticky) queue before any workflow worker may take it;
	// default DefaultStickyTimeout. A killed workflow worker's runs wait this
	// long to react to anything; a shorter one sends more tasks of a busy
	// worker's runs elsewhere, to replay their whole history.
	StickyTimeout time.Duration
	// Backends and Datasets are what the agent runs and reads; default
	// trainer.DefaultBackends and dataset.DefaultRegistry: the backend and
	// format packages the binary imports (cmd/worker: native and exec).
	Backends *trainer.Backends
	Datasets *dataset.Registry
	// Policy is what a spec may make this worker do (package policy): the
	// zero Policy runs no exec program and keeps storage under
	// policy.DefaultStorageRoots.
	Policy policy.Policy
	// PoolKey is the secret every worker of the pool shares (at least 32
	// bytes; cmd/worker reads it from -pool-key-file): it signs slot grants,
	// which ranks verify before they join a gang, and checkpoint manifests,
	// which the agent verifies before it loads one. Nil trusts every grant
	// and every checkpoint in the storage roots.
	PoolKey []byte
	// Metrics is the handler the worker's slot and GPU gauges are recorded
	// through: the one given to the client (package telemetry). Nil: none.
	Metrics client.MetricsHandler
	// OnReady, if set, is called once every Temporal worker polls its queue;
	// OnStopping when the process begins to stop (for /readyz).
	OnReady, OnStopping func()
	// Deployment, if set, opts the workflow worker into Temporal's worker
	// deployment versioning as version Deployment:BuildID, with workflows
	// auto-upgrading (their histories replay on newer builds: GetVersion
	// guards every change). Empty: unversioned.
	Deployment string
	BuildID    string
	Log        *zap.Logger
}

// RegisterWorkflows registers durabletrain's workflows on a worker of yours.
// (TrainingWorkflow and TuneWorkflow, and the activity that writes a
// search's results, where p's storage roots allow).
func RegisterWorkflows(w worker.Registry, p policy.Policy) {
	RegisterSearch(w, activities.Results{Policy: p})
}

// RegisterSearch registers the workflows and the activities a run and a
// search run on the workflows' queue: writing a search's results, cloning
// checkpoints for PBT (signed with r.PoolKey, which must then be the
// pool's key), and logging to MLflow (where r.Policy.Trackers allows).
func RegisterSearch(w worker.Registry, r activities.Results) {
	w.RegisterWorkflowWithOptions(workflows.TrainingWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTraining})
	w.RegisterWorkflowWithOptions(workflows.TuneWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTune})
	w.RegisterActivityWithOptions(r.WriteTuneResults, activity.RegisterOptions{Name: spec.ActivityWriteTuneResults})
	w.RegisterActivityWithOptions(r.WriteTuneRows, activity.RegisterOptions{Name: spec.ActivityWriteTuneRows})
	w.RegisterActivityWithOptions(r.CloneCheckpoint, activity.RegisterOptions{Name: spec.ActivityCloneCheckpoint})
	// A run's MLflow logging (spec.mlflow), where r.Policy.Trackers allows.
	w.RegisterActivityWithOptions(activities.Tracker{Policy: r.Policy, Log: r.Log}.TrackMLflow, activity.RegisterOptions{Name: spec.ActivityTrackMLflow})
}

// RegisterAgent registers a GPU agent's activities: HoldSlot on the worker of
// the shared GPU task queue (give it worker.Options.Tuner = HoldTuner(agent),
// so it asks for holds only while a slot is free), and the rank activities
// on the worker of the agent's own host queue, with HoldSlot again there (a
// run that continued as new takes its gang's holds over through it) and
// ReleaseHold (a run lets go of its holds at once through it).
func RegisterAgent(slots, ranks worker.Registry, agent *activities.Agent) {
	slots.RegisterActivityWithOptions(agent.HoldSlot, activity.RegisterOptions{Name: spec.ActivityHoldSlot})
	ranks.RegisterActivityWithOptions(agent.HoldSlot, activity.RegisterOptions{Name: spec.ActivityHoldSlot})
	ranks.RegisterActivityWithOptions(agent.RunEpoch, activity.RegisterOptions{Name: spec.ActivityRunEpoch})
	ranks.RegisterActivityWithOptions(agent.SaveCheckpoint, activity.RegisterOptions{Name: spec.ActivitySaveCheckpoint})
	ranks.RegisterActivityWithOptions(agent.ReleaseHold, activity.RegisterOptions{Name: spec.ActivityReleaseHold})
}

// Run runs the worker process until ctx ends, then stops gracefully: the
// workers stop polling, and running ranks are told the worker is leaving
// (a preemption) and get Grace to finish.
func Run(ctx context.Context, c client.Client, cfg Config) error {
	if !cfg.Workflows && !cfg.Agent {
		return errors.New("gpuworker: no role: enable workflows, agent, or both")
	}
	if cfg.ControlQueue == "" {
		cfg.ControlQueue = spec.DefaultControlQueue
	}
	if cfg.TaskQueue == "" {
		cfg.TaskQueue = spec.DefaultTaskQueue
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "default"
	}
	if cfg.Identity == "" {
		host, _ := os.Hostname()
		cfg.Identity = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if cfg.Grace == 0 {
		cfg.Grace = 10 * time.Second
	}
	if cfg.StickyTimeout == 0 {
		cfg.StickyTimeout = DefaultStickyTimeout
	}
	if cfg.StickyTimeout < 0 {
		return fmt.Errorf("gpuworker: StickyTimeout (worker -sticky-timeout) is %v; want a positive duration such as 500ms, or 0 for the default %v", cfg.StickyTimeout, DefaultStickyTimeout)
	}
	if err := cfg.Policy.CheckRoots(); err != nil {
		return fmt.Errorf("gpuworker: Policy.%w", err)
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	log := cfg.Log.With(zap.String("worker", cfg.Identity))
	var workers []worker.Worker
	if cfg.Workflows {
		opts := worker.Options{Identity: cfg.Identity, WorkerStopTimeout: cfg.Grace, StickyScheduleToStartTimeout: cfg.StickyTimeout}
		if cfg.Deployment != "" {
			if cfg.BuildID == "" {
				return errors.New("gpuworker: a Deployment needs a BuildID")
			}
			opts.DeploymentOptions = worker.DeploymentOptions{UseVersioning: true,
				Version:                   worker.WorkerDeploymentVersion{DeploymentName: cfg.Deployment, BuildID: cfg.BuildID},
				DefaultVersioningBehavior: workflow.VersioningBehaviorAutoUpgrade}
		}
		w := worker.New(c, cfg.ControlQueue, opts)
		RegisterSearch(w, activities.Results{Policy: cfg.Policy, PoolKey: cfg.PoolKey, Log: log})
		workers = append(workers, w)
		if cfg.Metrics != nil {
			go sampleDemand(ctx, c, cfg.Namespace, cfg.TaskQueue, cfg.Metrics, log, demandEvery)
		}
		log.Info("serving workflows", zap.String("task_queue", cfg.ControlQueue))
	}
	backends := trainer.DefaultBackends
	if cfg.Backends != nil {
		backends = cfg.Backends
	}
	if cfg.Agent && len(backends.Names()) == 0 {
		return errors.New("gpuworker: no trainer backend is registered; import the backend packages (trainer/native, trainer/exectrainer) or pass Config.Backends")
	}
	if cfg.Agent {
		if cfg.CollectiveBind == "" {
			cfg.CollectiveBind = defaultBind(cfg.CollectiveAdvertise)
		}
		ln, err := collective.Listen(cfg.CollectiveBind, log)
		if err != nil {
			return err
		}
		defer ln.Close()
		// The host queue must reach this process and no other, even if two
		// workers are given the same identity: a random suffix makes it unique.
		hostQueue := fmt.Sprintf("%s@%s-%s", cfg.TaskQueue, cfg.Identity, randomSuffix())
		found, gpus := DiscoverSlots(cfg.CPUSlots, log)
		defer gpus.Close()
		agent := &activities.Agent{Identity: cfg.Identity, HostQueue: hostQueue, Listener: ln, Advertise: advertise(cfg.CollectiveAdvertise, ln.Addr()),
			Slots: found, Log: log, LeaveTimeout: leaveTimeout(cfg.Grace), Transport: cfg.CollectiveTransport, PythonPath: cfg.PythonPath,
			Backends: cfg.Backends, Datasets: cfg.Datasets, Policy: cfg.Policy, PoolKey: cfg.PoolKey}
		if cfg.PoolKey == nil {
			log.Warn("no pool key: slot grants and checkpoints are not authenticated; whoever can signal a run or write its checkpoint storage can join its gangs or forge its checkpoints (-pool-key-file)")
		} else if len(cfg.PoolKey) < activities.MinPoolKeyBytes {
			return fmt.Errorf("pool key of %d bytes; want at least %d", len(cfg.PoolKey), activities.MinPoolKeyBytes)
		}
		if gpus != nil {
			agent.Devices = gpus
		}
		if cfg.Metrics != nil {
			h := cfg.Metrics.WithTags(map[string]string{"worker": cfg.Identity})
			agent.SlotsChanged = slotGauges(h)
			agent.SlotsChanged(len(agent.Slots), 0, 0)
			if gpus != nil {
				go sampleGPUs(ctx, h, agent, sampleEvery)
			}
		}
		tuner, err := HoldTuner(agent)
		if err != nil {
			return err
		}
		// Activities only: a worker with no workflows would still long-poll
		// for workflow tasks on both queues (the SDK starts the pollers
		// regardless), four idle polls per host on the server.
		slots := worker.New(c, cfg.TaskQueue, worker.Options{Identity: cfg.Identity, WorkerStopTimeout: cfg.Grace, Tuner: tuner, DisableWorkflowWorker: true})
		ranks := worker.New(c, agent.HostQueue, worker.Options{Identity: cfg.Identity, WorkerStopTimeout: cfg.Grace, DisableWorkflowWorker: true})
		RegisterAgent(slots, ranks, agent)
		defer agent.Close() // after the workers stop (below): the ranks' scratch is theirs until then
		workers = append(workers, slots, ranks)
		log.Info("serving as a GPU agent", zap.String("task_queue", cfg.TaskQueue), zap.String("host_queue", agent.HostQueue),
			zap.String("collective", agent.Advertise), zap.Int("slots", len(agent.Slots)), zap.Strings("trainers", backends.Names()))
	}
	for i, w := range workers {
		if err := w.Start(); err != nil {
			for _, s := range workers[:i] {
				s.Stop()
			}
			return err
		}
	}
	if cfg.OnReady != nil {
		cfg.OnReady()
	}
	<-ctx.Done()
	if cfg.OnStopping != nil {
		cfg.OnStopping()
	}
	log.Info("shutting down: no new work; running ranks are told to leave", zap.Duration("grace", cfg.Grace))
	// Stop them together: each Stop waits out its running activities, and a
	// slot's HoldSlot waits for its rank's epoch to leave with the gang.
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(w.Stop)
	}
	wg.Wait()
	return nil
}

// defaultBind is where the collective listens when not told: the address
// peers are told to dial (and no other interface), or loopback for a worker
// whose peers are all on this machine. Strangers on other interfaces cannot
// reach it. (Behind NAT, where the advertised address is not this host's,
// set -collective-bind.)
func defaultBind(advertise string) string {
	if host, _, err := net.SplitHostPort(advertise); err == nil && host != "" {
		return advertise
	}
	return "127.0.0.1:0"
}

// leaveTimeout leaves a stopping worker's ranks most of the grace period to
// stop with their gangs and checkpoint, and the rest to report it.
func leaveTimeout(grace time.Duration) time.Duration {
	return max(grace*3/4, grace-2*time.Second)
}

// advertise is the configured address, or the bound one with this host's
// first non-loopback IPv4 address (127.0.0.1 if it has none) in place of an
// unspecified host, so peers on other hosts and containers can dial it. Set
// -collective-advertise where that guess is wrong (NAT, several networks).
func advertise(configured, bound string) string {
	if configured != "" {
		return configured
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return bound
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = hostIP()
	}
	return net.JoinHostPort(host, port)
}

// hostIP is the first up, non-loopback IPv4 address of this host, or 127.0.0.1.
func hostIP() string {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "127.0.0.1"
	}
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

func randomSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
