package spec

import (
	"encoding/json"
	"strings"
	"testing"
)

// The native trainer reads its hyperparameters from config as well: a key
// it reads sets its field (over the field's own value), so one search's
// "config.lr" tunes either backend.
func TestNativeTrainerReadsItsConfig(t *testing.T) {
	s, err := Parse([]byte(`{"hyper": {"lr": 0.5, "epochs": 2}, "config": {"lr": 0.003, "hidden": [64], "batch_size": 32, "optimizer": "sgd", "momentum": 0, "seed": 18446744073709551615}}`))
	if err != nil {
		t.Fatal(err)
	}
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	h := s.Hyper
	if h.LR != 0.003 || h.BatchSize != 32 || h.Optimizer != "sgd" || h.MomentumOf() != 0 || h.Seed != 1<<64-1 || len(s.Model.Hidden) != 1 || s.Model.Hidden[0] != 64 || h.Epochs != 2 {
		t.Fatalf("hyper %+v, hidden %v", h, s.Model.Hidden)
	}
	if again := s.WithDefaults(); again.Hyper.LR != 0.003 {
		t.Fatalf("defaults twice: lr %v", again.Hyper.LR)
	}
	// A copy's defaults leave the original's model.hidden as it was.
	orig := Training{Model: Model{Hidden: []int{64, 32}}, Config: Config{"hidden": json.RawMessage(`[16]`)}}
	if got := orig.WithDefaults().Model.Hidden; len(got) != 1 || got[0] != 16 || orig.Model.Hidden[0] != 64 {
		t.Fatalf("defaults %v; the original's model.hidden became %v", got, orig.Model.Hidden)
	}
}

func TestConfigErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{`{"config": {"dropout": 0.1}}`, "config.dropout: the native trainer reads only batch_size, hidden, lr, momentum, optimizer, seed, weight_decay from config"},
		{`{"config": {"lr": "fast"}}`, `config.lr is "fast"; want a number (it sets hyper.lr)`},
		{`{"config": {"lr": null}}`, `config.lr is null; want a number`},
		{`{"config": {"hidden": 64}}`, `config.hidden is 64; want a list of layer widths, such as [256, 128] (it sets model.hidden)`},
		{`{"config": {"batch_size": 3.5}}`, `config.batch_size is 3.5; want an integer`},
		{`{"config": {"lr": 12}}`, "config.lr sets hyper.lr: hyper.lr is 12; want a number in (0, 10)"},
		{`{"config": {"hidden": [64, 0]}}`, "config.hidden sets model.hidden: model.hidden[1] is 0"},
		{`{"trainer": "exec", "exec": {"command": ["x"]}, "config": {"a.b": 1}}`, `config has the key "a.b"; want 1-64 letters, digits, _ or -`},
		{`{"trainer": "exec", "exec": {"command": ["x"]}, "config": {"` + strings.Repeat("k", 65) + `": 1}}`, "config has the key"},
	} {
		s, err := Parse([]byte(tc.spec))
		if err == nil {
			s = s.WithDefaults()
			err = s.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%.80s: got %v, want an error containing %q", tc.spec, err, tc.want)
		}
	}
	big := Training{Trainer: TrainerExec, Exec: &Exec{Command: []string{"x"}}, Config: Config{"blob": []byte(`"` + strings.Repeat("x", MaxConfigBytes) + `"`)}}
	if err := big.WithDefaults().Validate(); err == nil || !strings.Contains(err.Error(), "want at most 8192 (it reaches every rank in an environment variable)") {
		t.Errorf("a config too big: %v", err)
	}
	// An exec program's config is its own: any keys, any JSON values.
	s, err := Parse([]byte(`{"trainer": "exec", "exec": {"command": ["x"]}, "config": {"dropout": 0.1, "lr": "fast", "layers": {"a": [1, 2]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	if got := s.Config.JSON(); got != `{"dropout":0.1,"layers":{"a":[1,2]},"lr":"fast"}` {
		t.Fatalf("config as JSON: %s", got)
	}
	if s.WithDefaults().Hyper.LR != 1e-3 {
		t.Fatal("an exec run's config set hyper.lr")
	}
}

// A run reports any metric: the three every backend may report, and any
// other by name; one it did not report has no value, and an error that
// needs it lists what it did report.
func TestAnyMetric(t *testing.T) {
	m := EpochMetrics{Epoch: 2, TrainLoss: 0.4, TestAccuracy: 0.9, Other: map[string]float64{"f1": 0.7, "samples": 1000}, Absent: []string{MetricTestLoss}}
	if v, ok := m.Value("f1"); !ok || v != 0.7 {
		t.Fatalf("f1: %v %v", v, ok)
	}
	if _, ok := m.Value(MetricTestLoss); ok {
		t.Fatal("an absent test_loss has a value")
	}
	if got := strings.Join(m.Names(), ","); got != "f1,samples,test_accuracy,train_loss" {
		t.Fatalf("names %s", got)
	}
	err := m.MissingMetric("checkpoint.score", "recall")
	if err == nil || err.Error() != `checkpoint.score is "recall", but the run's epoch 2 reported only f1, samples, test_accuracy, train_loss; want one of them (or report "recall")` {
		t.Fatalf("got %v", err)
	}
	if (EpochMetrics{}).MissingMetric("metric", MetricTestLoss) != nil {
		t.Fatal("a native epoch's test_loss is missing")
	}
	for name, ok := range map[string]bool{"f1": true, "val/acc": true, "eval/loss": true, "/acc": false, "val.acc": true, "bleu-4": true, "": false, "4x": false, strings.Repeat("m", 65): false} {
		if err := CheckMetricName("metric", name); (err == nil) != ok {
			t.Errorf("%q: %v", name, err)
		}
	}
}
