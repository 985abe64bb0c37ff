package tune

import (
	"encoding/json"
	"strings"
	"testing"
)

func space(t *testing.T, s string) map[string]Domain {
	t.Helper()
	var m map[string]Domain
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Grid cells are repeated num_samples times, as Ray does; random dimensions
// are drawn per trial from the seed, so the same inputs give the same trials.
func TestTrialsExpandGridTimesSamples(t *testing.T) {
	sp := space(t, `{"hyper.lr": {"loguniform": [0.0001, 0.1]}, "model.hidden": {"grid_search": [[64], [256, 128]]},
		"hyper.batch_size": {"randint": [16, 257]}, "hyper.optimizer": {"choice": ["adam", "sgd"]}}`)
	base := json.RawMessage(`{"hyper": {"epochs": 4}}`)
	trials, err := Trials(base, sp, 3, 42)
	if err != nil {
		t.Fatal(err)
	}
	if len(trials) != 6 {
		t.Fatalf("%d trials, want 2 grid cells x 3 samples", len(trials))
	}
	again, _ := Trials(base, sp, 3, 42)
	other, _ := Trials(base, sp, 3, 43)
	for i, tr := range trials {
		if tr.Spec.Hyper.Epochs != 4 {
			t.Fatalf("trial %d lost the base spec: %+v", i, tr.Spec.Hyper)
		}
		if lr := tr.Spec.Hyper.LR; lr < 0.0001 || lr >= 0.1 {
			t.Fatalf("trial %d lr %v outside [1e-4, 0.1)", i, lr)
		}
		if b := tr.Spec.Hyper.BatchSize; b < 16 || b > 256 {
			t.Fatalf("trial %d batch %d outside [16, 257)", i, b)
		}
		if want := []int{64}; i%2 == 1 {
			if len(tr.Spec.Model.Hidden) != 2 {
				t.Fatalf("trial %d hidden %v, want the second grid cell", i, tr.Spec.Model.Hidden)
			}
		} else if len(tr.Spec.Model.Hidden) != 1 || tr.Spec.Model.Hidden[0] != want[0] {
			t.Fatalf("trial %d hidden %v, want [64]", i, tr.Spec.Model.Hidden)
		}
		if string(mustJSON(tr.Config)) != string(mustJSON(again[i].Config)) {
			t.Fatalf("trial %d differs between two expansions with the same seed", i)
		}
	}
	same := 0
	for i := range trials {
		if trials[i].Spec.Hyper.LR == other[i].Spec.Hyper.LR {
			same++
		}
	}
	if same == len(trials) {
		t.Fatal("another seed drew the same learning rates")
	}
}

// "config.<key>" sets a key of the trial's config: an exec program reads
// all of it, the native trainer the keys it knows.
func TestTrialsSetConfigKeys(t *testing.T) {
	exec := json.RawMessage(`{"trainer": "exec", "exec": {"command": ["python3", "train.py"]}}`)
	trials, err := Trials(exec, space(t, `{"config.lr": {"loguniform": [1e-4, 1e-1]}, "config.hidden": {"grid_search": [[32], [256, 128]]}, "config.act": {"choice": ["relu", "gelu"]}}`), 2, 7)
	if err != nil {
		t.Fatal(err)
	}
	if len(trials) != 4 {
		t.Fatalf("%d trials", len(trials))
	}
	for _, tr := range trials {
		c := tr.Spec.Config
		var lr float64
		if json.Unmarshal(c["lr"], &lr) != nil || lr < 1e-4 || lr >= 1e-1 || len(c["hidden"]) == 0 || len(c["act"]) == 0 {
			t.Fatalf("trial %d: config %s", tr.Index, c.JSON())
		}
		if tr.Spec.WithDefaults().Hyper.LR != 1e-3 {
			t.Fatalf("trial %d: an exec trial's config.lr set hyper.lr", tr.Index)
		}
	}
	native, err := Trials(nil, space(t, `{"config.lr": {"choice": [0.02]}, "config.hidden": {"choice": [[48]]}}`), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s := native[0].Spec.WithDefaults(); s.Hyper.LR != 0.02 || len(s.Model.Hidden) != 1 || s.Model.Hidden[0] != 48 {
		t.Fatalf("native trial: lr %v hidden %v", s.Hyper.LR, s.Model.Hidden)
	}
}

func TestTrialsRejectBadPathsAndValues(t *testing.T) {
	for s, want := range map[string]string{
		`{"hyper.learning_rate": {"choice": [0.1]}}`: "learning_rate",
		`{"hyper.lr": {"choice": [20]}}`:             "hyper.lr",
		`{"config.dropout": {"choice": [0.1]}}`:      "config.dropout: the native trainer reads only",
		`{"config.lr": {"choice": [20]}}`:            "config.lr sets hyper.lr: hyper.lr is 20",
	} {
		_, err := Trials(nil, space(t, s), 1, 1)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("space %s: got %v, want an error naming %s", s, err, want)
		}
	}
	for _, s := range []string{`{"a": {"uniform": [1, 0]}}`, `{"a": {"normal": [0, 1]}}`, `{"a": {"loguniform": [0, 1]}}`, `{"a": 3}`} {
		var m map[string]Domain
		if err := json.Unmarshal([]byte(s), &m); err == nil {
			t.Errorf("space %s accepted", s)
		}
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }
