package activities

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
)

// TestResultsMergeTheMovedRows: rows a big search moved out in parts come
// back in the CSV, every trial once and in trial order; a part that is not
// the search's own is refused, naming it.
func TestResultsMergeTheMovedRows(t *testing.T) {
	dir := t.TempDir()
	url := "file://" + dir
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
