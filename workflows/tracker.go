package workflows

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// tracker logs a run to the MLflow tracking server its spec names
// (spec.mlflow) from a goroutine of its own: the epoch loop hands it each
// report and never waits on the server. A server that fails is reported
// once, as an incident, and called again after a backoff, the reports
// kept meanwhile (the newest spec.MaxTrackerPending); one that refuses the
// run for good (the worker's policy, a deleted experiment) is reported and
// given up on. Where it stands is Progress.MLflow, which continue-as-new
// carries.
type tracker struct {
	cfg spec.MLflow
	st  *spec.TrackerProgress
	// base is every call's input but what it logs.
	base spec.TrackInput
	// params are logged with the first call, or at the end (log_params_on_trial_end).
	params []spec.KeyValue
	end    *spec.TrackerEnd
	// attempts counts the calls that returned; hurry cuts a backoff short
	// (the run is ending); closed stops the goroutine.
	attempts      int
	hurry, closed bool
	failures      int
}

// Bounds of the tracker's calls and waits.
const (
	trackerBatch      = 50 // reports per call (each up to 67 metrics: one log-batch request)
	trackerMaxBackoff = time.Minute
	// trackerEndWait bounds how long a run that ends waits for its last
	// reports and its end to be logged, the server answering or not: one
	// that is down is called again every trackerEndBackoff meanwhile, and
	// what is still unlogged after the wait is reported as an incident.
	trackerEndWait    = time.Minute
	trackerEndBackoff = 5 * time.Second
)

// startTracking starts the run's tracker, if its spec names a server.
func (r *run) startTracking(ctx workflow.Context) {
	m := r.spec.MLflow
	if m == nil {
		return
	}
	info := workflow.GetInfo(ctx)
	if r.p.MLflow == nil {
		r.p.MLflow = &spec.TrackerProgress{Started: info.WorkflowStartTime.UnixMilli()}
	}
	t := &tracker{cfg: *m, st: r.p.MLflow, params: r.spec.Params()}
	t.base = spec.TrackInput{MLflow: *m, Workflow: info.WorkflowExecution.ID, FirstRun: info.FirstRunID,
		Name: info.WorkflowExecution.ID, Started: t.st.Started}
	if parent := info.ParentWorkflowExecution; parent != nil {
		t.base.Search = parent.ID
	}
	r.track = t
	// The goroutine outlives the run's cancellation: a cancelled run's
	// reports and end are still logged (endTracking bounds the wait).
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	workflow.Go(dctx, func(ctx workflow.Context) { t.loop(ctx, r) })
}

// work says whether there is something to send.
func (t *tracker) work() bool {
	if t.st.GaveUp || t.st.Ended {
		return false
	}
	return len(t.st.Pending) > 0 || t.end != nil || !t.st.ParamsLogged && !t.cfg.LogParamsOnTrialEnd || t.st.RunID == ""
}

func (t *tracker) loop(ctx workflow.Context, r *run) {
	actx := workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		ScheduleToCloseTimeout: 2 * time.Minute,
		StartToCloseTimeout:    2 * time.Minute,
		RetryPolicy:            &temporal.RetryPolicy{MaximumAttempts: 1}, // this loop retries, and reports
	})
	for {
		if workflow.Await(ctx, func() bool { return t.closed || t.work() }) != nil || t.closed {
			return
		}
		in, sent, end := t.next()
		dropped := t.st.Dropped
		var res spec.TrackResult
		err := workflow.ExecuteActivity(actx, spec.ActivityTrackMLflow, in).Get(ctx, &res)
		t.attempts++
		if err == nil {
			t.st.RunID = res.RunID
			if res.ExperimentID != "" {
				t.st.ExperimentID = res.ExperimentID
			}
			// Reports dropped meanwhile (report) were the oldest, of those sent.
			sent = max(0, sent-(t.st.Dropped-dropped))
			t.st.Pending = append(t.st.Pending[:0:0], t.st.Pending[sent:]...)
			t.st.ParamsLogged = t.st.ParamsLogged || in.Params != nil
			t.st.Ended = end
			if t.st.Error != "" {
				r.p.AddIncident(spec.Incident{Generation: r.p.Generation, Epoch: r.p.Epoch, Kind: spec.IncidentTracker,
					Detail: fmt.Sprintf("MLflow tracking server %s answers again; the reports kept meanwhile are logged", t.cfg.TrackingURI)})
			}
			t.st.Error, t.failures = "", 0
			continue
		}
		refused := isTrackerRefused(err)
		if t.st.Error == "" || refused {
			// The activity's error names the server, as the incident does.
			why := strings.TrimPrefix(errText(err), "tracking server "+t.cfg.TrackingURI+": ")
			detail := fmt.Sprintf("MLflow tracking server %s: %s; the run trains on, keeps its reports and logs them when the server answers", t.cfg.TrackingURI, why)
			if refused {
				detail = fmt.Sprintf("MLflow tracking server %s refused the run: %s; nothing more is logged to it", t.cfg.TrackingURI, why)
			}
			r.p.AddIncident(spec.Incident{Generation: r.p.Generation, Epoch: r.p.Epoch, Kind: spec.IncidentTracker, Detail: detail})
		}
		t.st.Error = errText(err)
		if refused {
			t.st.GaveUp, t.st.Pending = true, nil
			continue
		}
		t.failures++
		backoff := min(trackerMaxBackoff, time.Second<<min(t.failures-1, 6))
		hurried := t.hurry
		if hurried {
			backoff = min(backoff, trackerEndBackoff)
		}
		// A run that starts to end cuts a long backoff short, once.
		if _, err := workflow.AwaitWithTimeout(ctx, backoff, func() bool { return t.hurry && !hurried || t.closed }); err != nil {
			return
		}
	}
}

