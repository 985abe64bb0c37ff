package activities

import (
	"strings"
	"sync"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// fakeGPUs is a worker's GPUs as the health gate sees them.
type fakeGPUs struct {
	mu       sync.Mutex
	problems map[int]string
	lasting  map[int]bool
}

func (f *fakeGPUs) Stats(Slot) (GPUStats, bool) { return GPUStats{}, false }
func (f *fakeGPUs) Health(s Slot) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.problems[s.Index], f.lasting[s.Index]
}
func (f *fakeGPUs) set(i int, problem string, lasting bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.problems[i], f.lasting[i] = problem, lasting
}

// An unhealthy GPU is never offered: a hold takes only healthy slots, the
// free count drops, a passing problem's slot comes back once it passes, a
// lasting one's never does; and an epoch on a slot that fell ill is refused
// as an infrastructure failure naming the GPU and the reason.
func TestUnhealthyGPUsAreWithdrawn(t *testing.T) {
	gpus := &fakeGPUs{problems: map[int]string{}, lasting: map[int]bool{}}
	var free []int
	a := &Agent{Identity: "w", Devices: gpus, Policy: testPolicy(),
		Slots:        []Slot{{Index: 0, GPU: "A100 GPU-0", Device: "0"}, {Index: 1, GPU: "A100 GPU-1", Device: "1"}, {Index: 2, GPU: "A100 GPU-2", Device: "2"}},
		SlotsChanged: func(f, _, _ int) { free = append(free, f) }}
	a.init()
	gpus.set(0, "XID 79 error", true)
	gpus.set(1, "clocks throttled: hardware thermal slowdown", false)
	a.checkHealth(a.Slots)
	if got := free[len(free)-1]; got != 1 {
		t.Fatalf("%d slots free; want 1 (two withdrawn)", got)
	}
	if _, ok := a.slots.take(2); ok {
		t.Fatal("two slots taken with one healthy")
	}
	got, ok := a.slots.take(1)
	if !ok || got[0].Index != 2 {
		t.Fatalf("took %v; want slot 2", got)
	}
	a.slots.free(2)
	gpus.set(1, "", false) // cooled down
	gpus.set(0, "", false) // NVML no longer says, but an XID lasts until a reset
	a.checkHealth(a.Slots)
	if a.slotProblem(1) != "" || a.slotProblem(0) != "XID 79 error" {
		t.Fatalf("after: slot 0 %q, slot 1 %q", a.slotProblem(0), a.slotProblem(1))
	}

	// A slot that falls ill between epochs.
	agents, peers := newAgents(t, 1)
	b := agents[0]
	b.Slots = []Slot{{Index: 0, GPU: "A100 GPU-7", Device: "7"}}
	b.Devices = gpus
	gpus.set(0, "3 volatile uncorrectable ECC errors", true)
	s := spec.Training{Model: spec.Model{Hidden: []int{16}}, Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()}, Hyper: spec.Hyper{Epochs: 1},
		Checkpoint: spec.Checkpoint{URL: "mem://"}}.WithDefaults()
	_, errs := runEpochOnAll(t, agents, spec.EpochInput{Run: "r", Generation: 1, Peers: peers[:1], Secret: []byte("0123456789abcdef"), Spec: s})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "GPU A100 GPU-7 of slot 0 withdrawn from service: 3 volatile uncorrectable ECC errors") {
		t.Fatalf("an epoch on an ill GPU: %v", errs[0])
	}
	if strings.Contains(errs[0].Error(), spec.ErrUser) {
		t.Fatalf("an ill GPU is the infrastructure's failure, not the user's: %v", errs[0])
	}
}
