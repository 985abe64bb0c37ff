package activities

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/mlflow"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
)

// Tracker logs runs to their MLflow tracking servers, on the workflows'
// queue, where the worker's policy allows (Policy.Trackers). Credentials
// are the worker's: MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and
// MLFLOW_TRACKING_PASSWORD, in its environment.
type Tracker struct {
	Policy policy.Policy
	// Getenv reads the credentials; nil: os.Getenv.
	Getenv func(string) string
	// HTTP is the client; nil: one that follows no redirect, each call
	// bounded by TrackerCallTimeout.
	HTTP *http.Client
	Log  *zap.Logger
}

// TrackerCallTimeout bounds one call to a tracking server.
const TrackerCallTimeout = 10 * time.Second

// ErrTrackerRefused types the error of a call that cannot succeed again.
const ErrTrackerRefused = spec.ErrTrackerRefused

// TrackMLflow finds the run's MLflow run by its tags (or in.RunID), creates
// it if missing, and logs in.Params, in.Reports and in.End. Every call can
// be made again: a run is found, not created twice; params, tags and
// metrics logged again with the same values are the same.
func (t Tracker) TrackMLflow(ctx context.Context, in spec.TrackInput) (spec.TrackResult, error) {
	if err := t.Policy.CheckTracker(in.MLflow.TrackingURI); err != nil {
		return spec.TrackResult{}, temporal.NewNonRetryableApplicationError(err.Error(), ErrTrackerRefused, nil)
	}
	getenv := t.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	c := &mlflow.Client{URL: in.MLflow.TrackingURI, HTTP: t.HTTP}
	c.FromEnv(getenv)
	res, err := t.track(ctx, c, in)
	if err != nil {
		err = fmt.Errorf("tracking server %s: %w", in.MLflow.TrackingURI, err)
		if mlflow.Permanent(err) {
			return res, temporal.NewNonRetryableApplicationError(err.Error(), ErrTrackerRefused, nil)
		}
	}
	return res, err
}

func (t Tracker) track(ctx context.Context, c *mlflow.Client, in spec.TrackInput) (spec.TrackResult, error) {
	res := spec.TrackResult{RunID: in.RunID}
	call := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, TrackerCallTimeout) }
	if res.RunID == "" {
		cctx, cancel := call()
		exp, err := c.Experiment(cctx, in.MLflow.ExperimentName)
		cancel()
		if err != nil {
			return res, err
		}
		res.ExperimentID = exp
		ours := []mlflow.Tag{{Key: spec.TrackerTagRun, Value: in.Workflow}, {Key: spec.TrackerTagFirstRun, Value: in.FirstRun}}
		cctx, cancel = call()
		id, found, err := c.FindRun(cctx, exp, ours)
		cancel()
		if err != nil {
			return res, err
		}
		if !found {
			tags := ours
			if in.Search != "" {
				tags = append(tags, mlflow.Tag{Key: spec.TrackerTagSearch, Value: in.Search}, mlflow.Tag{Key: spec.TrackerTagTrialName, Value: in.Name})
			}
			for _, k := range sortedKeys(in.MLflow.Tags) {
				tags = append(tags, mlflow.Tag{Key: k, Value: in.MLflow.Tags[k]})
			}
			cctx, cancel = call()
			id, err = c.CreateRun(cctx, exp, in.Name, in.Started, tags)
			cancel()
			if err != nil {
				return res, err
			}
		}
		res.RunID = id
	}
	var metrics []mlflow.Metric
	for _, r := range in.Reports {
		for _, k := range sortedKeys(r.Metrics) {
			metrics = append(metrics, mlflow.Metric{Key: spec.MLflowName(k), Value: r.Metrics[k], Timestamp: r.Millis, Step: int64(r.Iteration)})
		}
	}
	params := make([]mlflow.Tag, 0, len(in.Params))
	for _, p := range in.Params {
		params = append(params, mlflow.Tag{Key: p.Key, Value: p.Value})
	}
	var tags []mlflow.Tag
	if e := in.End; e != nil {
		tags = append(tags, mlflow.Tag{Key: spec.TrackerTagState, Value: e.State})
		if e.Checkpoint != "" {
			tags = append(tags, mlflow.Tag{Key: spec.TrackerTagCheckpoint, Value: e.Checkpoint})
		}
	}
	if len(metrics) > 0 || len(params) > 0 || len(tags) > 0 {
		cctx, cancel := context.WithTimeout(ctx, TrackerCallTimeout*time.Duration(1+len(metrics)/mlflow.MaxBatchMetrics+len(params)/mlflow.MaxBatchParams))
		err := c.LogBatch(cctx, res.RunID, metrics, params, tags)
		cancel()
		if err != nil {
			return res, err
		}
	}
	if e := in.End; e != nil {
		cctx, cancel := call()
		defer cancel()
		if err := c.EndRun(cctx, res.RunID, spec.MLflowStatus(e.State), e.Millis); err != nil {
			return res, err
		}
	}
	return res, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
