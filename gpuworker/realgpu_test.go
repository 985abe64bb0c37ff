package gpuworker

import (
	"testing"

	"go.uber.org/zap/zaptest"
)

// TestOnRealGPU runs slot discovery, the readings heartbeats carry, and
// the health gate against this machine's own GPUs through the real NVML
// (go-nvml's nvml.New). Where NVML finds no GPU it is skipped: the fakes
// of health_test.go and worker_test.go stand in for it there.
// scripts/gpu-check.sh runs it on a GPU machine.
func TestOnRealGPU(t *testing.T) {
	slots, gpus := DiscoverSlots(0, zaptest.NewLogger(t))
	if gpus == nil {
		t.Skip("no GPU: NVML found none on this machine")
	}
	defer gpus.Close()
	for _, s := range slots {
		if s.GPU == "" || s.Device == "" {
			t.Errorf("slot %d has no GPU or device: %+v", s.Index, s)
			continue
		}
		stats, ok := gpus.Stats(s)
		if !ok || stats.MemoryTotalBytes == 0 {
			t.Errorf("slot %d (%s): no readings (%+v)", s.Index, s.GPU, stats)
		}
		problem, lasting := gpus.Health(s)
		t.Logf("slot %d: %s, CUDA_VISIBLE_DEVICES=%s, utilization %d%%, memory %d of %d bytes, health %q (lasting %v)",
			s.Index, s.GPU, s.Device, stats.UtilizationPercent, stats.MemoryUsedBytes, stats.MemoryTotalBytes, problem, lasting)
		if problem != "" {
			t.Errorf("slot %d (%s) is unhealthy on a machine lent as healthy: %s", s.Index, s.GPU, problem)
		}
	}
}
