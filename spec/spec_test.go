package spec

import (
	"strings"
	"testing"
	"time"
)

func TestParseFillsDefaultsAndValidates(t *testing.T) {
	s, err := Parse([]byte(`{"scaling": {"workers": 2, "gang_timeout": "30s"}, "failure": {"heartbeat_timeout": 5}, "hyper": {"epochs": 3}}`))
	if err != nil {
		t.Fatal(err)
	}
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.Scaling.Workers != 2 || s.Scaling.GangTimeout != Duration(30*time.Second) || s.Failure.HeartbeatTimeout != Duration(5*time.Second) {
		t.Fatalf("parsed %+v", s)
	}
	if s.Hyper.Epochs != 3 || s.Hyper.BatchSize != 128 || s.Hyper.LR != 1e-3 || s.Scaling.TaskQueue != DefaultTaskQueue || s.Checkpoint.KeepLastN() != 2 {
		t.Fatalf("defaults %+v", s)
	}
}

// failure.stall_timeout: what a spec says, else 2s, or half the heartbeat
// timeout where that is shorter, never under a second; and the value a spec
// recorded before the field existed (0) still gets the default.
func TestStallTimeoutDefaultsFromTheHeartbeatTimeout(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want time.Duration
	}{
		{`{}`, 2 * time.Second},
		{`{"failure": {"heartbeat_timeout": "3s"}}`, 1500 * time.Millisecond},
		{`{"failure": {"heartbeat_timeout": "1s"}}`, time.Second},
		{`{"failure": {"heartbeat_timeout": "1m"}}`, 2 * time.Second},
		{`{"failure": {"heartbeat_timeout": "4s", "stall_timeout": "750ms"}}`, 750 * time.Millisecond},
		{`{"failure": {"stall_timeout": 10}}`, 10 * time.Second},
	} {
		s, err := Parse([]byte(c.raw))
		if err != nil {
			t.Fatalf("%s: %v", c.raw, err)
		}
		if got := s.Failure.RingStallTimeout(); got != c.want {
			t.Errorf("%s before defaults: %v, want %v", c.raw, got, c.want)
		}
		s = s.WithDefaults()
		if err := s.Validate(); err != nil {
			t.Fatalf("%s: %v", c.raw, err)
		}
		if got := time.Duration(s.Failure.StallTimeout); got != c.want {
			t.Errorf("%s: stall_timeout %v, want %v", c.raw, got, c.want)
		}
	}
}

func TestParseNamesUnknownFields(t *testing.T) {
	_, err := Parse([]byte(`{"model": {"hiden": [64]}}`))
	if err == nil || !strings.Contains(err.Error(), `unknown field "hiden"`) {
		t.Fatalf("got %v", err)
	}
	if _, err := Parse([]byte(`{"failure": {"heartbeat_timeout": "ten seconds"}}`)); err == nil || !strings.Contains(err.Error(), `"10s"`) {
		t.Fatalf("bad duration: %v", err)
	}
}

func TestValidateNamesFieldValueAndWhatIsAccepted(t *testing.T) {
	for _, tc := range []struct {
		edit func(*Training)
		want string
	}{
		{func(s *Training) { s.Scaling.Workers = -1 }, "scaling.workers is -1; want 1 to 8192 ranks"},
		{func(s *Training) { s.Hyper.Optimizer = "lbfgs" }, `hyper.optimizer is "lbfgs"; want "adam" or "sgd"`},
		{func(s *Training) { s.Hyper.LR = 12 }, "hyper.lr is 12; want a number in (0, 10)"},
		{func(s *Training) { s.Model.Hidden = []int{64, 0} }, "model.hidden[1] is 0"},
		{func(s *Training) { s.Checkpoint.URL = "/tmp/x" }, `checkpoint.url is "/tmp/x"; want a blob URL: file:///absolute/path`},
		{func(s *Training) { s.Checkpoint.URL = "file:///runs#2" }, `checkpoint.url is "file:///runs#2"; want no '#' (it starts a URL's fragment; write a '#' in a path as %23)`},
		{func(s *Training) { s.Dataset.URL = "file:///data#" }, `dataset.url is "file:///data#"; want no '#'`},
		{func(s *Training) { s.Checkpoint.Mode = "up" }, `checkpoint.mode is "up"`},
		{func(s *Training) { s.Failure.HeartbeatTimeout = Duration(time.Hour) }, "failure.heartbeat_timeout is 1h0m0s; want 1s to 10m"},
		{func(s *Training) { s.Name = "a/b" }, `name is "a/b"`},
		{func(s *Training) { s.Trainer = "JAX!" }, `trainer is "JAX!"; want "native", "exec", or the name of a backend registered`},
		{func(s *Training) { s.Exec = &Exec{Command: []string{"python3"}} }, `exec is set; want no exec section unless trainer is "exec"`},
		{func(s *Training) { s.Dataset.Format = "../csv" }, `dataset.format is "../csv"; want "idx", or the name of a loader`},
		{func(s *Training) { s.Checkpoint.Score = "val acc" }, `checkpoint.score is "val acc"; want a metric's name: "test_accuracy", "test_loss" or "train_loss", or one your program reports`},
		{func(s *Training) { s.Scaling.GPUsPerWorker = 2 }, "scaling.gpus_per_worker is 2"},
	} {
		s := Training{}.WithDefaults()
		tc.edit(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want an error containing %q", err, tc.want)
		}
	}
}

// checkpoint.sharded is for exec programs, checkpointing every epoch, at a
// fixed world size; anything else is refused, saying why.
func TestShardedCheckpointsNeedAFixedGangOfPrograms(t *testing.T) {
	exec := `"trainer": "exec", "exec": {"command": ["python3", "train.py"]}, `
	check := func(raw string) error {
		s, err := Parse([]byte(raw))
		if err != nil {
			return err
		}
		return s.WithDefaults().Validate()
	}
	if err := check(`{` + exec + `"scaling": {"workers": 2}, "checkpoint": {"sharded": true}}`); err != nil {
		t.Fatalf("a sharded exec run: %v", err)
	}
	if err := check(`{` + exec + `"scaling": {"workers": 2}, "checkpoint": {"sharded": true, "merge_shards": true}}`); err != nil {
		t.Fatalf("a sharded exec run restored merged: %v", err)
	}
	for _, c := range []struct{ spec, want string }{
		{`{"scaling": {"workers": 2}, "checkpoint": {"sharded": true}}`, "identical replicas"},
		{`{` + exec + `"scaling": {"workers": 2}, "checkpoint": {"sharded": true, "every_epochs": 2}}`, "every_epochs 1 (it is 2)"},
		{`{` + exec + `"scaling": {"workers": 2, "min_workers": 1}, "checkpoint": {"sharded": true}}`, "min_workers equal to scaling.workers (2, not 1)"},
		{`{` + exec + `"scaling": {"workers": 2}, "checkpoint": {"merge_shards": true}}`, "merge_shards needs checkpoint.sharded true"},
	} {
		if err := check(c.spec); err == nil || !strings.Contains(err.Error(), "checkpoint.sharded") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v; want an error naming checkpoint.sharded and %q", c.spec, err, c.want)
		}
	}
}
