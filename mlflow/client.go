// Package mlflow owns MLflow's tracking protocol (its REST API 2.0, as
// `mlflow server` serves it): a client that finds or creates an
// experiment and a run, logs batches of metrics, params and tags, and
// ends the run. MLflow publishes no Go client; the API is a handful of
// JSON calls. It follows no redirect and reads at most MaxResponseBytes
// of an answer, so a server that misbehaves cannot take the worker with it.
package mlflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// Limits of one log-batch request (MLflow's own).
const (
	MaxBatchMetrics  = 1000
	MaxBatchParams   = 100
	MaxBatchTags     = 100
	MaxBatchEntities = 1000
)

// MaxResponseBytes bounds what the client reads of an answer.
const MaxResponseBytes = 1 << 20

// Run statuses (MLflow's RunStatus).
const (
	StatusRunning  = "RUNNING"
	StatusFinished = "FINISHED"
	StatusFailed   = "FAILED"
	StatusKilled   = "KILLED"
)

// Client talks to one tracking server.
type Client struct {
	// URL is the server's base URL (http://host:5000, or with a path prefix).
	URL string
	// HTTP is the client the calls go through; nil: one that follows no redirect.
	HTTP *http.Client
	// Token is sent as a bearer token (MLFLOW_TRACKING_TOKEN); Username and
	// Password as basic auth (MLFLOW_TRACKING_USERNAME, _PASSWORD).
	Token, Username, Password string
}

// FromEnv sets the client's credentials from MLflow's environment variables,
// as getenv reads them (the worker's environment).
func (c *Client) FromEnv(getenv func(string) string) {
	c.Token = getenv("MLFLOW_TRACKING_TOKEN")
	c.Username, c.Password = getenv("MLFLOW_TRACKING_USERNAME"), getenv("MLFLOW_TRACKING_PASSWORD")
}

// APIError is the server's answer to a call that it refused.
type APIError struct {
	Call    string
	Status  int
	Code    string // MLflow's error_code: RESOURCE_DOES_NOT_EXIST, INVALID_PARAMETER_VALUE, ...
	Message string
}

func (e *APIError) Error() string {
	if e.Code != "" {
		return fmt.Sprintf("mlflow %s: %d %s: %s", e.Call, e.Status, e.Code, e.Message)
	}
	return fmt.Sprintf("mlflow %s: HTTP %d: %s", e.Call, e.Status, e.Message)
}

