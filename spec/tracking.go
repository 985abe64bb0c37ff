package spec

import (
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MLflow names the MLflow tracking server a run logs to, as Ray's
// MLflowLoggerCallback does: the run's params (its config, flattened with
// "/"), its metrics at every report (step: the report's
// training_iteration), its final checkpoint's URL and its state. Each trial
// of a search is a run of its own, tagged with the search. The server is
// reached from the workflows' workers (whose -trackers flag must allow it);
// one that is down never fails or slows the run: it is reported once, as an
// incident, and the run keeps what it has to log and tries again.
type MLflow struct {
	// TrackingURI is the server's http:// or https:// URL (`mlflow server`).
	// It travels in the run's history: credentials go to the workers
	// (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_USERNAME and _PASSWORD), never
	// in the URL.
	TrackingURI string `json:"tracking_uri"`
	// ExperimentName is the experiment the run is logged under, created if
	// missing; default "Default" (MLflow's own).
	ExperimentName string `json:"experiment_name,omitempty"`
	// Tags are set on the run as given (Ray's tags=).
	Tags map[string]string `json:"tags,omitempty"`
	// LogParamsOnTrialEnd logs the params when the run ends instead of when
	// it starts (Ray's log_params_on_trial_end).
	LogParamsOnTrialEnd bool `json:"log_params_on_trial_end,omitempty"`
	// ConfigPrefix, if set, is put before the run's config keys in its
	// params: the Python driver sets "train_loop_config", so that a
	// trainer's trial logs train_loop_config/lr, as Ray's does.
	ConfigPrefix string `json:"config_prefix,omitempty"`
	// Params are logged besides the config, flattened the same way (the
	// config wins a key both have): the Python driver puts here a
	// trainer's train_loop_config, which travels to the ranks pickled, not
	// in the spec. At most MaxTrackerParamsBytes of JSON.
	Params map[string]json.RawMessage `json:"params,omitempty"`
}

// Limits of the MLflow section: MLflow's own (a tag's key and value) and
// ours (the spec is one workflow input).
const (
	MaxTrackerTags     = 100
	MaxTrackerTagKey   = 250
	MaxTrackerTagValue = 5000
	MaxTrackerURI      = 2048
	MaxExperimentName  = 500
	// MaxTrackerParamsBytes bounds mlflow.params, as JSON.
	MaxTrackerParamsBytes = 8 << 10 // the whole spec is at most 16 KiB
)

// DefaultExperiment is MLflow's default experiment's name.
const DefaultExperiment = "Default"

// TrackerTagPrefix begins the tags durabletrain sets on a run (the run's
// workflow, its search, its state, its checkpoint); a spec may not set them.
const TrackerTagPrefix = "durabletrain."

// Tags durabletrain sets on an MLflow run.
const (
	TrackerTagRun        = "durabletrain.run"        // the run's workflow ID: how a retry finds the run it created
	TrackerTagFirstRun   = "durabletrain.first_run"  // its first execution's run ID (a workflow ID used again is another run)
	TrackerTagSearch     = "durabletrain.search"     // a trial's search's workflow ID
	TrackerTagState      = "durabletrain.state"      // the run's state when it ended (Progress.State)
	TrackerTagCheckpoint = "durabletrain.checkpoint" // its latest checkpoint: storage URL, run and ID
	TrackerTagTrialName  = "trial_name"              // Ray's tag for a trial's run
)

// check validates the section, naming the field.
func (m *MLflow) check() error {
	if m == nil {
		return nil
	}
	if err := CheckTrackingURI("mlflow.tracking_uri", m.TrackingURI); err != nil {
		return err
	}
	if len(m.ExperimentName) > MaxExperimentName || !utf8.ValidString(m.ExperimentName) || strings.ContainsAny(m.ExperimentName, "\x00\n\r") {
		return fmt.Errorf("mlflow.experiment_name is %.80q; want at most %d characters on one line", m.ExperimentName, MaxExperimentName)
	}
	if m.ConfigPrefix != "" && (len(m.ConfigPrefix) > 100 || MLflowName(m.ConfigPrefix) != m.ConfigPrefix) {
		return fmt.Errorf("mlflow.config_prefix is %.80q; want at most 100 of letters, digits, _ - . : space and /, such as \"train_loop_config\"", m.ConfigPrefix)
	}
	if m.Params != nil {
		b, _ := json.Marshal(m.Params)
		if len(b) > MaxTrackerParamsBytes {
			return fmt.Errorf("mlflow.params is %d bytes of JSON; want at most %d (MLflow keeps a param's value to 6,000 characters)", len(b), MaxTrackerParamsBytes)
		}
	}
	if len(m.Tags) > MaxTrackerTags {
		return fmt.Errorf("mlflow.tags has %d tags; want at most %d", len(m.Tags), MaxTrackerTags)
	}
	for k, v := range m.Tags {
		switch {
		case k == "" || len(k) > MaxTrackerTagKey || !utf8.ValidString(k) || strings.ContainsAny(k, "\x00\n\r"):
			return fmt.Errorf("mlflow.tags has the key %.80q; want 1 to %d characters on one line", k, MaxTrackerTagKey)
		case MLflowName(k) != k:
			return fmt.Errorf("mlflow.tags has the key %.80q; MLflow takes letters, digits, _ - . : space and /, with no empty, . or .. part (such as %q)", k, MLflowName(k))
		case strings.HasPrefix(k, TrackerTagPrefix):
			return fmt.Errorf("mlflow.tags[%q]: tags beginning %q are durabletrain's own (the run, its search, state and checkpoint); name it otherwise", k, TrackerTagPrefix)
		case len(v) > MaxTrackerTagValue || !utf8.ValidString(v):
			return fmt.Errorf("mlflow.tags[%q] is %d bytes; want at most %d of UTF-8", k, len(v), MaxTrackerTagValue)
		}
	}
	return nil
}

// CheckTrackingURI checks an MLflow tracking server's URL: http or https,
// a host, no credentials, no query or fragment.
func CheckTrackingURI(field, raw string) error {
	want := "the http:// or https:// URL of an MLflow tracking server (`mlflow server`), such as http://mlflow.internal:5000"
	if raw == "" {
		return fmt.Errorf("%s is missing; want %s", field, want)
	}
	if len(raw) > MaxTrackerURI {
		return fmt.Errorf("%s is %d bytes; want at most %d", field, len(raw), MaxTrackerURI)
	}
	u, err := url.Parse(raw)
	switch {
	case err != nil:
		return fmt.Errorf("%s is %.80q, which does not parse (%v); want %s", field, raw, err, want)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%s is %.80q; want %s (a file store, mlruns/ or databricks, is not reachable from the workers)", field, raw, want)
	case u.User != nil:
		return fmt.Errorf("%s carries credentials; the spec travels in the run's history in the clear: give the workflows' workers MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, instead", field)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("%s is %.80q, which names no host; want %s", field, raw, want)
	case u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return fmt.Errorf("%s is %.80q; want no query or fragment: %s", field, raw, want)
	}
	return nil
}

// Params is what a run logs as its MLflow params: its config flattened
// with "/" (Ray's flatten_dict: {"opt": {"lr": 0.1}} is "opt/lr"), each
// value as JSON text (a string as itself), and for the native trainer its
// hyper and model sections too. Keys and values past MLflow's limits (250
// and 6,000 characters) are cut, and sorted by key.
func (t Training) Params() []KeyValue {
	out := map[string]string{}
	prefix := ""
	if t.MLflow != nil {
		for k, raw := range t.MLflow.Params {
			flatten(out, k, raw, 0)
		}
		if t.MLflow.ConfigPrefix != "" {
			prefix = t.MLflow.ConfigPrefix + "/"
		}
	}
	for k, raw := range t.Config {
		flatten(out, prefix+k, raw, 0)
	}
	if t.Trainer == TrainerNative {
		h := t.Hyper
		out["hyper/epochs"] = strconv.Itoa(h.Epochs)
		out["hyper/batch_size"] = strconv.Itoa(h.BatchSize)
		out["hyper/lr"] = strconv.FormatFloat(h.LR, 'g', -1, 64)
		out["hyper/optimizer"] = h.Optimizer
		if len(t.Model.Hidden) > 0 {
			b, _ := json.Marshal(t.Model.Hidden)
			out["model/hidden"] = string(b)
		}
	}
	out["num_workers"] = strconv.Itoa(t.Scaling.Workers)
	keys := make([]string, 0, len(out))
	for k := range out {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	kv := make([]KeyValue, 0, len(keys))
	for _, k := range keys {
		kv = append(kv, KeyValue{Key: MLflowName(k), Value: cut(out[k], 6000)})
	}
	return kv
}

// KeyValue is one MLflow param or tag.
type KeyValue struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// flatten puts a config value's leaves into out under prefix, nested maps
// joined with "/"; lists and scalars are leaves.
func flatten(out map[string]string, prefix string, raw json.RawMessage, depth int) {
	var m map[string]json.RawMessage
	if depth < 8 && json.Unmarshal(raw, &m) == nil && m != nil && len(m) > 0 {
		for k, v := range m {
			flatten(out, prefix+"/"+k, v, depth+1)
		}
		return
	}
	var s string
	if trimmed := strings.TrimSpace(string(raw)); strings.HasPrefix(trimmed, `"`) && json.Unmarshal(raw, &s) == nil {
		out[prefix] = s
		return
	}
	out[prefix] = string(raw)
}

// MLflowName is key as MLflow takes a metric, param or tag name: letters,
// digits, _ - . : space and /, its parts between slashes neither empty
// nor "." or ".."; each other character becomes "_" (a metric a program
// reports as "acc@1" is logged as "acc_1"), and it is cut to 250 bytes.
func MLflowName(key string) string {
	b := []rune(key)
	for i, r := range b {
		if !(unicode.IsLetter(r) || unicode.IsDigit(r) || strings.ContainsRune("_-.: /", r)) {
			b[i] = '_'
		}
	}
	parts := strings.Split(string(b), "/")
	for i, p := range parts {
		switch p {
		case "", ".", "..":
			parts[i] = strings.Repeat("_", max(1, len(p)))
		}
	}
	return cut(strings.Join(parts, "/"), 250)
}

// cut shortens s to at most n bytes, on a rune boundary.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// ActivityTrackMLflow logs a run's reports to its MLflow tracking server,
// on the workflows' queue.
const ActivityTrackMLflow = "TrackMLflow"

// ErrTrackerRefused: the tracking server, or the worker's policy, refused
// what the run logs; trying again cannot help (the run stops logging).
const ErrTrackerRefused = "durabletrain.TrackerRefused"

// TrainingIterationMetric is the report's count, logged beside its metrics (Ray's).
const TrainingIterationMetric = "training_iteration"

// IncidentTracker: the run's tracking server could not be reached, or
// refused what the run logged; not charged: the run trains on.
const IncidentTracker = "tracker"

// TrackedReport is one report as the run logs it: the metrics of an epoch
// at its training_iteration, at the workflow's time of the report.
type TrackedReport struct {
	Iteration int                `json:"iteration"`
	Millis    int64              `json:"millis"`
	Metrics   map[string]float64 `json:"metrics"`
}

// TrackerEnd is what a run logs when it ends.
type TrackerEnd struct {
	State      string `json:"state"`                // Progress.State
	Checkpoint string `json:"checkpoint,omitempty"` // the latest checkpoint's location (CheckpointRef.Location)
	Millis     int64  `json:"millis"`
}

// TrackInput is one call of ActivityTrackMLflow: the run is found by its
// tags (or RunID, once known), created if missing; then Params (if given),
// Reports and End are logged, in that order.
type TrackInput struct {
	MLflow   MLflow          `json:"mlflow"`
	Workflow string          `json:"workflow"`  // the run's workflow ID (TrackerTagRun)
	FirstRun string          `json:"first_run"` // its first execution's run ID (TrackerTagFirstRun)
	Search   string          `json:"search,omitempty"`
	Name     string          `json:"name"`    // the MLflow run's name
	Started  int64           `json:"started"` // the run's start, in milliseconds
	RunID    string          `json:"run_id,omitempty"`
	Params   []KeyValue      `json:"params,omitempty"`
	Reports  []TrackedReport `json:"reports,omitempty"`
	End      *TrackerEnd     `json:"end,omitempty"`
}

// TrackResult is where the run is logged.
type TrackResult struct {
	RunID        string `json:"run_id"`
	ExperimentID string `json:"experiment_id"`
}

// TrackerProgress is where a run's MLflow logging stands (Progress.MLflow):
// the run it logs to and the reports not yet logged, which continue-as-new
// carries.
type TrackerProgress struct {
	RunID        string `json:"run_id,omitempty"`
	ExperimentID string `json:"experiment_id,omitempty"`
	ParamsLogged bool   `json:"params_logged,omitempty"`
	// Started is the run's start, in milliseconds (its first execution's).
	Started int64 `json:"started,omitempty"`
	// Pending are the reports not yet logged, the newest MaxTrackerPending.
	Pending []TrackedReport `json:"pending,omitempty"`
	// Dropped counts the oldest reports let go while the server was down.
	Dropped int `json:"dropped,omitempty"`
	// Error is the last call's error while the server fails; empty once it answers.
	Error string `json:"error,omitempty"`
	// GaveUp: the server refused the run for good (the worker's policy, or
	// an answer no retry changes); nothing more is sent.
	GaveUp bool `json:"gave_up,omitempty"`
	// Ended: the run's end was logged.
	Ended bool `json:"ended,omitempty"`
}

// MaxTrackerPending bounds the reports a run keeps for a server that is down.
const MaxTrackerPending = 200

// MLflowStatus is the MLflow run status of a run's end state.
func MLflowStatus(state string) string {
	switch state {
	case StateCompleted, StateStopped:
		return "FINISHED"
	case StateCancelled:
		return "KILLED"
	}
	return "FAILED"
}

// Location is where the checkpoint lies: its storage URL without the
// worker's query parameters, its run and its ID.
func (c CheckpointRef) Location() string {
	u, _, _ := strings.Cut(c.URL, "?")
	return strings.TrimRight(u, "/") + "/" + c.Run + "/" + c.ID
}