// next is the next call's input, how many pending reports it sends, and
// whether it logs the end (only with the last of them).
func (t *tracker) next() (spec.TrackInput, int, bool) {
	in := t.base
	in.RunID = t.st.RunID
	n := min(len(t.st.Pending), trackerBatch)
	in.Reports = t.st.Pending[:n]
	if !t.st.ParamsLogged && (!t.cfg.LogParamsOnTrialEnd || t.end != nil) {
		in.Params = t.params
		if in.Params == nil {
			in.Params = []spec.KeyValue{}
		}
	}
	end := t.end != nil && n == len(t.st.Pending)
	if end {
		in.End = t.end
	}
	return in, n, end
}

// report hands the tracker an epoch's metrics.
func (r *run) report(ctx workflow.Context, m spec.EpochMetrics) {
	t := r.track
	if t == nil || t.st.GaveUp || t.st.Ended {
		return
	}
	metrics := m.Map()
	metrics[spec.TrainingIterationMetric] = float64(m.Epoch + 1)
	t.st.Pending = append(t.st.Pending, spec.TrackedReport{Iteration: m.Epoch + 1, Millis: workflow.Now(ctx).UnixMilli(), Metrics: metrics})
	if over := len(t.st.Pending) - spec.MaxTrackerPending; over > 0 {
		t.st.Pending = append(t.st.Pending[:0:0], t.st.Pending[over:]...)
		t.st.Dropped += over
	}
}

// endTracking logs the run's end (its state, its latest checkpoint) and
// waits, at most trackerEndWait, for the tracker to send it and the
// reports still kept, calling a server that is down again meanwhile; what
// is left unlogged is reported as an incident.
func (r *run) endTracking(ctx workflow.Context) {
	r.flushTracking(ctx, true)
	t := r.track
	if t == nil || t.st.GaveUp || t.st.Ended {
		return
	}
	r.p.AddIncident(spec.Incident{Generation: r.p.Generation, Epoch: r.p.Epoch, Kind: spec.IncidentTracker,
		Detail: fmt.Sprintf("MLflow tracking server %s did not log the run's end within %s of it (%s); %d reports were not logged and are in the run's progress (mlflow.pending)",
			t.cfg.TrackingURI, trackerEndWait, strings.TrimPrefix(t.st.Error, "tracking server "+t.cfg.TrackingURI+": "), len(t.st.Pending))})
	if publishesProgress(ctx) {
		r.publish(ctx)
	}
}

// flushTracking waits for the tracker as endTracking says, with the end
// (end), or without it (before continue-as-new, which carries what is
// left): then a server that fails is waited for through one more call.
// Then it stops the tracker's goroutine.
func (r *run) flushTracking(ctx workflow.Context, end bool) {
	t := r.track
	if t == nil || t.closed {
		return
	}
	if end && !t.st.GaveUp && !t.st.Ended {
		t.end = &spec.TrackerEnd{State: r.p.State, Millis: workflow.Now(ctx).UnixMilli()}
		if r.p.Latest != nil {
			t.end.Checkpoint = r.p.Latest.Location()
		}
	}
	t.hurry = true
	from := t.attempts
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	workflow.AwaitWithTimeout(dctx, trackerEndWait, func() bool {
		return !t.work() || !end && t.attempts > from && t.st.Error != ""
	})
	t.closed = true
}

func isTrackerRefused(err error) bool {
	var app *temporal.ApplicationError
	return errors.As(err, &app) && (app.Type() == spec.ErrTrackerRefused || app.NonRetryable())
}

// errText is an activity error's own message, without the SDK's wrapping.
func errText(err error) string {
	var app *temporal.ApplicationError
	if errors.As(err, &app) {
		return app.Message()
	}
	var to *temporal.TimeoutError
	if errors.As(err, &to) {
		return "no answer within the call's timeout (" + to.Error() + ")"
	}
	return err.Error()
}
