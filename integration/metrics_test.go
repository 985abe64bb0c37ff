package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/internal/netport"

	"github.com/durabletrain/durabletrain/spec"
)

// waitLine waits for a line of the worker's log matching re and returns its submatches.
func waitLine(t *testing.T, w *workerProc, re *regexp.Regexp, limit time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		w.logs.mu.Lock()
		for _, l := range w.logs.lines {
			if m := re.FindStringSubmatch(l); m != nil {
				w.logs.mu.Unlock()
				return m
			}
		}
		w.logs.mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s logged no line matching %s within %v", w.name, re, limit)
	return nil
}

// promSample sums the samples of a metric whose labels include every one of
// labels (`state="held"`), and says whether there was any.
func promSample(body, name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum, found = sum+v, true
		}
	}
	return sum, found
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestWorkerServesMetrics scrapes a real worker's /metrics while it trains
// a real run and checks that the values move: steps, all-reduce time and bus
// bandwidth, checkpoint bytes, gang formation, slots held then free, the
// epoch's reported metrics, the SDK's own metrics; and /readyz.
func TestWorkerServesMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-metrics"
	w := startWorkerWith(t, "worker-m", "both", queue, append(append([]string{}, testPolicy...), "-slots", "2", "-metrics-listen", "127.0.0.1:0"))
	addr := waitLine(t, w, regexp.MustCompile(`serving /metrics.*"address":"([0-9.:]+)"`), 30*time.Second)[1]
	base := "http://" + addr
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(t, base+"/readyz")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz never ready: %d %s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Fatalf("/healthz: %d", code)
	}
	scrape := func() string {
		code, body := get(t, base+"/metrics")
		if code != 200 {
			t.Fatalf("/metrics: %d\n%s", code, body)
		}
		return body
	}
	if free, _ := promSample(scrape(), "durabletrain_slots", `state="free"`); free != 2 {
		t.Errorf("before the run: %v slots free; want 2", free)
	}

	c := dial(t)
	s := subsetSpec(t, queue, 2, 4)
	run := startRun(t, c, "it-metrics-1", queue, s)
	// While it trains: the step counter moves between two scrapes.
	var first float64
	deadline = time.Now().Add(2 * time.Minute)
	for {
		body := scrape()
		steps, _ := promSample(body, "durabletrain_steps_total", `run="it-metrics-1"`)
		if held, _ := promSample(body, "durabletrain_slots", `state="held"`); steps > 0 && held != 2 {
			t.Errorf("while training: %v slots held; want 2", held)
		}
		if first == 0 && steps > 0 {
			first = steps
		} else if first > 0 && steps > first {
			t.Logf("steps counted %v, then %v", first, steps)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("durabletrain_steps_total did not move (first %v, now %v)", first, steps)
		}
		time.Sleep(100 * time.Millisecond)
	}
	p := awaitRun(t, run, 3*time.Minute)
	if p.Epoch != 4 {
		t.Fatalf("the run ended at epoch %d", p.Epoch)
	}
	// The run lets go of its holds before it closes, and the worker counts
	// the closed workflow once its last workflow task is done: wait for both.
	var body string
	for deadline := time.Now().Add(15 * time.Second); ; {
		body = scrape()
		held, _ := promSample(body, "durabletrain_slots", `state="held"`)
		completed, _ := promSample(body, "temporal_workflow_completed_total")
		if held == 0 && completed >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, c := range []struct {
		name   string
		labels []string
		min    float64
	}{
		{"durabletrain_steps_total", []string{`run="it-metrics-1"`}, 4 * 2 * 10},
		{"durabletrain_epoch", []string{`run="it-metrics-1"`}, 3},
		{"durabletrain_samples_per_second", []string{`run="it-metrics-1"`}, 1},
		{"durabletrain_rank_heartbeat_timestamp_seconds", []string{`run="it-metrics-1"`, `rank="1"`}, float64(time.Now().Add(-5 * time.Minute).Unix())},
		{"durabletrain_metric", []string{`name="test_accuracy"`, `run="it-metrics-1"`}, 0.5},
		{"durabletrain_metric", []string{`name="train_loss"`, `run="it-metrics-1"`}, 0.01},
		{"durabletrain_step_latency_seconds_count", []string{`run="it-metrics-1"`}, 10},
		{"durabletrain_allreduce_latency_seconds_count", []string{`run="it-metrics-1"`}, 10},
		{"durabletrain_allreduce_bytes_total", []string{`run="it-metrics-1"`}, 1 << 20},
		{"durabletrain_allreduce_bus_bandwidth_bytes_per_second", []string{`run="it-metrics-1"`}, 1e6},
		{"durabletrain_checkpoint_bytes_total", []string{`op="save"`, `run="it-metrics-1"`}, 100 << 10},
		{"durabletrain_checkpoint_latency_seconds_count", []string{`op="save"`}, 1},
		{"durabletrain_gang_formation_latency_seconds_count", nil, 1},
		{"durabletrain_runs_ended_total", []string{`state="completed"`}, 1},
		{"durabletrain_slots", []string{`state="free"`}, 2},
		{"durabletrain_worker_info", []string{`build_id="v`}, 1},
		{"temporal_activity_execution_latency_seconds_count", []string{`activity_type="RunEpoch"`}, 4},
		{"temporal_workflow_completed_total", nil, 1},
	} {
		v, ok := promSample(body, c.name, c.labels...)
		if !ok || v < c.min {
			t.Errorf("%s%v = %v (present %v); want at least %v", c.name, c.labels, v, ok, c.min)
		}
	}
	// The SDK series the Grafana dashboard charts are ones a worker serves
	// (failure counters appear only once something fails).
	dash, err := os.ReadFile("../deploy/grafana/durabletrain.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range regexp.MustCompile(`\btemporal_[a-z_]+`).FindAllString(string(dash), -1) {
		if !strings.Contains(n, "failure") && !strings.Contains(body, "\n"+n) {
			t.Errorf("the dashboard charts %s, which the worker does not serve", n)
		}
	}
	if held, _ := promSample(body, "durabletrain_slots", `state="held"`); held != 0 {
		t.Errorf("after the run: %v slots held; want 0", held)
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", body)
	}
	// A normal run's end warns of nothing.
	w.logs.mu.Lock()
	defer w.logs.mu.Unlock()
	for _, l := range w.logs.lines {
		if strings.Contains(l, `"level":"warn"`) && !strings.Contains(l, "no pool key") {
			t.Errorf("a warning in a normal run: %s", l)
		}
	}
}

