package activities

import (
	"fmt"

	"go.uber.org/zap"
)

// DeviceHealth says whether a GPU slot may train: "" if healthy, else what
// is wrong, and whether it lasts until the GPU is reset (an XID error,
// uncorrectable ECC errors, pages or rows waiting to be retired or remapped)
// or may pass (thermal or power throttling). gpuworker's NVML reader
// implements it beside DeviceStats.
type DeviceHealth interface {
	Health(slot Slot) (problem string, lasting bool)
}

// withdrawn is a slot taken out of service, and why.
type withdrawn struct {
	reason  string
	lasting bool
}

// checkHealth withdraws each slot whose GPU is unhealthy now, and brings
// back a slot withdrawn for a passing reason that has passed. It is asked
// before slots are offered (HoldSlot) and before every epoch (RunEpoch).
func (a *Agent) checkHealth(slots []Slot) {
	h, ok := a.Devices.(DeviceHealth)
	if !ok {
		return
	}
	for _, s := range slots {
		if s.GPU == "" {
			continue
		}
		problem, lasting := h.Health(s)
		if a.slots.setHealth(s.Index, problem, lasting) {
			if problem != "" {
				a.Log.Warn("GPU withdrawn", zap.Int("slot", s.Index), zap.String("gpu", s.GPU), zap.String("reason", problem), zap.Bool("until_reset", lasting))
			} else {
				a.Log.Info("GPU back in service", zap.Int("slot", s.Index), zap.String("gpu", s.GPU))
			}
		}
	}
}

// slotAt is the worker's slot of an index.
func (a *Agent) slotAt(index int) (Slot, bool) {
	for _, s := range a.Slots {
		if s.Index == index {
			return s, true
		}
	}
	return Slot{}, false
}

// slotProblem is why a slot is out of service, or "".
func (a *Agent) slotProblem(index int) string {
	a.slots.mu.Lock()
	defer a.slots.mu.Unlock()
	if w, ok := a.slots.out[index]; ok {
		return w.reason
	}
	return ""
}

// setHealth records a slot's health; it says whether the slot went out of
// service or came back. A lasting problem is never cleared.
func (t *slotTable) setHealth(i int, problem string, lasting bool) (changed bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w, out := t.out[i]
	switch {
	case problem != "" && (!out || w.reason != problem && !w.lasting):
		t.out[i] = withdrawn{reason: problem, lasting: lasting}
		changed = !out
	case problem == "" && out && !w.lasting:
		delete(t.out, i)
		changed = true
	}
	if changed {
		t.notify()
	}
	return changed
}

// healthError is an epoch that did not start because its slot's GPU is
// unhealthy: an infrastructure failure, which the run retries elsewhere
// and records, with the reason, in its incidents.
func healthError(s Slot, reason string) error {
	return fmt.Errorf("GPU %s of slot %d withdrawn from service: %s", s.GPU, s.Index, reason)
}
