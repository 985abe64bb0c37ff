package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
)

// Each fault's cost comes from the restore of the gang formed after it;
// a fault whose new gang the next fault broke before its first epoch
// ended (so its restore was never recorded) stays blank instead of
// taking the next fault's restore.
func TestCostsTakeOnlyTheirOwnGangsRestore(t *testing.T) {
	at := func(e, s int) *spec.Position { return &spec.Position{Epoch: e, Step: s} }
	p := &spec.Progress{
		Metrics: []spec.EpochMetrics{{Steps: 100}},
		Incidents: []spec.Incident{
			{Generation: 2, Kind: spec.IncidentRestored, Restore: &spec.RestoreReport{Peer: &spec.PeerRestore{Epoch: 1, Step: 40}, SurvivorsAt: at(1, 40)}},
			{Generation: 5, Kind: spec.IncidentRestored, Restore: &spec.RestoreReport{From: spec.CheckpointRef{ID: "ckpt", Epoch: 2, Step: 0}, Bytes: 1 << 20, SurvivorsAt: at(2, 30)}},
		},
	}
	faults := []Fault{
		{Kind: "kill-9", Detected: time.Second, gen: 1, StepsLost: -1},    // gang 2 restored from a survivor
		{Kind: "sigstop", Detected: time.Second, gen: 2, StepsLost: -1},   // gang 3 broke before its first epoch ended
		{Kind: "server", gen: 3, StepsLost: -1},                           // no gang broke
		{Kind: "sigterm", Detected: time.Second, gen: 3, StepsLost: -1},   // gang 4 formed, no restore recorded either
		{Kind: "partition", Detected: time.Second, gen: 4, StepsLost: -1}, // gang 5 restored from storage
	}
	costs(faults, p)
	if f := faults[0]; f.RestoredFrom != "survivor" || f.StepsLost != 0 || f.BlobBytes != 0 {
		t.Fatalf("the first fault: %+v", f)
	}
	for _, f := range faults[1:4] {
		if f.RestoredFrom != "" || f.StepsLost != -1 || f.BlobBytes != 0 {
			t.Fatalf("%s took a restore that was not its gang's: %+v", f.Kind, f)
		}
	}
	if !strings.Contains(faults[1].Note, "before its restore was recorded") || !strings.Contains(faults[3].Note, "before its restore was recorded") || faults[2].Note != "" {
		t.Fatalf("notes: %q, %q, %q", faults[1].Note, faults[2].Note, faults[3].Note)
	}
	if f := faults[4]; f.RestoredFrom != "storage" || f.StepsLost != 30 || f.BlobBytes != 1<<20 {
		t.Fatalf("the last fault: %+v", f)
	}
}

// A run that counted more failures and preemptions than faults were struck
// in it broke a gang with nothing struck; fewer (a fault that struck a host
// holding no slot) is no break beyond the faults.
func TestUnexplainedCountsBreaksBeyondTheFaultsStruck(t *testing.T) {
	r := &Report{
		Faults: []Fault{{Run: "a"}, {Run: "a"}, {Run: "b"}, {Run: "b"}, {Run: "b"}},
		Runs: []RunResult{
			{ID: "a", Failures: 3, Preemptions: 1}, // 4 breaks, 2 faults
			{ID: "b", Failures: 1, Preemptions: 1}, // 2 breaks, 3 faults
			{ID: "c", Failures: 1},                 // 1 break, nothing struck
		},
	}
	if got := r.Unexplained(); got != 3 {
		t.Fatalf("Unexplained() = %d; want 2 from run a and 1 from run c", got)
	}
	r.ReferenceBreaks = 1
	if got := r.Unexplained(); got != 4 {
		t.Fatalf("Unexplained() = %d with the reference run broken once; want 4", got)
	}
	var table strings.Builder
	r.Print(&table)
	if !strings.Contains(table.String(), "| a |  | 0 | 2 | 3 | 1 |") {
		t.Fatalf("the run table does not show run a's 2 faults beside its 3 failures:\n%s", table.String())
	}
}
