package activities_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/activities"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/mlflowserver"
)

// mlflowGet is one GET of the server's REST API, decoded.
func mlflowGet(t *testing.T, server, path string, q url.Values, out any) {
	t.Helper()
	resp, err := http.Get(server + "/api/2.0/mlflow/" + path + "?" + q.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// TrackMLflow against a real tracking server: a call made again (a
// retried activity, a replayed workflow) finds the run it created and logs
// nothing twice; a metric name MLflow refuses is logged under one it
// takes; the end sets the run's state, checkpoint and status. A worker
// whose policy does not list the server refuses at once, for good; a
// server that is down is an error worth retrying.
func TestTrackMLflowCanBeCalledAgain(t *testing.T) {
	s := mlflowserver.Start(t, "..")
	tr := activities.Tracker{Policy: policy.Policy{Trackers: []string{s.URL}}}
	ctx := context.Background()
	reports := []spec.TrackedReport{
		{Iteration: 1, Millis: 5000, Metrics: map[string]float64{"loss": 0.9, "acc@1": 0.5, spec.TrainingIterationMetric: 1}},
		{Iteration: 2, Millis: 6000, Metrics: map[string]float64{"loss": 0.4, "acc@1": 0.75, spec.TrainingIterationMetric: 2}},
	}
	in := spec.TrackInput{MLflow: spec.MLflow{TrackingURI: s.URL, ExperimentName: "exp-a", Tags: map[string]string{"team": "vision"}},
		Workflow: "trial-7", FirstRun: "first-1", Search: "search-1", Name: "trial-7", Started: 4000,
		Params: []spec.KeyValue{{Key: "lr", Value: "0.1"}}, Reports: reports,
		End: &spec.TrackerEnd{State: spec.StateCompleted, Checkpoint: "file:///ckpt/trial-7/e2", Millis: 7000}}
	var first spec.TrackResult
	for i := range 2 {
		res, err := tr.TrackMLflow(ctx, in)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if i == 0 {
			first = res
		} else if res.RunID != first.RunID {
			t.Fatalf("the call made again logged to run %s; the first to %s", res.RunID, first.RunID)
		}
	}
	var got struct {
		Run struct {
			Info struct {
				Status    string `json:"status"`
				StartTime int64  `json:"start_time"`
				EndTime   int64  `json:"end_time"`
				RunName   string `json:"run_name"`
			} `json:"info"`
			Data struct {
				Params []spec.KeyValue `json:"params"`
				Tags   []spec.KeyValue `json:"tags"`
			} `json:"data"`
		} `json:"run"`
	}
	mlflowGet(t, s.URL, "runs/get", url.Values{"run_id": {first.RunID}}, &got)
	info := got.Run.Info
	if info.Status != "FINISHED" || info.StartTime != 4000 || info.EndTime != 7000 || info.RunName != "trial-7" {
		t.Fatalf("run info %+v", info)
	}
	tags := map[string]string{}
	for _, kv := range got.Run.Data.Tags {
		tags[kv.Key] = kv.Value
	}
	for k, v := range map[string]string{spec.TrackerTagRun: "trial-7", spec.TrackerTagFirstRun: "first-1", spec.TrackerTagSearch: "search-1",
		spec.TrackerTagTrialName: "trial-7", spec.TrackerTagState: spec.StateCompleted, spec.TrackerTagCheckpoint: "file:///ckpt/trial-7/e2", "team": "vision"} {
		if tags[k] != v {
			t.Errorf("tag %s is %q; want %q", k, tags[k], v)
		}
	}
	if p := got.Run.Data.Params; len(p) != 1 || p[0] != (spec.KeyValue{Key: "lr", Value: "0.1"}) {
		t.Errorf("params %+v", p)
	}
	for key, want := range map[string][]float64{"loss": {0.9, 0.4}, "acc_1": {0.5, 0.75}, spec.TrainingIterationMetric: {1, 2}} {
		var h struct {
			Metrics []struct {
				Value     float64 `json:"value"`
				Step      any     `json:"step"` // a number or a string, by version
				Timestamp any     `json:"timestamp"`
			} `json:"metrics"`
		}
		mlflowGet(t, s.URL, "metrics/get-history", url.Values{"run_id": {first.RunID}, "metric_key": {key}}, &h)
		if len(h.Metrics) != len(want) {
			t.Errorf("%s: %d values %+v; want %v, each once", key, len(h.Metrics), h.Metrics, want)
			continue
		}
		for i, m := range h.Metrics {
			if m.Value != want[i] || fmt.Sprint(m.Step) != strconv.Itoa(i+1) || fmt.Sprint(m.Timestamp) != strconv.Itoa(5000+1000*i) {
				t.Errorf("%s[%d] = %+v; want %v at step %d", key, i, m, want[i], i+1)
			}
		}
	}
	// Another execution of the same workflow ID is another MLflow run.
	again := in
	again.FirstRun = "first-2"
	if res, err := tr.TrackMLflow(ctx, again); err != nil || res.RunID == first.RunID {
		t.Fatalf("a second execution: %+v %v; want a run of its own", res, err)
	}

	var app *temporal.ApplicationError
	_, err := activities.Tracker{Policy: policy.Policy{Trackers: []string{"http://127.0.0.1:1"}}}.TrackMLflow(ctx, in)
	if !errors.As(err, &app) || !app.NonRetryable() || app.Type() != spec.ErrTrackerRefused || !strings.Contains(err.Error(), "-trackers") {
		t.Fatalf("a server the policy does not list: %v; want a non-retryable %s naming -trackers", err, spec.ErrTrackerRefused)
	}
	down := in
	down.MLflow.TrackingURI = "http://127.0.0.1:" + strconv.Itoa(mlflowserver.Port(t))
	_, err = activities.Tracker{Policy: policy.Policy{Trackers: []string{"*"}}}.TrackMLflow(ctx, down)
	if err == nil || errors.As(err, &app) && app.NonRetryable() || !strings.Contains(err.Error(), down.MLflow.TrackingURI) {
		t.Fatalf("a server that is down: %v; want an error worth retrying, naming %s", err, down.MLflow.TrackingURI)
	}
}
