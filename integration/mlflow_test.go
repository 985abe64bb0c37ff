package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/mlflowserver"
)

// mlflowRun is a run as the tracking server's own API returns it.
type mlflowRun struct {
	Info struct {
		ID      string `json:"run_id"`
		Status  string `json:"status"`
		EndTime int64  `json:"end_time"`
	} `json:"info"`
	Data struct {
		Params []spec.KeyValue `json:"params"`
		Tags   []spec.KeyValue `json:"tags"`
	} `json:"data"`
}

func (r mlflowRun) tag(k string) string {
	for _, kv := range r.Data.Tags {
		if kv.Key == k {
			return kv.Value
		}
	}
	return ""
}

func mlflowAPI(t *testing.T, server, method, path string, body any, out any) {
	t.Helper()
	var resp *http.Response
	var err error
	if method == http.MethodGet {
		resp, err = http.Get(server + "/api/2.0/mlflow/" + path + "?" + body.(url.Values).Encode())
	} else {
		b, _ := json.Marshal(body)
		resp, err = http.Post(server+"/api/2.0/mlflow/"+path, "application/json", strings.NewReader(string(b)))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: HTTP %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// mlflowRunsOf are the runs of the experiment named, tagged with the workflow.
func mlflowRunsOf(t *testing.T, server, experiment, workflow string) []mlflowRun {
	var exp struct {
		Experiment struct {
			ID string `json:"experiment_id"`
		} `json:"experiment"`
	}
	mlflowAPI(t, server, http.MethodGet, "experiments/get-by-name", url.Values{"experiment_name": {experiment}}, &exp)
	var got struct {
		Runs []mlflowRun `json:"runs"`
	}
	mlflowAPI(t, server, http.MethodPost, "runs/search", map[string]any{"experiment_ids": []string{exp.Experiment.ID},
		"filter": fmt.Sprintf("tags.`%s` = '%s'", spec.TrackerTagRun, workflow)}, &got)
	return got.Runs
}

func mlflowHistory(t *testing.T, server, run, key string) map[int]float64 {
	var h struct {
		Metrics []struct {
			Value float64 `json:"value"`
			Step  any     `json:"step"`
		} `json:"metrics"`
	}
	mlflowAPI(t, server, http.MethodGet, "metrics/get-history", url.Values{"run_id": {run}, "metric_key": {key}}, &h)
	out := map[int]float64{}
	for _, m := range h.Metrics {
		step, _ := strconv.Atoi(fmt.Sprint(m.Step))
		if _, twice := out[step]; twice {
			t.Errorf("%s at step %d logged twice", key, step)
		}
		out[step] = m.Value
	}
	return out
}

// TestRunsAreLoggedToMLflowEvenWhenItIsDown: a run names an MLflow
// tracking server that is not up when it starts. The run trains on; the
// outage is one incident; the server is started mid-run on its port, and
// then every report is logged, each once, at its step (training_iteration),
// with the params, the final checkpoint's URL, the state and FINISHED, read
// back through the server's own API. A worker whose -trackers does not list
// the server refuses the run's logging once, and the run completes all the
// same.
func TestRunsAreLoggedToMLflowEvenWhenItIsDown(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an MLflow tracking server")
	}
	if _, err := mlflowserver.Binary(".."); err != nil {
		mlflowserver.Start(t, "..") // fails or skips, saying why
	}
	port := mlflowserver.Port(t)
	uri := "http://127.0.0.1:" + strconv.Itoa(port)
	queue := "it-mlflow"
	startWorkerWith(t, "mlflow-both", "both", queue, append(slices.Clone(testPolicy), "-trackers", uri))
	c := dial(t)
	const epochs = 8
	s := subsetSpec(t, queue, 1, epochs)
	s.MLflow = &spec.MLflow{TrackingURI: uri, ExperimentName: "it-mlflow", Tags: map[string]string{"team": "vision"}}
	s.Config = map[string]json.RawMessage{"optimizer": json.RawMessage(`"adam"`)}
	run := startRun(t, c, "it-mlflow-down", queue, s)

	// The outage is reported while the run trains.
	deadline := time.Now().Add(time.Minute)
	for {
		p := progress(t, c, "it-mlflow-down")
		if p != nil && p.MLflow != nil && p.MLflow.Error != "" {
			if p.State == spec.StateCompleted {
				t.Fatal("the run completed before the tracker's first call failed")
			}
			t.Logf("down at epoch %d: %s", p.Epoch, p.MLflow.Error)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no tracker error after a minute: %+v", p)
		}
		time.Sleep(200 * time.Millisecond)
	}
	server := mlflowserver.StartAt(t, "..", port, t.TempDir())
	if p := progress(t, c, "it-mlflow-down"); p == nil || p.State == spec.StateCompleted {
		t.Logf("the run ended before the server was up (%v); its end waits for one more call", p)
	}
	p := awaitRun(t, run, 3*time.Minute)
	if p.State != spec.StateCompleted {
		t.Fatalf("the run: %s", p.State)
	}
	var down, again int
	for _, inc := range p.Incidents {
		if inc.Kind == spec.IncidentTracker {
			switch {
			case strings.Contains(inc.Detail, "the run trains on"):
				down++
			case strings.Contains(inc.Detail, "answers again"):
				again++
			default:
				t.Errorf("incident %s", inc.Detail)
			}
		}
	}
	if down != 1 || again != 1 {
		t.Errorf("%d outage and %d recovery incidents; want one of each", down, again)
	}
	if m := p.MLflow; m == nil || !m.Ended || len(m.Pending) != 0 || m.Dropped != 0 || m.Error != "" || m.GaveUp {
		t.Fatalf("tracker progress %+v", p.MLflow)
	}
	runs := mlflowRunsOf(t, server.URL, "it-mlflow", "it-mlflow-down")
	if len(runs) != 1 {
		t.Fatalf("%d MLflow runs of the workflow; want 1", len(runs))
	}
	r := runs[0]
	if r.Info.ID != p.MLflow.RunID || r.Info.Status != "FINISHED" || r.tag(spec.TrackerTagState) != spec.StateCompleted || r.tag("team") != "vision" {
		t.Errorf("MLflow run %+v", r)
	}
	if want := p.Latest.Location(); r.tag(spec.TrackerTagCheckpoint) != want || !strings.HasPrefix(want, "file://") {
		t.Errorf("checkpoint tag %q; want %q", r.tag(spec.TrackerTagCheckpoint), want)
	}
	params := map[string]string{}
	for _, kv := range r.Data.Params {
		params[kv.Key] = kv.Value
	}
	if params["optimizer"] != "adam" || params["hyper/epochs"] != strconv.Itoa(epochs) || params["num_workers"] != "1" {
		t.Errorf("params %v", params)
	}
	iters := mlflowHistory(t, server.URL, r.Info.ID, spec.TrainingIterationMetric)
	acc := mlflowHistory(t, server.URL, r.Info.ID, spec.MetricTestAccuracy)
	if len(iters) != epochs || len(acc) != epochs {
		t.Fatalf("%d training_iteration and %d %s values; want %d of each", len(iters), len(acc), spec.MetricTestAccuracy, epochs)
	}
	for _, m := range p.Metrics {
		if iters[m.Epoch+1] != float64(m.Epoch+1) || acc[m.Epoch+1] != m.TestAccuracy {
			t.Errorf("step %d: iteration %v, accuracy %v; the run reported %v", m.Epoch+1, iters[m.Epoch+1], acc[m.Epoch+1], m.TestAccuracy)
		}
	}

	// A worker that lists no tracker: refused once, and the run completes.
	strict := "it-mlflow-strict"
	startWorker(t, "mlflow-strict", "both", strict)
	ps := subsetSpec(t, strict, 1, 2)
	ps.MLflow = &spec.MLflow{TrackingURI: server.URL}
	p = awaitRun(t, startRun(t, c, "it-mlflow-refused", strict, ps), 2*time.Minute)
	var refused []string
	for _, inc := range p.Incidents {
		if inc.Kind == spec.IncidentTracker {
			refused = append(refused, inc.Detail)
		}
	}
	if p.State != spec.StateCompleted || len(refused) != 1 || !strings.Contains(refused[0], "-trackers") || p.MLflow == nil || !p.MLflow.GaveUp {
		t.Fatalf("a worker without -trackers: %s, incidents %q, tracker %+v; want completed, one refusal naming -trackers", p.State, refused, p.MLflow)
	}
	if runs := mlflowRunsOf(t, server.URL, spec.DefaultExperiment, "it-mlflow-refused"); len(runs) != 0 {
		t.Fatalf("the refused run was logged: %+v", runs)
	}
}
