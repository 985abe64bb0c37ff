package gpuworker

import (
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// sickDGX is a DGX A100 behind go-nvml's mock, healthy until a test says
// otherwise: per-GPU readings of ECC, pending retirement and remapping,
// clock-event reasons, and a queue of XID events.
type sickDGX struct {
	*dgxa100.Server
	mu                     sync.Mutex
	ecc                    map[int]uint64
	pagesPending, remapBad map[int]bool
	clocks                 map[int]uint64
	lost                   map[int]bool
	events                 []nvml.EventData
}

func newSickDGX() *sickDGX {
	f := &sickDGX{Server: dgxa100.New(), ecc: map[int]uint64{}, pagesPending: map[int]bool{}, remapBad: map[int]bool{}, clocks: map[int]uint64{}, lost: map[int]bool{}}
	f.EventSetCreateFunc = func() (nvml.EventSet, nvml.Return) {
		return &mock.EventSet{
			WaitFunc: func(uint32) (nvml.EventData, nvml.Return) {
				f.mu.Lock()
				defer f.mu.Unlock()
				if len(f.events) == 0 {
					return nvml.EventData{}, nvml.ERROR_TIMEOUT
				}
				e := f.events[0]
				f.events = f.events[1:]
				return e, nvml.SUCCESS
			},
			FreeFunc: func() nvml.Return { return nvml.SUCCESS },
		}, nvml.SUCCESS
	}
	for i, d := range f.Devices {
		dev := d.(*dgxa100.Device)
		dev.RegisterEventsFunc = func(uint64, nvml.EventSet) nvml.Return { return nvml.SUCCESS }
		dev.GetTotalEccErrorsFunc = func(nvml.MemoryErrorType, nvml.EccCounterType) (uint64, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.lost[i] {
				return 0, nvml.ERROR_GPU_IS_LOST
			}
			return f.ecc[i], nvml.SUCCESS
		}
		dev.GetRetiredPagesPendingStatusFunc = func() (nvml.EnableState, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.pagesPending[i] {
				return nvml.FEATURE_ENABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_DISABLED, nvml.SUCCESS
		}
		dev.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return 0, 0, false, f.remapBad[i], nvml.SUCCESS
		}
		dev.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.clocks[i] | nvml.ClocksEventReasonSwPowerCap, nvml.SUCCESS // at its power cap: normal
		}
	}
	return f
}

func (f *sickDGX) xid(gpu int, code uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.events = append(f.events, nvml.EventData{Device: f.Devices[gpu], EventType: nvml.EventTypeXidCriticalError, EventData: code})
}

// Every fault the gate knows withdraws the GPU it struck, and only that one;
// XIDs the application causes and the power cap do not; throttling passes.
func TestHealthGateReadsNVML(t *testing.T) {
	f := newSickDGX()
	slots, gpus := DiscoverSlotsWith(f, 1, nil)
	if gpus == nil || len(slots) != 8 {
		t.Fatalf("%d slots", len(slots))
	}
	defer gpus.Close()
	for _, s := range slots {
		if p, _ := gpus.Health(s); p != "" {
			t.Fatalf("a healthy GPU %d: %s", s.Index, p)
		}
	}
	f.mu.Lock()
	f.ecc[1], f.pagesPending[2], f.remapBad[3], f.clocks[4], f.lost[6] = 3, true, true, nvml.ClocksThrottleReasonHwThermalSlowdown, true
	f.mu.Unlock()
	f.xid(5, 79)
	f.xid(7, 13) // a fault of the application's, not the GPU's
	want := map[int]struct {
		problem string
		lasting bool
	}{
		1: {"3 volatile uncorrectable ECC errors", true},
		2: {"retired pages pending (the GPU needs a reset)", true},
		3: {"a row remap failed", true},
		4: {"clocks throttled: hardware thermal slowdown", false},
		5: {"XID 79 error", true},
		6: {"NVML: the GPU is lost (fallen off the bus)", true},
	}
	for _, s := range slots {
		p, lasting := gpus.Health(s)
		if w := want[s.Index]; p != w.problem || lasting != w.lasting {
			t.Errorf("GPU %d: %q (lasting %v); want %q (lasting %v)", s.Index, p, lasting, w.problem, w.lasting)
		}
	}
	// Throttling ends; an XID stays until the GPU is reset (the worker restarts).
	f.mu.Lock()
	f.clocks[4] = 0
	f.mu.Unlock()
	if p, _ := gpus.Health(slots[4]); p != "" {
		t.Errorf("GPU 4 after its throttling ended: %q", p)
	}
	if p, _ := gpus.Health(slots[5]); p != "XID 79 error" {
		t.Errorf("GPU 5 later: %q", p)
	}
	// A fake that leaves a reading unset is a GPU that does not support it.
	bare := dgxa100.New()
	bareSlots, bareGPUs := DiscoverSlotsWith(bare, 1, nil)
	defer bareGPUs.Close()
	if p, _ := bareGPUs.Health(bareSlots[0]); p != "" {
		t.Errorf("a GPU without health readings: %q", p)
	}
}

// Each slot pins its rank by the GPU's UUID, the name CUDA and NVML share,
// not by an index that CUDA may number in another order.
func TestSlotsPinTheirGPUByUUID(t *testing.T) {
	f := dgxa100.New()
	slots, gpus := DiscoverSlotsWith(f, 1, nil)
	defer gpus.Close()
	seen := map[string]bool{}
	for i, s := range slots {
		uuid, _ := f.Devices[i].GetUUID()
		if uuid == "" || s.Device != uuid || seen[s.Device] {
			t.Errorf("slot %d: CUDA_VISIBLE_DEVICES %q; want its GPU's UUID %q, once", i, s.Device, uuid)
		}
		seen[s.Device] = true
	}
	if visibleDevice(3, "") != "3" {
		t.Errorf("a GPU without a UUID: %q; want its index", visibleDevice(3, ""))
	}
}
