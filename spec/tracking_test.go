package spec

import (
	"encoding/json"
	"strings"
	"testing"
)

// Every mlflow field that is wrong is refused by name, saying what would do.
func TestMLflowSectionNamesTheFieldAndWhatIsAccepted(t *testing.T) {
	for _, c := range []struct{ raw, want string }{
		{`{"mlflow": {}}`, "mlflow.tracking_uri is missing; want the http:// or https:// URL"},
		{`{"mlflow": {"tracking_uri": "file:///tmp/mlruns"}}`, "a file store"},
		{`{"mlflow": {"tracking_uri": "databricks"}}`, "mlflow.tracking_uri"},
		{`{"mlflow": {"tracking_uri": "http://me:secret@mlflow:5000"}}`, "MLFLOW_TRACKING_TOKEN"},
		{`{"mlflow": {"tracking_uri": "http://:5000"}}`, "names no host"},
		{`{"mlflow": {"tracking_uri": "http://mlflow:5000/?x=1"}}`, "no query or fragment"},
		{`{"mlflow": {"tracking_uri": "http://mlflow:5000/#top"}}`, "no query or fragment"},
		{`{"mlflow": {"tracking_uri": "http://m/` + strings.Repeat("a", 2100) + `"}}`, "want at most 2048"},
		{`{"mlflow": {"tracking_uri": "http://m", "experiment_name": "a\nb"}}`, "mlflow.experiment_name"},
		{`{"mlflow": {"tracking_uri": "http://m", "experiment_name": "` + strings.Repeat("e", 501) + `"}}`, "at most 500 characters"},
		{`{"mlflow": {"tracking_uri": "http://m", "tags": {"": "x"}}}`, "mlflow.tags has the key"},
		{`{"mlflow": {"tracking_uri": "http://m", "tags": {"owner@team": "x"}}}`, `MLflow takes letters, digits, _ - . : space and /, with no empty, . or .. part (such as "owner_team")`},
		{`{"mlflow": {"tracking_uri": "http://m", "tags": {"durabletrain.state": "x"}}}`, `mlflow.tags["durabletrain.state"]: tags beginning "durabletrain."`},
		{`{"mlflow": {"tracking_uri": "http://m", "tags": {"k": "` + strings.Repeat("v", 5001) + `"}}}`, "want at most 5000"},
		{`{"mlflow": {"tracking_uri": "http://m", "token": "x"}}`, "token"},
		{`{"mlflow": {"tracking_uri": "http://m", "config_prefix": "a@b"}}`, "mlflow.config_prefix"},
		{`{"mlflow": {"tracking_uri": "http://m", "params": {"big": "` + strings.Repeat("p", 9000) + `"}}}`, "mlflow.params is 9010 bytes of JSON; want at most 8192"},
	} {
		s, err := Parse([]byte(c.raw))
		if err == nil {
			err = s.WithDefaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.100s: %v; want an error with %q", c.raw, err, c.want)
		}
	}
	tags := map[string]string{}
	for i := range 101 {
		tags[strings.Repeat("k", i+1)] = "v"
	}
	s := Training{MLflow: &MLflow{TrackingURI: "http://m", Tags: tags}}.WithDefaults()
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "mlflow.tags has 101 tags; want at most 100") {
		t.Errorf("101 tags: %v", err)
	}
}

