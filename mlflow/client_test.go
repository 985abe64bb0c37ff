package mlflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/mlflow"
	"github.com/durabletrain/durabletrain/testkit/mlflowserver"
)

// history reads a metric's values back through the server's own API.
func history(t *testing.T, server, run, key string) []map[string]any {
	t.Helper()
	resp, err := http.Get(server + "/api/2.0/mlflow/metrics/get-history?" + url.Values{"run_id": {run}, "metric_key": {key}, "max_results": {"25000"}}.Encode())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Metrics []map[string]any `json:"metrics"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	return got.Metrics
}

func TestLogsToARealTrackingServer(t *testing.T) {
	s := mlflowserver.Start(t, "..")
	ctx := context.Background()
	c := &mlflow.Client{URL: s.URL}
	exp, err := c.Experiment(ctx, "durabletrain-client")
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Experiment(ctx, "durabletrain-client")
	if err != nil || again != exp {
		t.Fatalf("the experiment again: %q, %v; want %q", again, err, exp)
	}
	tags := []mlflow.Tag{{Key: "durabletrain.run", Value: "wf-1"}, {Key: "durabletrain.first_run", Value: "r'1"}}
	if _, found, err := c.FindRun(ctx, exp, tags); err != nil || found {
		t.Fatalf("FindRun before any run: found %v, %v", found, err)
	}
	run, err := c.CreateRun(ctx, exp, "wf-1", 1000, tags)
	if err != nil {
		t.Fatal(err)
	}
	if id, found, err := c.FindRun(ctx, exp, tags); err != nil || !found || id != run {
		t.Fatalf("FindRun: %q %v %v; want %q", id, found, err, run)
	}
	// A value no quoting can say, and one that differs from it only where
	// the quotes are: each finds its own run.
	for _, v := range []string{`a'b"c\d%`, `a_b_c\d%`, `a"b'c\d%`} {
		tags := []mlflow.Tag{{Key: "durabletrain.run", Value: v}}
		other, err := c.CreateRun(ctx, exp, "quotes", 1000, tags)
		if err != nil {
			t.Fatal(err)
		}
		if id, found, err := c.FindRun(ctx, exp, tags); err != nil || !found || id != other {
			t.Fatalf("FindRun(%s): %q %v %v; want %q", v, id, found, err, other)
		}
	}
	// More metrics than one request takes, a NaN and an infinity among them.
	var metrics []mlflow.Metric
	for step := int64(1); step <= 2500; step++ {
		metrics = append(metrics, mlflow.Metric{Key: "loss", Value: 1 / float64(step), Timestamp: 1000 + step, Step: step})
	}
	metrics[9].Value, metrics[10].Value = math.NaN(), math.Inf(1)
	params := []mlflow.Tag{{Key: "lr", Value: "0.1"}, {Key: "opt/name", Value: "adam"}}
	for range 2 { // a retried batch is the same batch
		if err := c.LogBatch(ctx, run, metrics, params, []mlflow.Tag{{Key: "durabletrain.state", Value: "training"}}); err != nil {
			t.Fatal(err)
		}
	}
	got := history(t, s.URL, run, "loss")
	if len(got) != 2500 {
		t.Fatalf("%d values of loss; want 2500 (each once)", len(got))
	}
	for _, m := range got {
		if m["step"] == "10" && m["value"] != "NaN" || m["step"] == "11" && m["value"] != "Infinity" {
			t.Fatalf("step %v is %v", m["step"], m["value"])
		}
	}
	err = c.LogBatch(ctx, run, nil, []mlflow.Tag{{Key: "lr", Value: "0.2"}}, nil)
	var api *mlflow.APIError
	if !errors.As(err, &api) || api.Code != "INVALID_PARAMETER_VALUE" || !mlflow.Permanent(err) {
		t.Fatalf("a param changed: %v; want INVALID_PARAMETER_VALUE, permanent", err)
	}
	if err := c.EndRun(ctx, run, mlflow.StatusFinished, 5000); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(s.URL + "/api/2.0/mlflow/runs/get?run_id=" + run)
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Run struct {
			Info struct {
				Status  string `json:"status"`
				EndTime any    `json:"end_time"`
			} `json:"info"`
			Data struct {
				Params []mlflow.Tag `json:"params"`
			} `json:"data"`
		} `json:"run"`
	}
	json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if r.Run.Info.Status != "FINISHED" || len(r.Run.Data.Params) != 2 {
		t.Fatalf("the run: %+v; want FINISHED with 2 params", r.Run)
	}
}

func TestAServerThatMisbehavesIsAnError(t *testing.T) {
	ctx := context.Background()
	for name, h := range map[string]http.HandlerFunc{
		"an endless answer": func(w http.ResponseWriter, r *http.Request) {
			chunk := []byte(strings.Repeat("x", 1<<16))
			for range 64 { // 4 MiB
				w.Write(chunk)
			}
		},
		"a redirect": func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data", http.StatusTemporaryRedirect)
		},
		"not MLflow": func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>hello</html>")) },
		"a 500":      func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusInternalServerError) },
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(h)
			defer srv.Close()
			c := &mlflow.Client{URL: srv.URL}
			_, err := c.Experiment(ctx, "x")
			if err == nil {
				t.Fatal("no error")
			}
			if name == "a 500" && mlflow.Permanent(err) || name == "a redirect" && !strings.Contains(err.Error(), "not followed") {
				t.Fatalf("%v", err)
			}
			t.Log(err)
		})
	}
	c := &mlflow.Client{URL: "http://127.0.0.1:1"}
	if _, err := c.Experiment(ctx, "x"); err == nil || mlflow.Permanent(err) {
		t.Fatalf("a server that is not there: %v; want an error to retry", err)
	}
}
