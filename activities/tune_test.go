package activities

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
)

// TestResultsMergeTheMovedRows: rows a big search moved out in parts come
// back in the CSV, every trial once and in trial order; a part that is not
// the search's own is refused, naming it.
func TestResultsMergeTheMovedRows(t *testing.T) {
	dir := t.TempDir()
	url := bloburl.FromPath(dir)
	r := Results{Policy: policy.Policy{StorageRoots: []string{url + "/"}}}
	v := func(f float64) *float64 { return &f }
	var keys []string
	for part, rows := range [][]spec.TrialStatus{
		{{Trial: 3, Status: spec.TrialCompleted, Last: v(0.5)}, {Trial: 0, Status: spec.TrialEarlyStop, Last: v(0.1)}},
		{{Trial: 1, Status: spec.TrialFailed, Reason: "a, \"quoted\"\nreason"}},
	} {
		key, err := r.WriteTuneRows(t.Context(), spec.WriteTuneRowsInput{URL: url, Name: "big", Part: part, Rows: rows})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	res := &spec.TuneResults{Name: "big", Metric: "test_accuracy", Parts: keys,
		Trials: []spec.TrialStatus{{Trial: 2, Status: spec.TrialCompleted, Last: v(0.9)}, {Trial: 4, Status: spec.TrialRunning}}}
	if _, err := r.WriteTuneResults(t.Context(), spec.WriteTuneResultsInput{URL: url, Name: "big", Results: res}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(dir, "big", "results.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	var trials []string
	for _, row := range rows[1:] {
		trials = append(trials, row[0])
	}
	if strings.Join(trials, ",") != "0,1,2,3,4" || !strings.Contains(rows[2][len(rows[2])-1], "quoted") {
		t.Fatalf("CSV trials %v (rows %q); want 0 to 4 once each, in order", trials, rows)
	}
	res.Parts = []string{"other/trials/part-00000.jsonl"}
	if _, err := r.WriteTuneResults(t.Context(), spec.WriteTuneResultsInput{URL: url, Name: "big", Results: res}); err == nil || !strings.Contains(err.Error(), "other/trials") {
		t.Fatalf("a part of another search: %v; want refused naming it", err)
	}
	if _, err := r.WriteTuneRows(t.Context(), spec.WriteTuneRowsInput{URL: "file:///etc", Name: "big", Rows: nil}); err == nil {
		t.Fatal("rows written outside the storage roots")
	}
}

// TestResultsCSVHasTheScoreColumnUnderAScope: a search ranked by another
// scope than "last" gets that score as a column of its own.
func TestResultsCSVHasTheScoreColumnUnderAScope(t *testing.T) {
	v := func(f float64) *float64 { return &f }
	for _, c := range []struct{ scope, head, row string }{
		{"", "trial,workflow_id,status,epochs,last_test_accuracy,best_test_accuracy,checkpoint,reason", "0,t-0,completed,3,0.8,0.9,,"},
		{spec.ScopeAvg, "trial,workflow_id,status,epochs,last_test_accuracy,best_test_accuracy,avg_test_accuracy,checkpoint,reason", "0,t-0,completed,3,0.8,0.9,0.75,,"},
	} {
		var b strings.Builder
		res := &spec.TuneResults{Metric: "test_accuracy", Scope: c.scope,
			Trials: []spec.TrialStatus{{Trial: 0, WorkflowID: "t-0", Status: spec.TrialCompleted, Epochs: 3, Last: v(0.8), Best: v(0.9), Score: v(0.75)}}}
		if err := writeCSV(&b, res); err != nil {
			t.Fatal(err)
		}
		if got := strings.Split(strings.TrimSpace(b.String()), "\n"); len(got) != 2 || got[0] != c.head || got[1] != c.row {
			t.Errorf("scope %q: CSV %q; want %q and %q", c.scope, got, c.head, c.row)
		}
	}
}

// CloneCheckpoint copies the donor's reported checkpoint, or its newest
// verified one once that is gone; with a pool key it clones only what the
// pool signed and signs the clone; storage outside the roots is refused.
func TestCloneCheckpointClonesOnlyVerifiedSignedCheckpoints(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	url := bloburl.FromPath(dir) + "?metadata=skip"
	key := []byte(strings.Repeat("p", 32))
	store, err := checkpoint.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	store.Sign(key)
	for epoch := 1; epoch <= 2; epoch++ {
		w, _ := store.Begin(ctx, "donor", epoch, 0)
		o, _ := w.Create(ctx, "state.bin")
		o.Write([]byte(fmt.Sprintf("weights after epoch %d", epoch)))
		o.Close()
		if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
			t.Fatal(err)
		}
	}
	r := Results{Policy: policy.Policy{StorageRoots: []string{bloburl.FromPath(dir) + "/"}}, PoolKey: key}
	out, err := r.CloneCheckpoint(ctx, spec.CloneCheckpointInput{From: spec.CheckpointRef{URL: url, Run: "donor", ID: checkpoint.ID(1, 0)}, URL: url, Run: "trial-2-p1-clone"})
	if err != nil {
		t.Fatal(err)
	}
	if out.Source.ID != checkpoint.ID(1, 0) || out.Clone.Run != "trial-2-p1-clone" || out.Clone.Epoch != 1 {
		t.Fatalf("cloned %+v", out)
	}
	c, err := store.LatestVerified(ctx, "trial-2-p1-clone") // verifies the signature too
	if err != nil || c.Manifest.Signature == "" {
		t.Fatalf("the clone: %v", err)
	}
	// The reported checkpoint was pruned: the newest verified one is cloned.
	os.RemoveAll(filepath.Join(dir, "donor", checkpoint.ID(1, 0)))
	out, err = r.CloneCheckpoint(ctx, spec.CloneCheckpointInput{From: spec.CheckpointRef{URL: url, Run: "donor", ID: checkpoint.ID(1, 0)}, URL: url, Run: "trial-3-p1-clone"})
	if err != nil || out.Source.ID != checkpoint.ID(2, 0) {
		t.Fatalf("after the prune: %+v, %v", out, err)
	}
	// ...but never one that leaves the trial no epochs to train: a trial of
	// 2 epochs cannot go on from the donor's epoch-2 checkpoint, and the
	// clone fails (the trial goes on from its own), naming why.
	_, err = r.CloneCheckpoint(ctx, spec.CloneCheckpointInput{From: spec.CheckpointRef{URL: url, Run: "donor", ID: checkpoint.ID(1, 0)}, URL: url, Run: "trial-4-p1-clone", Before: 2})
	if err == nil || !strings.Contains(err.Error(), "before epoch 2") {
		t.Fatalf("a fallback past the trial's epochs: %v", err)
	}
	out, err = r.CloneCheckpoint(ctx, spec.CloneCheckpointInput{From: spec.CheckpointRef{URL: url, Run: "donor", ID: checkpoint.ID(1, 0)}, URL: url, Run: "trial-5-p1-clone", Before: 3})
	if err != nil || out.Source.ID != checkpoint.ID(2, 0) {
		t.Fatalf("a fallback within the trial's epochs: %+v, %v", out, err)
	}
	// A checkpoint the pool did not sign is not laundered into a signed clone.
	plain, _ := checkpoint.Open(ctx, url, nil)
	defer plain.Close()
	w, _ := plain.Begin(ctx, "forged", 5, 0)
	o, _ := w.Create(ctx, "state.bin")
	o.Write([]byte("not the pool's"))
	o.Close()
	w.Commit(ctx, checkpoint.Info{WorldSize: 1})
	if _, err := r.CloneCheckpoint(ctx, spec.CloneCheckpointInput{From: spec.CheckpointRef{URL: url, Run: "forged", ID: checkpoint.ID(5, 0)}, URL: url, Run: "trial-4-p1-clone"}); err == nil || !strings.Contains(err.Error(), "not signed") {
		t.Fatalf("cloning an unsigned checkpoint: %v", err)
	}
	if _, err := store.LatestVerified(ctx, "trial-4-p1-clone"); err == nil {
		t.Fatal("an unsigned checkpoint was cloned")
	}
	// Storage outside the worker's roots is refused, naming the field.
	if _, err := r.CloneCheckpoint(ctx, spec.CloneCheckpointInput{From: spec.CheckpointRef{URL: "file:///etc?metadata=skip", Run: "donor", ID: checkpoint.ID(2, 0)}, URL: url, Run: "x"}); err == nil || !strings.Contains(err.Error(), "checkpoint.url") {
		t.Fatalf("a source outside the roots: %v", err)
	}
}