// Permanent says whether calling again cannot help: the server understood
// the call and refused it (a 4xx but 408 and 429).
func Permanent(err error) bool {
	var a *APIError
	return errors.As(err, &a) && a.Status >= 400 && a.Status < 500 && a.Status != http.StatusRequestTimeout && a.Status != http.StatusTooManyRequests
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return noRedirects
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

// call sends body (nil: a GET with query) to /api/2.0/mlflow/<path> and
// decodes the answer into out (nil: ignored).
func (c *Client) call(ctx context.Context, method, path string, query url.Values, body, out any) error {
	u := strings.TrimRight(c.URL, "/") + "/api/2.0/mlflow/" + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("mlflow %s: %w", path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return fmt.Errorf("mlflow %s: %w", path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	switch {
	case c.Token != "":
		req.Header.Set("Authorization", "Bearer "+c.Token)
	case c.Username != "":
		req.SetBasicAuth(c.Username, c.Password)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return fmt.Errorf("mlflow %s: %w", path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes+1))
	if err != nil {
		return fmt.Errorf("mlflow %s: reading the answer: %w", path, err)
	}
	if len(data) > MaxResponseBytes {
		return fmt.Errorf("mlflow %s: the answer is over %d bytes", path, MaxResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		e := &APIError{Call: path, Status: resp.StatusCode}
		var body struct {
			Code    string `json:"error_code"`
			Message string `json:"message"`
		}
		if json.Unmarshal(data, &body) == nil && body.Code != "" {
			e.Code, e.Message = body.Code, body.Message
		} else {
			e.Message = strings.TrimSpace(string(data))
		}
		if len(e.Message) > 500 {
			e.Message = e.Message[:500] + "..."
		}
		if resp.StatusCode >= 300 && resp.StatusCode < 400 {
			e.Message = "redirected to " + resp.Header.Get("Location") + " (redirects are not followed: name the server's own URL)"
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("mlflow %s: the answer does not decode (%v): is %s an MLflow tracking server?", path, err, c.URL)
		}
	}
	return nil
}

// Experiment is the ID of the experiment named name, created if missing.
func (c *Client) Experiment(ctx context.Context, name string) (string, error) {
	var got struct {
		Experiment struct {
			ID             string `json:"experiment_id"`
			LifecycleStage string `json:"lifecycle_stage"`
		} `json:"experiment"`
	}
	for try := 0; try < 2; try++ {
		err := c.call(ctx, http.MethodGet, "experiments/get-by-name", url.Values{"experiment_name": {name}}, nil, &got)
		if err == nil {
			if got.Experiment.ID == "" {
				return "", fmt.Errorf("mlflow experiments/get-by-name: no experiment_id in the answer")
			}
			if got.Experiment.LifecycleStage == "deleted" {
				return "", &APIError{Call: "experiments/get-by-name", Status: http.StatusBadRequest, Code: "INVALID_STATE",
					Message: fmt.Sprintf("experiment %q is deleted: restore it (mlflow experiments restore) or name another", name)}
			}
			return got.Experiment.ID, nil
		}
		var a *APIError
		if !errors.As(err, &a) || a.Code != "RESOURCE_DOES_NOT_EXIST" {
			return "", err
		}
		var created struct {
			ID string `json:"experiment_id"`
		}
		err = c.call(ctx, http.MethodPost, "experiments/create", nil, map[string]any{"name": name}, &created)
		if err == nil && created.ID != "" {
			return created.ID, nil
		}
		if !errors.As(err, &a) || a.Code != "RESOURCE_ALREADY_EXISTS" {
			return "", err
		}
		// Another run created it at the same moment: read it.
	}
	return "", fmt.Errorf("mlflow: experiment %q neither found nor created", name)
}

// Tag is a run's tag or param.
type Tag struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// FindRun is the ID of the newest run of the experiment with every tag
// given, if there is one. MLflow's search filter has no escape for a quote,
// so a value holding both kinds is matched by LIKE with the quotes as
// wildcards, and every tag of what comes back is compared here exactly.
func (c *Client) FindRun(ctx context.Context, experimentID string, tags []Tag) (string, bool, error) {
	var filter []string
	for _, t := range tags {
		filter = append(filter, tagFilter(t))
	}
	var got struct {
		Runs []struct {
			Info struct {
				ID string `json:"run_id"`
			} `json:"info"`
			Data struct {
				Tags []Tag `json:"tags"`
			} `json:"data"`
		} `json:"runs"`
	}
	err := c.call(ctx, http.MethodPost, "runs/search", nil, map[string]any{"experiment_ids": []string{experimentID},
		"filter": strings.Join(filter, " and "), "max_results": 50, "order_by": []string{"attributes.start_time DESC"}}, &got)
	if err != nil {
		return "", false, err
	}
	for _, r := range got.Runs {
		have := map[string]string{}
		for _, t := range r.Data.Tags {
			have[t.Key] = t.Value
		}
		match := r.Info.ID != ""
		for _, t := range tags {
			if v, ok := have[t.Key]; !ok || v != t.Value {
				match = false
			}
		}
		if match {
			return r.Info.ID, true, nil
		}
	}
	return "", false, nil
}

// tagFilter is one term of a runs/search filter that matches the tag's
// value (or, where no quoting can say it, a superset of it).
func tagFilter(t Tag) string {
	key := "tags.`" + strings.ReplaceAll(t.Key, "`", "") + "`"
	switch {
	case !strings.Contains(t.Value, "'"):
		return key + " = '" + t.Value + "'"
	case !strings.Contains(t.Value, `"`):
		return key + ` = "` + t.Value + `"`
	default:
		return key + " LIKE '" + strings.ReplaceAll(t.Value, "'", "_") + "'"
	}
}

// CreateRun starts a run of the experiment, and is its ID.
func (c *Client) CreateRun(ctx context.Context, experimentID, name string, startMillis int64, tags []Tag) (string, error) {
	var got struct {
		Run struct {
			Info struct {
				ID string `json:"run_id"`
			} `json:"info"`
		} `json:"run"`
	}
	if tags == nil {
		tags = []Tag{}
	}
	err := c.call(ctx, http.MethodPost, "runs/create", nil, map[string]any{"experiment_id": experimentID, "run_name": name,
		"start_time": startMillis, "tags": tags}, &got)
	if err == nil && got.Run.Info.ID == "" {
		err = fmt.Errorf("mlflow runs/create: no run_id in the answer")
	}
	return got.Run.Info.ID, err
}

// Metric is one value of a metric at a step.
type Metric struct {
	Key       string
	Value     float64
	Timestamp int64 // milliseconds since the epoch
	Step      int64
}

// MarshalJSON writes NaN and the infinities as MLflow's API reads them.
func (m Metric) MarshalJSON() ([]byte, error) {
	var v any = m.Value
	switch {
	case math.IsNaN(m.Value):
		v = "NaN"
	case math.IsInf(m.Value, 1):
		v = "Infinity"
	case math.IsInf(m.Value, -1):
		v = "-Infinity"
	}
	return json.Marshal(map[string]any{"key": m.Key, "value": v, "timestamp": strconv.FormatInt(m.Timestamp, 10), "step": strconv.FormatInt(m.Step, 10)})
}

// LogBatch logs metrics, params and tags to a run, in as many requests as
// MLflow's limits take. Logging the same param with the same value again
// is harmless; so a retried batch is too (the server keeps a metric's
// history by timestamp and step).
func (c *Client) LogBatch(ctx context.Context, runID string, metrics []Metric, params, tags []Tag) error {
	for len(metrics) > 0 || len(params) > 0 || len(tags) > 0 {
		np := min(len(params), MaxBatchParams)
		nt := min(len(tags), MaxBatchTags)
		nm := min(len(metrics), MaxBatchMetrics, MaxBatchEntities-np-nt)
		// An absent list is empty; a null one is a 500 from MLflow's server.
		body := map[string]any{"run_id": runID}
		if nm > 0 {
			body["metrics"] = metrics[:nm]
		}
		if np > 0 {
			body["params"] = params[:np]
		}
		if nt > 0 {
			body["tags"] = tags[:nt]
		}
		if err := c.call(ctx, http.MethodPost, "runs/log-batch", nil, body, nil); err != nil {
			return err
		}
		metrics, params, tags = metrics[nm:], params[np:], tags[nt:]
	}
	return nil
}

// EndRun sets a run's status and end time.
func (c *Client) EndRun(ctx context.Context, runID, status string, endMillis int64) error {
	return c.call(ctx, http.MethodPost, "runs/update", nil, map[string]any{"run_id": runID, "status": status, "end_time": endMillis}, nil)
}