// TestSlotsWantedIsTheGPUQueueBacklog: a run that asks for two slots no
// agent offers shows as durabletrain_slots_wanted 2 on the workflow
// worker's /metrics, the demand the KEDA ScaledObject scales agents by.
func TestSlotsWantedIsTheGPUQueueBacklog(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	queue := "it-demand"
	w := startWorkerWith(t, "worker-w", "workflows", queue, append(append([]string{}, testPolicy...), "-metrics-listen", "127.0.0.1:0"))
	addr := waitLine(t, w, regexp.MustCompile(`serving /metrics.*"address":"([0-9.:]+)"`), 30*time.Second)[1]
	c := dial(t)
	s := subsetSpec(t, queue, 2, 1)
	s.Scaling.GangTimeout = spec.Duration(10 * time.Minute)
	startRun(t, c, "it-demand-1", queue, s)
	defer c.CancelWorkflow(context.Background(), "it-demand-1", "")
	deadline := time.Now().Add(45 * time.Second)
	for {
		_, body := get(t, "http://"+addr+"/metrics")
		wanted, ok := promSample(body, "durabletrain_slots_wanted", `task_queue="it-demand"`)
		if ok && wanted == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("durabletrain_slots_wanted = %v (present %v); want 2, the run's two slot requests", wanted, ok)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// TestWorkerWaitsForTemporal: a worker started before Temporal answers is
// alive but not ready, says so, and keeps trying; once Temporal answers it
// becomes ready and trains.
func TestWorkerWaitsForTemporal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	// A port nothing listens on yet; later a forwarder to the server.
	port := netport.Free("127.0.0.1")
	if port == 0 {
		t.Fatal("no free port")
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	queue := "it-wait"
	w := startWorkerWith(t, "worker-late", "both", queue, append(append([]string{}, testPolicy...), "-metrics-listen", "127.0.0.1:0", "-address", addr))
	metrics := waitLine(t, w, regexp.MustCompile(`serving /metrics.*"address":"([0-9.:]+)"`), 30*time.Second)[1]
	waitLine(t, w, regexp.MustCompile(`cannot reach Temporal yet; trying again.*"attempt":2`), 60*time.Second)
	if code, body := get(t, "http://"+metrics+"/readyz"); code != 503 || !strings.Contains(body, "connecting to Temporal at "+addr) {
		t.Fatalf("/readyz while Temporal is away: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+metrics+"/healthz"); code != 200 {
		t.Fatalf("/healthz while Temporal is away: %d; the worker is alive", code)
	}
	// Temporal "comes up": forward the port to the real server.
	fwd, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	go func() {
		for {
			in, err := fwd.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", server.Addr())
			if err != nil {
				in.Close()
				continue
			}
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	deadline := time.Now().Add(60 * time.Second) // the backoff is at most 30 s
	for {
		if code, _ := get(t, "http://"+metrics+"/readyz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker did not become ready after Temporal came up")
		}
		time.Sleep(200 * time.Millisecond)
	}
	p := awaitRun(t, startRun(t, dial(t), "it-wait-1", queue, subsetSpec(t, queue, 1, 1)), 2*time.Minute)
	if p.State != spec.StateCompleted {
		t.Fatalf("the run on the late worker: %+v", p)
	}
}
