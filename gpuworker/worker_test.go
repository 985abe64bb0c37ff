package gpuworker

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestAdvertise(t *testing.T) {
	ip := hostIP()
	for bound, want := range map[string]string{"[::]:7070": ip + ":7070", "0.0.0.0:7070": ip + ":7070", ":7070": ip + ":7070", "10.1.2.3:7070": "10.1.2.3:7070"} {
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
	slots, gpus := DiscoverSlots(3, zap.NewNop())
	defer gpus.Close()
	if len(slots) == 0 {
		t.Fatal("no slots")
	}
	if slots[0].GPU == "" && (len(slots) != 3 || gpus != nil) {
		t.Fatalf("%d CPU slots and a GPU reader %v, want 3 and none", len(slots), gpus)
	}
	if slots[0].GPU != "" {
		if _, ok := gpus.Stats(slots[0]); !ok {
			t.Fatalf("NVML found %s but cannot read its load", slots[0].GPU)
		}
	}
}

func TestRunRefusesANegativeStickyTimeout(t *testing.T) {
	err := Run(context.Background(), nil, Config{Workflows: true, StickyTimeout: -time.Second})
	if err == nil || !strings.Contains(err.Error(), "-sticky-timeout") || !strings.Contains(err.Error(), "positive") {
		t.Fatalf("got %v, want an error naming the flag and what it accepts", err)
	}
}
