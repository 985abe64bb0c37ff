package telemetry

import (
	"fmt"
	"net/http"
	"sync"
)

// Health is what a worker's /healthz and /readyz answer. Live: the process
// serves HTTP (Kubernetes restarts it when not). Ready: it has reached
// Temporal and polls its task queues; not while it connects or shuts down,
// so no new work is routed to it then.
type Health struct {
	mu     sync.Mutex
	ready  bool
	reason string
}

// NewHealth is a Health that is not ready yet, for the reason given.
func NewHealth(reason string) *Health { return &Health{reason: reason} }

// SetReady marks the worker ready.
func (h *Health) SetReady() {
	h.mu.Lock()
	h.ready, h.reason = true, ""
	h.mu.Unlock()
}

// SetNotReady marks it not ready, saying why (connecting, shutting down).
func (h *Health) SetNotReady(reason string) {
	h.mu.Lock()
	h.ready, h.reason = false, reason
	h.mu.Unlock()
}

// Ready says whether the worker is ready, and if not why.
func (h *Health) Ready() (bool, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ready, h.reason
}

func (h *Health) serveLive(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

func (h *Health) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if ok, reason := h.Ready(); !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: %s\n", reason)
		return
	}
	fmt.Fprintln(w, "ready")
}
