package activities

import (
	"context"
	"slices"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
)

// heartbeat records the activity's latest details at a steady pace for as long
// as it runs (loading, joining, training, checkpointing), so the workflow
// notices a dead worker within the heartbeat timeout and a cancel reaches us.
type heartbeat struct {
	mu      sync.Mutex
	details map[string]any
	gpu     func() (GPUStats, bool) // nil on a CPU slot
	each    []func()                // run at every beat (onBeat)
	done    chan struct{}
}

// startHeartbeat beats until stop; gpu, if set, adds the GPU's load to every beat.
func startHeartbeat(ctx context.Context, gpu func() (GPUStats, bool)) *heartbeat {
	h := &heartbeat{done: make(chan struct{}), gpu: gpu}
	go func() {
		t := time.NewTicker(heartbeatInterval(ctx))
		defer t.Stop()
		for {
			select {
			case <-h.done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				h.mu.Lock()
				each := h.each
				h.mu.Unlock()
				for _, f := range each {
					f()
				}
				activity.RecordHeartbeat(ctx, h.snapshot())
			}
		}
	}()
	return h
}

// onBeat runs f at every beat from now on, until the heartbeat stops.
func (h *heartbeat) onBeat(f func()) {
	h.mu.Lock()
	h.each = append(slices.Clip(h.each), f)
	h.mu.Unlock()
}

func (h *heartbeat) set(d map[string]any) {
	h.mu.Lock()
	h.details = d
	h.mu.Unlock()
}

// snapshot is the latest details with the GPU's current load added.
func (h *heartbeat) snapshot() map[string]any {
	h.mu.Lock()
	d := make(map[string]any, len(h.details)+3)
	for k, v := range h.details {
		d[k] = v
	}
	h.mu.Unlock()
	if h.gpu != nil {
		if g, ok := h.gpu(); ok {
			d["gpu_utilization_percent"], d["gpu_memory_used_bytes"], d["gpu_memory_total_bytes"] = g.UtilizationPercent, g.MemoryUsedBytes, g.MemoryTotalBytes
		}
	}
	return d
}

func (h *heartbeat) stop() { close(h.done) }

// heartbeatInterval is a third of the heartbeat timeout, at least 100ms.
func heartbeatInterval(ctx context.Context) time.Duration {
	t := activity.GetInfo(ctx).HeartbeatTimeout
	if t <= 0 {
		return time.Second
	}
	return max(100*time.Millisecond, t/3)
}
