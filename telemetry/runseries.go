package telemetry

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// A worker lives for months and trains run after run, each with its own
// series (tags run and rank): OpenTelemetry's SDK keeps every attribute set
// a synchronous instrument ever saw, and past its cardinality limit (2,000
// per instrument) folds new ones into one overflow series, so a worker that
// had run 2,000 ranks showed no new run's steps at all (measured: run 2,499
// of 2,500 absent from /metrics). The per-rank names (metricname.PerRank)
// therefore bypass it: runSeries keeps their series while their run trains
// on this worker, and forgets a run's series once none of them was updated
// for the retention (a live rank updates its heartbeat timestamp every
// few seconds, so a long evaluation or checkpoint does not count as idle).

// DefaultRunRetention is how long a run's series stay on /metrics after the
// last update of any of them on this worker (Options.RunRetention): long
// enough for Prometheus to scrape a finished run's last values many times.
const DefaultRunRetention = 10 * time.Minute

// DefaultMaxRunSeries bounds the per-rank series a worker keeps
// (Options.MaxRunSeries): a rank has about 15 series and a few per metric
// its epochs report, so this is hundreds of ranks at once.
const DefaultMaxRunSeries = 20000

// runSeries is a prometheus.Collector of the per-rank metrics' series.
type runSeries struct {
	retention time.Duration
	max       int
	log       *zap.Logger
	now       func() time.Time // time.Now; tests move it
	dropped   prometheus.Counter

	mu        sync.Mutex
	series    map[string]*series // by name and labels (seriesKey)
	kinds     map[string]seriesKind
	runs      map[string]*runEntry // by the run label's value
	lastSweep time.Time
	warned    time.Time // the last refusal logged
}

type seriesKind int

const (
	counterKind seriesKind = iota + 1
	gaugeKind
	timerKind
)

func (k seriesKind) String() string {
	return [...]string{"", "counter", "gauge", "timer"}[k]
}

// runEntry is when any of one run's series on this worker was last updated.
type runEntry struct {
	last atomic.Int64 // unix nanoseconds
}

// series is one series: a client_golang metric with its labels as constant
// labels. gone is set once it is forgotten; its instruments then look up
// (or make) the series anew at their next update.
type series struct {
	run    *runEntry
	metric prometheus.Metric
	gone   atomic.Bool
}

func newRunSeries(retention time.Duration, max int, log *zap.Logger) *runSeries {
	if retention <= 0 {
		retention = DefaultRunRetention
	}
	if max <= 0 {
		max = DefaultMaxRunSeries
	}
	return &runSeries{retention: retention, max: max, log: log, now: time.Now,
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "durabletrain_metric_series_refused_total",
			Help: "Per-rank series not kept because the worker already kept its maximum (-metrics-max-run-series)."}),
		series: map[string]*series{}, kinds: map[string]seriesKind{}, runs: map[string]*runEntry{}}
}

// Describe sends nothing: the series come and go with runs (an unchecked collector).
func (s *runSeries) Describe(chan<- *prometheus.Desc) {}

// Collect forgets idle runs' series, then sends the rest.
func (s *runSeries) Collect(ch chan<- prometheus.Metric) {
	s.mu.Lock()
	s.sweepLocked()
	metrics := make([]prometheus.Metric, 0, len(s.series))
	for _, se := range s.series {
		metrics = append(metrics, se.metric)
	}
	s.mu.Unlock()
	for _, m := range metrics {
		ch <- m
	}
	ch <- s.dropped
}

// sweepLocked forgets every series of a run none of whose series was
// updated within the retention.
func (s *runSeries) sweepLocked() {
	now := s.now()
	s.lastSweep = now
	cutoff := now.Add(-s.retention).UnixNano()
	idle := map[*runEntry]bool{}
	for k, r := range s.runs {
		if r.last.Load() < cutoff {
			idle[r] = true
			delete(s.runs, k)
		}
	}
	if len(idle) == 0 {
		return
	}
	for k, se := range s.series {
		if idle[se.run] {
			se.gone.Store(true)
			delete(s.series, k)
		}
	}
}

// get returns the series of name and labels, made if need be; nil if the
// worker keeps its maximum already or name is already another kind.
func (s *runSeries) get(kind seriesKind, name string, labels map[string]string) *series {
	key := seriesKey(name, labels)
	s.mu.Lock()
	defer s.mu.Unlock()
	if k, ok := s.kinds[name]; ok && k != kind {
		s.warnLocked("metric not recorded: the name is already another kind", zap.String("name", name),
			zap.Stringer("kind", kind), zap.Stringer("recorded_as", k))
		return nil
	}
	if se := s.series[key]; se != nil {
		return se
	}
	if len(s.series) >= s.max && s.now().Sub(s.lastSweep) > time.Second {
		s.sweepLocked() // nobody may be scraping: forget idle runs here too
	}
	if len(s.series) >= s.max {
		s.dropped.Inc()
		s.warnLocked("metric series not kept: the worker keeps its maximum of per-rank series; raise -metrics-max-run-series or lower -metrics-run-retention",
			zap.String("name", name), zap.Int("max", s.max))
		return nil
	}
	s.kinds[name] = kind
	runKey := labels["run"]
	r := s.runs[runKey]
	if r == nil {
		r = &runEntry{}
		r.last.Store(s.now().UnixNano())
		s.runs[runKey] = r
	}
	se := &series{run: r, metric: newMetric(kind, name, labels)}
	s.series[key] = se
	return se
}

