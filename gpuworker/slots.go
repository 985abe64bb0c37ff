package gpuworker

import (
	"fmt"
	"strconv"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/activities"
)

// DiscoverSlots offers one slot per GPU that NVML reports (pinned with
// CUDA_VISIBLE_DEVICES), or cpuSlots CPU slots where NVML is absent, and says
// which in one log line. cpuSlots <= 0 means one. With GPUs, it also returns
// the NVML reader of their load for heartbeats and logs; call its Close when
// the worker stops. Without GPUs that reader is nil.
func DiscoverSlots(cpuSlots int, log *zap.Logger) ([]activities.Slot, *GPUs) {
	return DiscoverSlotsWith(nvml.New(), cpuSlots, log)
}

// DiscoverSlotsWith is DiscoverSlots through the given NVML library: the
// real one (nvml.New()), or a fake behind the same interface (go-nvml's
// mock packages) where there is no GPU.
func DiscoverSlotsWith(lib nvml.Interface, cpuSlots int, log *zap.Logger) ([]activities.Slot, *GPUs) {
	if log == nil {
		log = zap.NewNop()
	}
	if cpuSlots <= 0 {
		cpuSlots = 1
	}
	cpu := func(reason string) ([]activities.Slot, *GPUs) {
		log.Info("no GPU: offering CPU slots", zap.Int("slots", cpuSlots), zap.String("reason", reason))
		slots := make([]activities.Slot, cpuSlots)
		for i := range slots {
			slots[i] = activities.Slot{Index: i}
		}
		return slots, nil
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return cpu("NVML: " + lib.ErrorString(ret))
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS || count == 0 {
		lib.Shutdown()
		return cpu(fmt.Sprintf("NVML found %d GPUs (%s)", count, lib.ErrorString(ret)))
	}
	g := &GPUs{lib: lib, devices: map[int]nvml.Device{}, xids: map[int]uint64{}, log: log}
	slots := make([]activities.Slot, 0, count)
	for i := range count {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Warn("NVML: skipping a GPU", zap.Int("index", i), zap.String("error", lib.ErrorString(ret)))
			continue
		}
		name, _ := dev.GetName()
		uuid, _ := dev.GetUUID()
		mem, _ := dev.GetMemoryInfo()
		slot := activities.Slot{Index: len(slots), GPU: fmt.Sprintf("%s %s", name, uuid), Device: visibleDevice(i, uuid)}
		g.devices[slot.Index] = dev
		slots = append(slots, slot)
		log.Info("GPU slot", zap.Int("index", i), zap.String("name", name), zap.String("uuid", uuid), zap.Uint64("memory_bytes", mem.Total))
	}
	if len(slots) == 0 {
		lib.Shutdown()
		return cpu("NVML could not open any GPU")
	}
	g.watchXIDs()
	return slots, g
}

// visibleDevice is the CUDA_VISIBLE_DEVICES value that pins a rank to NVML's
// device i: its UUID where NVML gives one. CUDA numbers devices in its own
// order (fastest first, unless CUDA_DEVICE_ORDER=PCI_BUS_ID), which need not
// be NVML's PCI-bus order, so on a host of mixed GPUs an index could hand a
// rank another slot's GPU; a UUID names the same GPU to both.
func visibleDevice(i int, uuid string) string {
	if uuid == "" {
		return strconv.Itoa(i)
	}
	return uuid
}

// GPUs reads the utilisation and memory of the GPUs behind a worker's slots
// through NVML, and their health. It implements activities.DeviceStats and
// activities.DeviceHealth (health.go).
type GPUs struct {
	lib     nvml.Interface
	mu      sync.Mutex
	devices map[int]nvml.Device // by slot index
	events  nvml.EventSet       // critical XID events of every device (nil where NVML has none)
	xids    map[int]uint64      // slot -> the first fatal XID its GPU raised
	closed  bool
	log     *zap.Logger
}

var _ activities.DeviceStats = (*GPUs)(nil)

// Stats reads the slot's GPU now; false where NVML cannot say.
func (g *GPUs) Stats(slot activities.Slot) (activities.GPUStats, bool) {
	if g == nil {
		return activities.GPUStats{}, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	dev, ok := g.devices[slot.Index]
	if !ok || g.closed {
		return activities.GPUStats{}, false
	}
	util, ret := dev.GetUtilizationRates()
	if ret != nvml.SUCCESS {
		return activities.GPUStats{}, false
	}
	mem, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return activities.GPUStats{}, false
	}
	stats := activities.GPUStats{UtilizationPercent: int(util.Gpu), MemoryUsedBytes: mem.Used, MemoryTotalBytes: mem.Total}
	if t, ret := dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		stats.TemperatureCelsius = int(t)
	}
	if mw, ret := dev.GetPowerUsage(); ret == nvml.SUCCESS {
		stats.PowerWatts = float64(mw) / 1000
	}
	return stats, true
}

// Close shuts NVML down; Stats reports nothing after it.
func (g *GPUs) Close() {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		if g.events != nil {
			safeReturn(g.events.Free)
		}
		g.lib.Shutdown()
	}
}
