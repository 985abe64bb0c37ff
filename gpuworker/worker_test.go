package gpuworker

import (
	"testing"

	"go.uber.org/zap"
)

func TestAdvertise(t *testing.T) {
	for bound, want := range map[string]string{"[::]:7070": "127.0.0.1:7070", "0.0.0.0:7070": "127.0.0.1:7070", "10.1.2.3:7070": "10.1.2.3:7070"} {
		if got := advertise("", bound); got != want {
			t.Errorf("advertise(%q) = %q, want %q", bound, got, want)
		}
	}
	if got := advertise("gpu-7:9000", "[::]:7070"); got != "gpu-7:9000" {
		t.Errorf("configured address ignored: %q", got)
	}
}

// Without a GPU (as in CI), NVML is absent and the worker offers CPU slots.
func TestDiscoverSlotsFallsBackToCPU(t *testing.T) {
	slots := DiscoverSlots(3, zap.NewNop())
	if len(slots) == 0 {
		t.Fatal("no slots")
	}
	if slots[0].GPU == "" && len(slots) != 3 {
		t.Fatalf("%d CPU slots, want 3", len(slots))
	}
}
