package activities

import (
	"context"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/telemetry/metricname"
	"github.com/durabletrain/durabletrain/trainer"
)

// rankMetrics records one rank's metrics through the activity's handler
// (the worker's registry), tagged with the run and the rank.
// The instruments of the step and the all-reduce are made once per replica:
// both run thousands of times a second on a small model.
type rankMetrics struct {
	h        client.MetricsHandler
	lastStep time.Time

	stepLatency, allReduceLatency client.MetricsTimer
	epochG, stepG, loss, busBW    client.MetricsGauge
	heartbeatG                    client.MetricsGauge
	steps, samples, reducedBytes  client.MetricsCounter
}

func newRankMetrics(ctx context.Context, run string, rank int) *rankMetrics {
	h := client.MetricsHandler(client.MetricsNopHandler)
	if activity.IsActivity(ctx) {
		h = activity.GetMetricsHandler(ctx)
	}
	h = h.WithTags(map[string]string{"run": run, "rank": strconv.Itoa(rank)})
	return &rankMetrics{h: h,
		stepLatency: h.Timer(metricname.StepLatency), allReduceLatency: h.Timer(metricname.AllReduceLatency),
		epochG: h.Gauge(metricname.Epoch), stepG: h.Gauge(metricname.Step), busBW: h.Gauge(metricname.AllReduceBusBandwidth),
		heartbeatG: h.Gauge(metricname.RankHeartbeat),
		loss:       h.WithTags(map[string]string{"name": "loss"}).Gauge(metricname.ReportedMetric),
		steps:      h.Counter(metricname.Steps), samples: h.Counter(metricname.Samples), reducedBytes: h.Counter(metricname.AllReduceBytes)}
}

// step records a training step: position, loss, and the time since the last.
func (m *rankMetrics) step(p trainer.Progress, batch int) {
	now := time.Now()
	if !m.lastStep.IsZero() {
		m.stepLatency.Record(now.Sub(m.lastStep))
	}
	m.lastStep = now
	m.epochG.Update(float64(p.Epoch))
	m.stepG.Update(float64(p.Step))
	m.steps.Inc(1)
	m.samples.Inc(int64(batch))
	if !p.NoLoss {
		m.loss.Update(p.Loss)
	}
}

// heartbeat records that the rank lives, at every heartbeat of its epoch:
// it keeps the run's series on a worker's /metrics through an epoch's long
// evaluation or checkpoint, when no step updates them.
func (m *rankMetrics) heartbeat() {
	m.heartbeatG.Update(float64(time.Now().UnixMilli()) / 1e3)
}

// pause marks a gap in training (a checkpoint, an evaluation) so that the
// next step's latency does not include it.
func (m *rankMetrics) pause() { m.lastStep = time.Time{} }

// epoch records what an epoch reported.
func (m *rankMetrics) epoch(samplesPerSecond float64, reported map[string]float64) {
	m.h.Gauge(metricname.SamplesPerSecond).Update(samplesPerSecond)
	for name, v := range reported {
		m.h.WithTags(map[string]string{"name": name}).Gauge(metricname.ReportedMetric).Update(v)
	}
}

// checkpoint records a checkpoint saved or restored.
func (m *rankMetrics) checkpoint(op string, bytes int64, took time.Duration) {
	h := m.h.WithTags(map[string]string{"op": op})
	h.Counter(metricname.CheckpointBytes).Inc(bytes)
	h.Timer(metricname.CheckpointLatency).Record(took)
}

// metered is the gang's collective as the trainer gets it: timed
// (meteredReducer), and still caller-driven where the collective is.
func metered(r trainer.Reducer, m *rankMetrics) trainer.Reducer {
	mr := meteredReducer{Reducer: r, m: m}
	if d, ok := r.(trainer.CallerDrivenReducer); ok {
		return &meteredDriven{meteredReducer: mr, driven: d}
	}
	return mr
}

// meteredDriven passes a caller-driven collective's started all-reduces
// through. Between one Wait and the next (a step's buckets), it adds up
// the bytes started and the time the caller spent inside the collective
// (Start, Progress, Wait): that is the step's all-reduce, recorded at Wait
// as one latency and one bus bandwidth. The time from a Start to its Wait
// would be mostly backward's computation, not the all-reduce's.
type meteredDriven struct {
	meteredReducer
	driven trainer.CallerDrivenReducer
	bytes  int64
	inside time.Duration
}

func (r *meteredDriven) CallerDriven() bool { return r.driven.CallerDriven() }

func (r *meteredDriven) StartAllReduce(ctx context.Context, buf []float32) error {
	start := time.Now()
	err := r.driven.StartAllReduce(ctx, buf)
	r.inside += time.Since(start)
	r.bytes += int64(len(buf)) * 4
	return err
}

func (r *meteredDriven) Progress() error {
	start := time.Now()
	err := r.driven.Progress()
	r.inside += time.Since(start)
	return err
}

func (r *meteredDriven) Wait() error {
	start := time.Now()
	err := r.driven.Wait()
	took, bytes := r.inside+time.Since(start), r.bytes
	r.inside, r.bytes = 0, 0
	if err == nil && bytes > 0 {
		r.record(bytes, took)
	}
	return err
}

// meteredReducer times the collective a trainer uses.
type meteredReducer struct {
	trainer.Reducer
	m *rankMetrics
}

func (r meteredReducer) AllReduce(ctx context.Context, buf []float32) error {
	start := time.Now()
	err := r.Reducer.AllReduce(ctx, buf)
	if err != nil || r.Reducer.World() < 2 {
		return err
	}
	r.record(int64(len(buf))*4, time.Since(start))
	return nil
}

// record counts one all-reduce of bytes that took took.
func (r meteredReducer) record(bytes int64, took time.Duration) {
	if r.Reducer.World() < 2 {
		return
	}
	r.m.allReduceLatency.Record(took)
	r.m.reducedBytes.Inc(bytes)
	if bytes >= metricname.BusBandwidthFloor && took > 0 {
		n := float64(r.Reducer.World())
		r.m.busBW.Update(2 * (n - 1) / n * float64(bytes) / took.Seconds())
	}
}

// tracer makes the agent's spans (gang.join, epoch.train, epoch.evaluate,
// checkpoint.save, checkpoint.restore) under the activity's span that
// Temporal's tracing interceptor starts; a no-op unless the worker traces.
var tracer = otel.Tracer("durabletrain/activities")

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
