package activities

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Slot is one unit a gang can reserve: a GPU, or a CPU slot where there is none.
type Slot struct {
	Index  int
	GPU    string // name and UUID, for placements and logs; empty for a CPU slot
	Device string // the CUDA_VISIBLE_DEVICES value that pins a rank to it
}

// Agent serves the activities of one worker process: HoldSlot (slots.go),
// RunEpoch (epoch.go) and SaveCheckpoint (checkpoints.go).
type Agent struct {
	Identity  string // the worker's identity, shown in placements
	HostQueue string // a task queue only this worker polls
	Listener  *collective.Listener
	Advertise string // the collective address peers dial; default Listener.Addr()
	Slots     []Slot
	Devices   DeviceStats // reads GPU utilisation and memory for heartbeats and logs; nil on CPU slots
	Log       *zap.Logger
	// Backends are the trainer backends this worker runs, by the name a
	// spec's "trainer" gives; default trainer.DefaultBackends (every
	// backend package the binary imports).
	Backends *trainer.Backends
	// Datasets are the data set formats it reads, by spec.dataset.format;
	// default dataset.DefaultRegistry.
	Datasets *dataset.Registry
	// PythonPath is where the durabletrain Python module is, for exec runs
	// (prepended to their PYTHONPATH).
	PythonPath string
	// Transport is the collective's transport: "" (shared memory between
	// ranks on one host, else TCP) or "tcp" (always TCP: hosts that share a
	// kernel but should not share memory, as network namespaces do).
	Transport string
	// Policy is what this worker lets a spec make it do: exec programs,
	// storage, memory. The zero Policy runs no exec program and reads and
	// writes only under policy.DefaultStorageRoots.
	Policy policy.Policy
	// PoolKey is the secret the workers of one pool share (at least 32
	// bytes): each signs its slot grants with it and verifies its gang's
	// before joining, so a forged slot-granted signal cannot put a stranger
	// into a gang. Nil trusts every grant that arrives.
	PoolKey []byte
	// LeaveTimeout bounds how long ranks of a stopping worker take to stop
	// with their gang and checkpoint before they are cut off; default 8s.
	// Keep it below the worker's stop grace.
	LeaveTimeout time.Duration
	// SlotsChanged, if set, is told how many slots are free, held and
	// withdrawn (their GPU unhealthy) whenever a gang takes or frees one or
	// a health check withdraws or restores one (the worker's
	// durabletrain_slots gauge). It must not block.
	SlotsChanged func(free, held, withdrawn int)

	once      sync.Once
	scratch   string // this process's directory for ranks' scratch directories
	slots     slotTable
	replicas  replicaTable
	hosts     hostTable
	survivors survivorTable // states kept from broken gangs (survivors.go)
	holds     holdTable
	// startedFrom, in tests, stands for Temporal's answer about the run a
	// run continued as new from ("" if it did not).
	startedFrom func(workflowID, runID string) (string, error)
	// signalled, in tests, stands for signalling the run (signalRun).
	signalled func(name string, arg any) error
	data      dataCache
}

// DeviceStats reads what a GPU slot is doing; gpuworker implements it with NVML.
type DeviceStats interface {
	Stats(slot Slot) (GPUStats, bool)
}

// GPUStats is a GPU's load, as heartbeats and logs show it.
type GPUStats struct {
	UtilizationPercent int     `json:"gpu_utilization_percent"`
	MemoryUsedBytes    uint64  `json:"gpu_memory_used_bytes"`
	MemoryTotalBytes   uint64  `json:"gpu_memory_total_bytes"`
	TemperatureCelsius int     `json:"gpu_temperature_celsius,omitempty"`
	PowerWatts         float64 `json:"gpu_power_watts,omitempty"`
}

func (a *Agent) init() {
	a.once.Do(func() {
		if a.Log == nil {
			a.Log = zap.NewNop()
		}
		if a.Backends == nil {
			a.Backends = trainer.DefaultBackends
		}
		if a.Datasets == nil {
			a.Datasets = dataset.DefaultRegistry
		}
		a.slots.init(a.Slots)
		a.slots.changed = a.SlotsChanged
		a.slots.notify()
		a.scratch = newScratchRoot(os.TempDir(), a.Log)
	})
}

func (a *Agent) advertise() string {
	if a.Advertise != "" {
		return a.Advertise
	}
	return a.Listener.Addr()
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

// device is the CUDA_VISIBLE_DEVICES value of a slot, "" for a CPU slot.
func (a *Agent) device(index int) string {
	for _, s := range a.Slots {
		if s.Index == index {
			return s.Device
		}
	}
	return ""
}

func (a *Agent) leaveTimeout() time.Duration {
	if a.LeaveTimeout > 0 {
		return a.LeaveTimeout
	}
	return 8 * time.Second
}

// stallTimeout is how long a ring neighbour may be silent before a rank
// declares it stalled: failure.stall_timeout (by default the shorter of 2s
// and half the heartbeat timeout, so the rank that sees it reports before
// Temporal times the stalled rank out).
func stallTimeout(s spec.Training) time.Duration {
	return s.Failure.RingStallTimeout()
}

// Close removes the agent's scratch root, with whatever its ranks left in
// it. Call it once the workers that serve the agent have stopped. (A worker
// killed before it could is cleaned up by the next one on the host:
// newScratchRoot.)
func (a *Agent) Close() error {
	if a.scratch == "" || a.scratch == os.TempDir() {
		return nil
	}
	return os.RemoveAll(a.scratch)
}

// scratchPrefix names a worker process's scratch root in the temporary
// directory: durabletrain-worker-<pid>-<random>.
const scratchPrefix = "durabletrain-worker-"

// newScratchRoot makes this process's scratch root under dir, after removing
// the roots of worker processes that are gone (killed with SIGKILL, their
// ranks' scratch, with restored checkpoints in it, stayed behind). If it
// cannot be made, ranks use dir itself.
func newScratchRoot(dir string, log *zap.Logger) string {
	old, _ := filepath.Glob(filepath.Join(dir, scratchPrefix+"*"))
	for _, p := range old {
		pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(filepath.Base(p), scratchPrefix), "-", 2)[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue // not ours to judge, or its process is alive
		}
		if err := os.RemoveAll(p); err == nil {
			log.Info("removed the scratch of a worker that is gone", zap.String("dir", p))
		}
	}
	root, err := os.MkdirTemp(dir, fmt.Sprintf("%s%d-", scratchPrefix, os.Getpid()))
	if err != nil {
		log.Warn("no scratch root; ranks use the temporary directory", zap.Error(err))
		return dir
	}
	return root
}