func TestMLflowSectionDefaultsItsExperiment(t *testing.T) {
	s, err := Parse([]byte(`{"mlflow": {"tracking_uri": "https://mlflow.internal:5000/prefix", "tags": {"team": "vision"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.MLflow.ExperimentName != DefaultExperiment || s.MLflow.Tags["team"] != "vision" {
		t.Fatalf("%+v", s.MLflow)
	}
	if none := (Training{}).WithDefaults(); none.MLflow != nil {
		t.Fatalf("a spec without mlflow got %+v", none.MLflow)
	}
}

// Params are Ray's flattened config ("/" between levels, strings as
// themselves, lists and numbers as JSON), the native trainer's hyper and
// model sections, and the gang's size; sorted, and cut to MLflow's limits.
func TestParamsFlattenTheConfigAsRayDoes(t *testing.T) {
	cfg := map[string]json.RawMessage{
		"lr":     json.RawMessage(`0.01`),
		"opt":    json.RawMessage(`{"name": "adam", "betas": [0.9, 0.99], "sched": {"warmup": 5}}`),
		"model":  json.RawMessage(`"resnet18"`),
		"long":   json.RawMessage(`"` + strings.Repeat("x", 7000) + `"`),
		"empty":  json.RawMessage(`{}`),
		"on":     json.RawMessage(`true`),
		"nested": json.RawMessage(`null`),
	}
	s := Training{Trainer: TrainerExec, Config: cfg, Scaling: Scaling{Workers: 3}}
	got := map[string]string{}
	var keys []string
	for _, kv := range s.Params() {
		got[kv.Key] = kv.Value
		keys = append(keys, kv.Key)
	}
	want := map[string]string{"lr": "0.01", "opt/name": "adam", "opt/betas": "[0.9, 0.99]", "opt/sched/warmup": "5",
		"model": "resnet18", "empty": "{}", "on": "true", "nested": "null", "num_workers": "3"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("param %s is %q; want %q", k, got[k], v)
		}
	}
	if len(got["long"]) != 6000 {
		t.Errorf("a 7000-byte value is logged as %d bytes; want 6000", len(got["long"]))
	}
	if len(got) != len(want)+1 {
		t.Errorf("params %v", keys)
	}
	for i := 1; i < len(keys); i++ {
		if keys[i-1] >= keys[i] {
			t.Fatalf("params not sorted: %v", keys)
		}
	}
	native := Training{Trainer: TrainerNative, Hyper: Hyper{Epochs: 4, BatchSize: 32, LR: 0.001, Optimizer: "adam"}, Model: Model{Hidden: []int{64, 32}}, Scaling: Scaling{Workers: 2}}
	p := map[string]string{}
	for _, kv := range native.Params() {
		p[kv.Key] = kv.Value
	}
	if p["hyper/epochs"] != "4" || p["hyper/lr"] != "0.001" || p["hyper/optimizer"] != "adam" || p["model/hidden"] != "[64,32]" || p["num_workers"] != "2" {
		t.Fatalf("native params %v", p)
	}
}

// A Python trainer's train_loop_config travels pickled: the driver gives
// it as mlflow.params; a trial's config keys are logged under the prefix,
// and win over the params.
func TestParamsOfAPythonTrainersTrial(t *testing.T) {
	s := Training{Trainer: TrainerExec, Scaling: Scaling{Workers: 2},
		Config: map[string]json.RawMessage{"lr": json.RawMessage(`0.1`)},
		MLflow: &MLflow{TrackingURI: "http://m", ConfigPrefix: "train_loop_config",
			Params: map[string]json.RawMessage{"train_loop_config": json.RawMessage(`{"lr": 0.5, "epochs": 3}`)}}}
	got := map[string]string{}
	for _, kv := range s.Params() {
		got[kv.Key] = kv.Value
	}
	if len(got) != 3 || got["train_loop_config/lr"] != "0.1" || got["train_loop_config/epochs"] != "3" || got["num_workers"] != "2" {
		t.Fatalf("params %v", got)
	}
}

func TestMLflowStatusAndCheckpointLocation(t *testing.T) {
	for state, want := range map[string]string{StateCompleted: "FINISHED", StateStopped: "FINISHED", StateCancelled: "KILLED", StateFailed: "FAILED"} {
		if got := MLflowStatus(state); got != want {
			t.Errorf("%s: %s; want %s", state, got, want)
		}
	}
	ref := CheckpointRef{URL: "s3://bucket/ckpt/?endpoint=http://minio:9000&region=x", Run: "wf-1", ID: "e3"}
	if got := ref.Location(); got != "s3://bucket/ckpt/wf-1/e3" {
		t.Fatalf("location %s", got)
	}
}

// A name MLflow would refuse (and so lose the whole batch) is made one it
// takes; one it takes is left as it is.
func TestMLflowNameIsOneMLflowTakes(t *testing.T) {
	for in, want := range map[string]string{
		"loss": "loss", "val/acc": "val/acc", "top-1 acc: train.v2": "top-1 acc: train.v2", "Genauigkeit_ä": "Genauigkeit_ä",
		"acc@1": "acc_1", "a\nb": "a_b", "/abs": "_/abs", "a//b": "a/_/b", "a/../b": "a/__/b", ".": "_", "": "_", "trail/": "trail/_",
	} {
		if got := MLflowName(in); got != want {
			t.Errorf("MLflowName(%q) = %q; want %q", in, got, want)
		}
	}
	if got := MLflowName(strings.Repeat("k", 300)); len(got) != 250 {
		t.Errorf("a 300-byte name is %d bytes", len(got))
	}
}
