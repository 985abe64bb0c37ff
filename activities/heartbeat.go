package activities

import (
	"context"
	"sync"
	"time"

	"go.temporal.io/sdk/activity"
)

// heartbeat records the activity's latest details at a steady pace for as long
// as it runs (loading, joining, training, checkpointing), so the workflow
// notices a dead worker within the heartbeat timeout and a cancel reaches us.
type heartbeat struct {
	mu      sync.Mutex
	details any
	done    chan struct{}
}

func startHeartbeat(ctx context.Context) *heartbeat {
	h := &heartbeat{done: make(chan struct{})}
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
				d := h.details
				h.mu.Unlock()
				activity.RecordHeartbeat(ctx, d)
			}
		}
	}()
	return h
}

func (h *heartbeat) set(d any) {
	h.mu.Lock()
	h.details = d
	h.mu.Unlock()
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
