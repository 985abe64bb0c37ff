package telemetry

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

func scrape(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// What goes through the handler comes out of /metrics in Prometheus' text
// format, with the SDK's naming (counters _total, timers _seconds) and
// buckets fit for seconds.
func TestMetricsReachPrometheus(t *testing.T) {
	tel, err := New(context.Background(), Options{Service: "test", Version: "v0.0.0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Close(context.Background())
	addr, err := tel.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := tel.Metrics.WithTags(map[string]string{"run": "r1", "rank": "0"})
	h.Counter(metricname.Steps).Inc(3)
	h.Gauge(metricname.Epoch).Update(2)
	h.Timer(metricname.AllReduceLatency).Record(300 * time.Microsecond)
	code, body := scrape(t, "http://"+addr+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	for _, want := range []string{
		`durabletrain_steps_total{rank="0",run="r1"} 3`,
		`durabletrain_epoch{rank="0",run="r1"} 2`,
		`durabletrain_allreduce_latency_seconds_bucket{rank="0",run="r1",le="0.0005"} 1`,
		`durabletrain_allreduce_latency_seconds_bucket{rank="0",run="r1",le="0.00025"} 0`,
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
}

func TestHealthEndpoints(t *testing.T) {
	tel, err := New(context.Background(), Options{Service: "test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Close(context.Background())
	addr, err := tel.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if code, _ := scrape(t, "http://"+addr+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	tel.Health.SetNotReady("connecting to Temporal at 127.0.0.1:7233 (attempt 3)")
	if code, body := scrape(t, "http://"+addr+"/readyz"); code != 503 || !strings.Contains(body, "attempt 3") {
		t.Fatalf("/readyz while connecting: %d %q; want 503 and why", code, body)
	}
	tel.Health.SetReady()
	if code, _ := scrape(t, "http://"+addr+"/readyz"); code != 200 {
		t.Fatalf("/readyz when ready: %d", code)
	}
	tel.Health.SetNotReady("shutting down")
	if code, _ := scrape(t, "http://"+addr+"/readyz"); code != 503 {
		t.Fatalf("/readyz while shutting down: %d", code)
	}
	if code, _ := scrape(t, "http://"+addr+"/healthz"); code != 200 {
		t.Fatal("/healthz must stay up while the worker drains: a failing liveness probe would kill it mid-checkpoint")
	}
}

// A metric recorded under one name with two kinds is dropped with a warning,
// never a panic (the SDK handler's default).
func TestAMetricErrorDoesNotPanic(t *testing.T) {
	tel, err := New(context.Background(), Options{Service: "test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Close(context.Background())
	tel.Metrics.Counter("durabletrain_clash").Inc(1)
	tel.Metrics.Gauge("durabletrain_clash").Update(1)
	if _, err := tel.Registry.Gather(); err != nil {
		t.Logf("gather: %v", err)
	}
}
