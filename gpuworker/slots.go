package gpuworker

import (
	"fmt"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/activities"
)

// DiscoverSlots offers one slot per GPU that NVML reports (pinned with
// CUDA_VISIBLE_DEVICES), or cpuSlots CPU slots where NVML is absent, and says
// which in one log line. cpuSlots <= 0 means one.
func DiscoverSlots(cpuSlots int, log *zap.Logger) []activities.Slot {
	if log == nil {
		log = zap.NewNop()
	}
	if cpuSlots <= 0 {
		cpuSlots = 1
	}
	cpu := func(reason string) []activities.Slot {
		log.Info("no GPU: offering CPU slots", zap.Int("slots", cpuSlots), zap.String("reason", reason))
		slots := make([]activities.Slot, cpuSlots)
		for i := range slots {
			slots[i] = activities.Slot{Index: i}
		}
		return slots
	}
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return cpu("NVML: " + nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	count, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS || count == 0 {
		return cpu(fmt.Sprintf("NVML found %d GPUs (%s)", count, nvml.ErrorString(ret)))
	}
	slots := make([]activities.Slot, 0, count)
	for i := range count {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Warn("NVML: skipping a GPU", zap.Int("index", i), zap.String("error", nvml.ErrorString(ret)))
			continue
		}
		name, _ := dev.GetName()
		uuid, _ := dev.GetUUID()
		mem, _ := dev.GetMemoryInfo()
		slots = append(slots, activities.Slot{Index: len(slots), GPU: fmt.Sprintf("%s %s", name, uuid), Device: strconv.Itoa(i)})
		log.Info("GPU slot", zap.Int("index", i), zap.String("name", name), zap.String("uuid", uuid), zap.Uint64("memory_bytes", mem.Total))
	}
	if len(slots) == 0 {
		return cpu("NVML could not open any GPU")
	}
	return slots
}
