package telemetry

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newTestTelemetry serves a Telemetry whose per-rank series run on a fake
// clock, and returns a scrape of its /metrics.
func newTestTelemetry(t *testing.T, o Options, log *zap.Logger) (*Telemetry, *fakeClock, func() string) {
	t.Helper()
	o.Service = "test"
	tel, err := New(context.Background(), o, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tel.Close(context.Background()) })
	clock := &fakeClock{now: time.Unix(1_800_000_000, 0)}
	tel.runs.now = clock.Now
	addr, err := tel.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return tel, clock, func() string {
		t.Helper()
		code, body := scrape(t, "http://"+addr+"/metrics")
		if code != 200 {
			t.Fatalf("/metrics: %d\n%s", code, body)
		}
		return body
	}
}

// rankSeries records what an epoch of a rank records (a step, its position,
// a reported metric, a checkpoint's latency).
func rankSeries(tel *Telemetry, run string, rank int) {
	h := tel.Metrics.WithTags(map[string]string{"activity_type": "RunEpoch", "run": run, "rank": fmt.Sprint(rank)})
	h.Counter(metricname.Steps).Inc(10)
	h.Gauge(metricname.Epoch).Update(3)
	h.WithTags(map[string]string{"name": "test_accuracy"}).Gauge(metricname.ReportedMetric).Update(0.9)
	h.WithTags(map[string]string{"op": "save"}).Timer(metricname.CheckpointLatency).Record(2 * time.Second)
}