func (s *runSeries) warnLocked(msg string, fields ...zap.Field) {
	if now := s.now(); now.Sub(s.warned) >= time.Minute {
		s.warned = now
		s.log.Warn(msg, fields...)
	}
}

// newMetric makes the client_golang metric of a series, named as the
// OpenTelemetry exporter names the SDK's instruments: counters _total,
// timers a histogram in seconds (secondsBuckets).
func newMetric(kind seriesKind, name string, labels map[string]string) prometheus.Metric {
	help := "durabletrain's " + name + " (telemetry/metricname)."
	switch kind {
	case counterKind:
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name + "_total", Help: help, ConstLabels: labels})
	case gaugeKind:
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	default:
		if v, ok := labels["le"]; ok { // a histogram's own label: client_golang would panic
			labels = maps.Clone(labels)
			delete(labels, "le")
			labels["le_"] = v
		}
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name + "_seconds", Help: help, ConstLabels: labels, Buckets: secondsBuckets})
	}
}

// seriesKey names a series uniquely: its name and its sorted labels.
func seriesKey(name string, labels map[string]string) string {
	var b strings.Builder
	b.WriteString(name)
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte(0)
		b.WriteString(labels[k])
	}
	return b.String()
}

// promLabels are tags as Prometheus takes them: names of letters, digits
// and underscores (others become _), values valid UTF-8. A label client_golang
// refused would fail every scrape of the worker, and a rank's reported metric
// names come from the user's program.
func promLabels(tags map[string]string) map[string]string {
	out := make(map[string]string, len(tags))
	for k, v := range tags {
		out[promLabelName(k)] = strings.ToValidUTF8(v, "\uFFFD")
	}
	return out
}

func promLabelName(k string) string {
	if k == "" {
		return "_"
	}
	b := []byte(k)
	for i, c := range b {
		ok := c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9'
		if !ok {
			b[i] = '_'
		}
	}
	if strings.HasPrefix(string(b), "__") {
		b[0] = 'x' // names beginning __ are Prometheus's own
	}
	if !utf8.Valid(b) {
		return "_"
	}
	return string(b)
}

// runAwareHandler is the worker's client.MetricsHandler: the per-rank names
// go to runSeries, every other to the OpenTelemetry handler.
type runAwareHandler struct {
	base  client.MetricsHandler
	tags  map[string]string
	store *runSeries
}

var perRank = func() map[string]bool {
	m := map[string]bool{}
	for _, n := range metricname.PerRank {
		m[n] = true
	}
	return m
}()

func (h *runAwareHandler) WithTags(tags map[string]string) client.MetricsHandler {
	merged := make(map[string]string, len(h.tags)+len(tags))
	maps.Copy(merged, h.tags)
	maps.Copy(merged, tags)
	return &runAwareHandler{base: h.base.WithTags(tags), tags: merged, store: h.store}
}

func (h *runAwareHandler) Counter(name string) client.MetricsCounter {
	if !perRank[name] {
		return h.base.Counter(name)
	}
	return &runInstrument{h: h, kind: counterKind, name: name}
}

func (h *runAwareHandler) Gauge(name string) client.MetricsGauge {
	if !perRank[name] {
		return h.base.Gauge(name)
	}
	return &runInstrument{h: h, kind: gaugeKind, name: name}
}

func (h *runAwareHandler) Timer(name string) client.MetricsTimer {
	if !perRank[name] {
		return h.base.Timer(name)
	}
	return &runInstrument{h: h, kind: timerKind, name: name}
}

// runInstrument records into its series, looking it up (or making it) again
// once the series was forgotten: a rank whose run came back to this worker
// after the retention starts its series anew.
type runInstrument struct {
	h    *runAwareHandler
	kind seriesKind
	name string
	cur  atomic.Pointer[series]
	// retryAt is when an instrument refused its series (the bound reached,
	// the name another kind) asks again: until then it records nothing
	// without taking the store's lock, at every step.
	retryAt atomic.Int64
}

func (i *runInstrument) series() *series {
	now := i.h.store.now().UnixNano()
	se := i.cur.Load()
	if se == nil || se.gone.Load() {
		if now < i.retryAt.Load() {
			return nil
		}
		if se = i.h.store.get(i.kind, i.name, promLabels(i.h.tags)); se == nil {
			i.retryAt.Store(now + int64(time.Second))
			return nil
		}
		i.cur.Store(se)
	}
	se.run.last.Store(now)
	return se
}

func (i *runInstrument) Inc(v int64) {
	if se := i.series(); se != nil && v >= 0 {
		se.metric.(prometheus.Counter).Add(float64(v))
	}
}

func (i *runInstrument) Update(v float64) {
	if se := i.series(); se != nil {
		se.metric.(prometheus.Gauge).Set(v)
	}
}

func (i *runInstrument) Record(d time.Duration) {
	if se := i.series(); se != nil {
		se.metric.(prometheus.Histogram).Observe(d.Seconds())
	}
}
