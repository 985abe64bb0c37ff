package gpuworker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/activities"
)

// The GPU health gate (activities.DeviceHealth): what NVML says makes a GPU
// unfit to train, read before a slot is offered and before every epoch.
//
//   - an XID error NVIDIA documents as a hardware or driver fault (the
//     critical XID events NVML delivers), until the GPU is reset;
//   - volatile uncorrectable ECC errors, until reset;
//   - retired pages pending (older GPUs) or rows pending remapping, or a
//     failed row remap (A100 on), until reset;
//   - the GPU lost from the bus (NVML's GPU_IS_LOST), until reset;
//   - hardware slowdown, thermal or power-brake slowdown, or software
//     thermal slowdown, for as long as it lasts (the software power cap, a
//     GPU at its power limit under load, is normal and ignored).
//
// A reading NVML does not support on a GPU (no ECC on a consumer card) is
// passed over.

// fatalXIDs are the XID errors that mean the GPU, its memory or its links
// failed (NVIDIA's XID catalogue): 48 double-bit ECC, 61/62 internal micro-
// controller faults, 63/64 ECC page retirement or row remapping events and
// failures, 68 video processor exception, 69 graphics engine class error,
// 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate,
// 94/95 contained/uncontained ECC, 119/120 GSP errors. Others (13, 31, 43,
// 45: usually the application's) are logged, not held against the GPU.
var fatalXIDs = []uint64{48, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120}

// throttleReasons are the clock-event reasons that withdraw a GPU while they last.
var throttleReasons = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksThrottleReasonHwSlowdown, "hardware slowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "hardware thermal slowdown"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hardware power-brake slowdown"},
	{nvml.ClocksThrottleReasonSwThermalSlowdown, "software thermal slowdown"},
}

var _ activities.DeviceHealth = (*GPUs)(nil)

// watchXIDs registers every device for critical XID events.
func (g *GPUs) watchXIDs() {
	set, ret := safeSet(g.lib.EventSetCreate)
	if ret != nvml.SUCCESS {
		g.log.Info("NVML: no XID events", zap.String("reason", ret.Error()))
		return
	}
	g.events = set
	for i, dev := range g.devices {
		if ret := safeReturn(func() nvml.Return { return dev.RegisterEvents(nvml.EventTypeXidCriticalError, set) }); ret != nvml.SUCCESS {
			g.log.Info("NVML: no XID events for a GPU", zap.Int("slot", i), zap.String("reason", ret.Error()))
		}
	}
}

// drainXIDs takes the XID events NVML has queued, noting the fatal ones
// against their GPU (called with g.mu held).
func (g *GPUs) drainXIDs() {
	if g.events == nil {
		return
	}
	for range 1024 {
		var data nvml.EventData
		ret := safeReturn(func() (r nvml.Return) { data, r = g.events.Wait(0); return })
		if ret != nvml.SUCCESS {
			return // TIMEOUT: none left
		}
		uuid, _ := safeString(data.Device.GetUUID)
		for i, dev := range g.devices {
			if u, _ := safeString(dev.GetUUID); u != uuid || uuid == "" {
				continue
			}
			if slices.Contains(fatalXIDs, data.EventData) {
				if _, seen := g.xids[i]; !seen {
					g.xids[i] = data.EventData
				}
				g.log.Warn("GPU XID error", zap.Int("slot", i), zap.Uint64("xid", data.EventData))
			} else {
				g.log.Info("GPU XID event (not held against the GPU)", zap.Int("slot", i), zap.Uint64("xid", data.EventData))
			}
		}
	}
}

// Health reads the slot's GPU now (see the list above).
func (g *GPUs) Health(slot activities.Slot) (problem string, lasting bool) {
	if g == nil {
		return "", false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	dev, ok := g.devices[slot.Index]
	if !ok || g.closed {
		return "", false
	}
	g.drainXIDs()
	if xid, ok := g.xids[slot.Index]; ok {
		return fmt.Sprintf("XID %d error", xid), true
	}
	var n uint64
	ret := safeReturn(func() (r nvml.Return) {
		n, r = dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
		return
	})
	switch {
	case ret == nvml.ERROR_GPU_IS_LOST:
		return "NVML: the GPU is lost (fallen off the bus)", true
	case ret == nvml.SUCCESS && n > 0:
		return fmt.Sprintf("%d volatile uncorrectable ECC errors", n), true
	}
	var pending nvml.EnableState
	if ret := safeReturn(func() (r nvml.Return) { pending, r = dev.GetRetiredPagesPendingStatus(); return }); ret == nvml.SUCCESS && pending == nvml.FEATURE_ENABLED {
		return "retired pages pending (the GPU needs a reset)", true
	}
	var remapPending, remapFailed bool
	if ret := safeReturn(func() (r nvml.Return) {
		_, _, remapPending, remapFailed, r = dev.GetRemappedRows()
		return
	}); ret == nvml.SUCCESS {
		switch {
		case remapFailed:
			return "a row remap failed", true
		case remapPending:
			return "rows pending remapping (the GPU needs a reset)", true
		}
	}
	var reasons uint64
	if ret := safeReturn(func() (r nvml.Return) { reasons, r = dev.GetCurrentClocksEventReasons(); return }); ret == nvml.SUCCESS {
		var on []string
		for _, t := range throttleReasons {
			if reasons&t.bit != 0 {
				on = append(on, t.name)
			}
		}
		if len(on) > 0 {
			return "clocks throttled: " + strings.Join(on, ", "), false
		}
	}
	return "", false
}

// NVML calls through a fake (go-nvml's mocks) panic where the fake leaves
// a function unset; the real library never does. A reading that panics is
// one NVML does not support.
func safeReturn(f func() nvml.Return) (ret nvml.Return) {
	defer func() {
		if recover() != nil {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}()
	return f()
}

func safeString(f func() (string, nvml.Return)) (s string, ret nvml.Return) {
	ret = safeReturn(func() (r nvml.Return) { s, r = f(); return })
	return s, ret
}

func safeSet(f func() (nvml.EventSet, nvml.Return)) (set nvml.EventSet, ret nvml.Return) {
	ret = safeReturn(func() (r nvml.Return) { set, r = f(); return })
	return set, ret
}