// A worker that ran thousands of ranks shows the newest run's series as it
// did the first's, and has forgotten the runs idle for longer than the
// retention (before, OpenTelemetry's limit of 2,000 attribute sets per
// instrument hid every run after about the 2,000th rank, for good).
func TestAWorkerThatRanThousandsOfRanksShowsTheNewestRuns(t *testing.T) {
	tel, clock, scrapeNow := newTestTelemetry(t, Options{}, nil)
	const runs = 2500
	for i := range runs {
		rankSeries(tel, fmt.Sprintf("run-%d", i), 0)
		clock.advance(time.Second)
		if i%500 == 0 {
			scrapeNow() // Prometheus scrapes as runs go by
		}
	}
	body := scrapeNow()
	for _, want := range []string{
		`durabletrain_steps_total{activity_type="RunEpoch",rank="0",run="run-2499"} 10`,
		`durabletrain_epoch{activity_type="RunEpoch",rank="0",run="run-2499"} 3`,
		`durabletrain_metric{activity_type="RunEpoch",name="test_accuracy",rank="0",run="run-2499"} 0.9`,
		`durabletrain_checkpoint_latency_seconds_bucket{activity_type="RunEpoch",op="save",rank="0",run="run-2499",le="2.5"} 1`,
		`run="run-1900"`, // idle for 600 s: the retention
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	for _, gone := range []string{`run="run-0"`, `run="run-1898"`} {
		if strings.Contains(body, gone) {
			t.Errorf("/metrics still shows %s, idle for longer than the retention", gone)
		}
	}
	if n := strings.Count(body, "\ndurabletrain_steps_total{"); n != 600 {
		t.Errorf("%d runs' steps on /metrics; want the 600 updated within the retention", n)
	}
	if strings.Contains(body, "otel_metric_overflow") {
		t.Error("an overflow series: some series were folded together")
	}
}

// A run whose ranks still live keeps its series however long it trains
// (its heartbeat updates one); an idle run's go; a rank that records
// through an instrument made before its run was forgotten starts its series
// anew instead of recording into nothing.
func TestALiveRunKeepsItsSeriesAndAnIdleOneLosesThem(t *testing.T) {
	tel, clock, scrapeNow := newTestTelemetry(t, Options{RunRetention: 5 * time.Minute}, nil)
	live := tel.Metrics.WithTags(map[string]string{"run": "live", "rank": "0"})
	idle := tel.Metrics.WithTags(map[string]string{"run": "idle", "rank": "1"})
	liveSteps, beat := live.Counter(metricname.Steps), live.Gauge(metricname.RankHeartbeat)
	idleSteps := idle.Counter(metricname.Steps)
	liveSteps.Inc(5)
	idleSteps.Inc(7)
	for range 60 { // an hour's evaluation: no step, a heartbeat a minute
		clock.advance(time.Minute)
		beat.Update(float64(clock.Now().Unix()))
		scrapeNow()
	}
	body := scrapeNow()
	if !strings.Contains(body, `durabletrain_steps_total{rank="0",run="live"} 5`) {
		t.Errorf("the live run's steps are gone:\n%s", body)
	}
	if strings.Contains(body, `run="idle"`) {
		t.Errorf("the idle run's series are still there:\n%s", body)
	}
	idleSteps.Inc(2) // the run came back to this worker
	if body := scrapeNow(); !strings.Contains(body, `durabletrain_steps_total{rank="1",run="idle"} 2`) {
		t.Errorf("the run that came back records nothing:\n%s", body)
	}
}

// Past MaxRunSeries a worker keeps no new series (it counts and logs them
// refused), and keeps new ones again once idle runs are forgotten, even
// without a scrape.
func TestPerRankSeriesAreBounded(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	tel, clock, scrapeNow := newTestTelemetry(t, Options{RunRetention: time.Minute, MaxRunSeries: 10}, zap.New(core))
	h := tel.Metrics.WithTags(map[string]string{"run": "chatty", "rank": "0"})
	for i := range 15 {
		h.WithTags(map[string]string{"name": fmt.Sprint("m", i)}).Gauge(metricname.ReportedMetric).Update(1)
	}
	body := scrapeNow()
	if n := strings.Count(body, "\ndurabletrain_metric{"); n != 10 {
		t.Errorf("%d series kept; want 10", n)
	}
	if !strings.Contains(body, "durabletrain_metric_series_refused_total 5") {
		t.Errorf("the refused series are not counted:\n%s", body)
	}
	if logs.FilterMessageSnippet("-metrics-max-run-series").Len() != 1 {
		t.Errorf("want one warning naming the flag, logged %v", logs.All())
	}
	clock.advance(2 * time.Minute)
	tel.Metrics.WithTags(map[string]string{"run": "next", "rank": "0"}).Counter(metricname.Steps).Inc(1)
	if body := scrapeNow(); !strings.Contains(body, `durabletrain_steps_total{rank="0",run="next"} 1`) {
		t.Errorf("no room for a new run once the old one was idle:\n%s", body)
	}
}

// Tags no Prometheus label takes (a name with a dash, one of the label
// names Prometheus keeps for itself, a value that is not UTF-8, the
// histograms' own le) and one name recorded as two kinds lose at most their
// own series: /metrics still serves every other, and nothing panics
// (client_golang panics on a histogram labelled le, and a series it refuses
// fails the whole scrape unless the handler continues on errors).
func TestHostileTagsDoNotBreakMetrics(t *testing.T) {
	tel, _, scrapeNow := newTestTelemetry(t, Options{}, nil)
	h := tel.Metrics.WithTags(map[string]string{"run": "r\xff\xfe", "rank": "0", "task-queue": "q", "__name__": "x", "le": "1"})
	h.WithTags(map[string]string{"name": "loss\"\n{}"}).Gauge(metricname.ReportedMetric).Update(1)
	h.Timer(metricname.StepLatency).Record(time.Millisecond)
	h.Counter(metricname.Steps).Inc(-3) // a counter never goes down
	h.Gauge(metricname.Steps).Update(1) // a counter recorded as a gauge
	tel.Metrics.WithTags(map[string]string{"run": "good", "rank": "0"}).Counter(metricname.Samples).Inc(64)
	body := scrapeNow()
	for _, want := range []string{
		`durabletrain_samples_total{rank="0",run="good"} 64`,
		`durabletrain_step_latency_seconds_count{`,
		`task_queue="q"`,
		`durabletrain_steps_total{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
}

// Ranks record while Prometheus scrapes and idle runs are forgotten: a
// run that keeps recording loses no update (its counter is exact), and the
// runs idle for longer than the retention are gone (run under -race, which
// make test's race pass does).
func TestPerRankSeriesUnderConcurrentUse(t *testing.T) {
	tel, clock, scrapeNow := newTestTelemetry(t, Options{RunRetention: time.Minute}, nil)
	const ranks, steps = 4, 2000
	var wg sync.WaitGroup
	for r := range ranks {
		wg.Go(func() {
			steady := tel.Metrics.WithTags(map[string]string{"run": "steady", "rank": "0"}).Counter(metricname.Steps)
			for i := range steps {
				steady.Inc(1)
				// A run of its own every 100 steps, recorded once, then idle.
				h := tel.Metrics.WithTags(map[string]string{"run": fmt.Sprint("brief-", r, "-", i/100), "rank": fmt.Sprint(r)})
				h.Timer(metricname.StepLatency).Record(time.Millisecond)
				if i%100 == 0 {
					clock.advance(time.Second)
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			scrapeNow()
		}
	})
	wg.Wait()
	// However the goroutines were scheduled (one may have run all its steps
	// before another began), every run is now idle for over a minute but the
	// steady one and each rank's newest, which record once more.
	clock.advance(time.Minute + time.Second)
	tel.Metrics.WithTags(map[string]string{"run": "steady", "rank": "0"}).Counter(metricname.Steps).Inc(0)
	for r := range ranks {
		tel.Metrics.WithTags(map[string]string{"run": fmt.Sprint("brief-", r, "-", steps/100-1), "rank": fmt.Sprint(r)}).
			Timer(metricname.StepLatency).Record(time.Millisecond)
	}
	body := scrapeNow()
	if want := fmt.Sprintf(`durabletrain_steps_total{rank="0",run="steady"} %d`, ranks*steps); !strings.Contains(body, want) {
		t.Errorf("/metrics lacks %s: updates lost while runs were forgotten", want)
	}
	for r := range ranks {
		if first := fmt.Sprintf(`run="brief-%d-0"`, r); strings.Contains(body, first) {
			t.Errorf("/metrics still shows %s, idle for longer than the retention", first)
		}
		if last := fmt.Sprintf(`run="brief-%d-19"`, r); !strings.Contains(body, last) {
			t.Errorf("/metrics lacks %s, the newest", last)
		}
	}
}
