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
