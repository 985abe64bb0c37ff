// Package simfleet runs a simulated fleet of GPU hosts in one process, for
// the scale benchmark (bench scale) and its small row in the tests. What is
// simulated, and what is real:
//   - each host is the real GPU agent (activities.Agent), with its own
//     collective listener and its two real Temporal workers: one on the
//     shared GPU task queue (HoldSlot, with gpuworker.HoldTuner) and one on
//     its own host queue (RunEpoch), against a real Temporal server;
//   - its GPUs are go-nvml's mock of a DGX A100 (8 A100s) behind the same
//     nvml.Interface the real library implements, found by
//     gpuworker.DiscoverSlotsWith as real ones are;
//   - the trainer is simulated (unless Options.Native lets runs name the
//     real native trainer): an epoch takes a set time and all-reduces a
//     small buffer for real over the collective: hierarchically by default
//     (a host's ranks in memory, TCP around the ring of hosts), or over one
//     TCP ring of every rank when the run's spec asks for "ring".
//
// Many hosts share one process, one Temporal client and two cores, so the
// figures bound what a real fleet's control plane costs from above.
package simfleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/activities"
	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/gpuworker"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
)

// Options shape a fleet.
type Options struct {
	Hosts       int
	GPUsPerHost int           // at most 8 (a DGX A100)
	TaskQueue   string        // the shared GPU task queue
	EpochTime   time.Duration // what one simulated epoch takes
	// ReduceFloats is the size of the buffer each step all-reduces; default 1024.
	ReduceFloats int
	// StorageRoot is the blob URL prefix runs on the fleet may keep
	// checkpoints under, shared by every host (a file:// directory: a
	// mem:// bucket is one per opening, so hosts would not see each
	// other's checkpoints). Default mem://, for runs that never restore.
	StorageRoot string
	// Native also lets the fleet's ranks run the real native trainer
	// (spec trainer "native") on data sets under DataRoot: real training
	// on simulated hosts, as bench pbt runs it.
	Native   bool
	DataRoot string
	Log      *zap.Logger
}

// Fleet is a running simulated fleet.
type Fleet struct {
	agents    []*activities.Agent
	workers   []worker.Worker
	listeners []*collective.Listener
	gpus      []*gpuworker.GPUs
	// Epochs counts the simulated epochs the ranks trained.
	Epochs atomic.Int64
	// Ranks counts the trainers the agents built (a rank joining a gang),
	// Restores the checkpoints they restored.
	Ranks, Restores atomic.Int64
}

// fakeDGX is a DGX A100 as NVML reports it, with the readings heartbeats use.
func fakeDGX() nvml.Interface {
	s := dgxa100.New()
	for _, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 97, Memory: 60}, nvml.SUCCESS }
		dev.GetTemperatureFunc = func(nvml.TemperatureSensors) (uint32, nvml.Return) { return 64, nvml.SUCCESS }
		dev.GetPowerUsageFunc = func() (uint32, nvml.Return) { return 310000, nvml.SUCCESS }
		// Healthy, as the health gate reads it.
		dev.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) { return 0, nvml.SUCCESS }
		dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) { return nvml.FEATURE_DISABLED, nvml.SUCCESS }
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) { return 0, 0, false, false, nvml.SUCCESS }
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) { return nvml.ClocksEventReasonSwPowerCap, nvml.SUCCESS }
	}
	return s
}

// Start brings up the fleet's hosts on c; call Stop to take them down.
func Start(c client.Client, o Options) (*Fleet, error) {
	if o.GPUsPerHost < 1 || o.GPUsPerHost > 8 {
		return nil, fmt.Errorf("simfleet: %d GPUs per host; want 1 to 8 (a DGX A100)", o.GPUsPerHost)
	}
	if o.ReduceFloats <= 0 {
		o.ReduceFloats = 1024
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	roots := []string{"mem://"}
	if o.StorageRoot != "" {
		roots = append(roots, o.StorageRoot)
	}
	f := &Fleet{}
	backends := trainer.NewBackends()
	backends.Register(Backend, trainer.BackendFunc(func(_ context.Context, r trainer.Rank) (trainer.Trainer, error) {
		f.Ranks.Add(1)
		return &countingTrainer{simTrainer: simTrainer{comm: r.Comm, epochTime: o.EpochTime, weights: make([]float32, o.ReduceFloats)}, fleet: f}, nil
	}))
	if o.Native {
		backends.Register(native.Name, trainer.BackendFunc(native.NewRank))
		if o.DataRoot != "" {
			roots = append(roots, o.DataRoot)
		}
	}
	for h := range o.Hosts {
		slots, gpus := gpuworker.DiscoverSlotsWith(fakeDGX(), 1, nil)
		if gpus == nil || len(slots) < o.GPUsPerHost {
			f.Stop()
			return nil, fmt.Errorf("simfleet: the fake NVML offered %d GPUs; want %d", len(slots), o.GPUsPerHost)
		}
		f.gpus = append(f.gpus, gpus)
		ln, err := collective.Listen("127.0.0.1:0", nil)
		if err != nil {
			f.Stop()
			return nil, err
		}
		f.listeners = append(f.listeners, ln)
		id := fmt.Sprintf("sim-host-%04d", h)
		agent := &activities.Agent{Identity: id, HostQueue: o.TaskQueue + "@" + id, Listener: ln, Slots: slots[:o.GPUsPerHost], Devices: gpus,
			Backends: backends, Transport: collective.TransportTCP, Log: o.Log.With(zap.String("worker", id)),
			Policy: policy.Policy{StorageRoots: roots}}
		f.agents = append(f.agents, agent)
		tuner, err := gpuworker.HoldTuner(agent)
		if err != nil {
			f.Stop()
			return nil, err
		}
		holds := worker.New(c, o.TaskQueue, worker.Options{Identity: id, Tuner: tuner, MaxConcurrentActivityTaskPollers: 1, DisableWorkflowWorker: true})
		ranks := worker.New(c, agent.HostQueue, worker.Options{Identity: id, MaxConcurrentActivityTaskPollers: 1, DisableWorkflowWorker: true})
		gpuworker.RegisterAgent(holds, ranks, agent)
		for _, w := range []worker.Worker{holds, ranks} {
			if err := w.Start(); err != nil {
				f.Stop()
				return nil, err
			}
			f.workers = append(f.workers, w)
		}
	}
	return f, nil
}

// Usage is how many of the fleet's slots gangs hold, how many of those run
// an epoch now, and how many slots it has.
func (f *Fleet) Usage() (held, training, total int) {
	for _, a := range f.agents {
		h, t := a.SlotUsage()
		held, training, total = held+h, training+t, total+len(a.Slots)
	}
	return held, training, total
}

// Stop stops every host.
func (f *Fleet) Stop() {
	for _, w := range f.workers {
		w.Stop()
	}
	for _, a := range f.agents {
		a.Close()
	}
	for _, ln := range f.listeners {
		ln.Close()
	}
	for _, g := range f.gpus {
		g.Close()
	}
}

// countingTrainer counts the fleet's trained epochs and restores.
type countingTrainer struct {
	simTrainer
	fleet *Fleet
}

func (t *countingTrainer) Restore(ctx context.Context, from trainer.StateReader) error {
	t.fleet.Restores.Add(1)
	return t.simTrainer.Restore(ctx, from)
}

func (t *countingTrainer) TrainEpoch(ctx context.Context, epoch int, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	m, err := t.simTrainer.TrainEpoch(ctx, epoch, opts)
	if err == nil && !m.Left && t.cursor.Step == 0 {
		t.fleet.Epochs.Add(1)
	}
	return m, err
}
