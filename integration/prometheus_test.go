package integration

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/prometheus"
	"github.com/durabletrain/durabletrain/testkit/storeproc"
)

// dashboardQueries are the Grafana dashboard's queries, by panel title.
func dashboardQueries(t *testing.T) map[string][]string {
	raw, err := os.ReadFile("../deploy/grafana/durabletrain.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatal(err)
	}
	q := map[string][]string{}
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			q[p.Title] = append(q[p.Title], tg.Expr)
		}
	}
	return q
}

// TestPrometheusEvaluatesTheDashboardAndTheAlerts: a real Prometheus
// scrapes a real worker every second while a run trains, a run fails (its
// store refuses it) and a run waits for a slot no agent offers. Every query
// of the Grafana dashboard then returns data from it (but the GPU panels,
// on a machine with no GPU, and Temporal's request failures, which appear
// only once a request fails: those must still evaluate), and the alert
// rules of deploy/prometheus/alerts.yml evaluate without error, the failed
// run firing DurabletrainRunFailed and the starved run making
// DurabletrainSlotsStarved pending (it fires after 10 minutes, which
// promtool's unit tests check).
func TestPrometheusEvaluatesTheDashboardAndTheAlerts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Prometheus and a worker")
	}
	bin, err := prometheus.Binary()
	if err != nil {
		storeproc.Missing(t, err)
	}
	port, err := storeproc.FreePort() // nothing listens there: the failing run's store
	if err != nil {
		t.Fatal(err)
	}
	dead := "gs://gone?anonymous=true&endpoint=" + url.QueryEscape("http://127.0.0.1:"+strconv.Itoa(port))
	queue := "it-prom"
	flags := append(append([]string{}, testPolicy...), "-slots", "2", "-metrics-listen", "127.0.0.1:0")
	flags[1] += "," + dead // -storage-roots
	w := startWorkerWith(t, "worker-prom", "both", queue, flags)
	addr := waitLine(t, w, regexp.MustCompile(`serving /metrics.*"address":"([0-9.:]+)"`), 30*time.Second)[1]
	rules, err := filepath.Abs("../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	prom, err := prometheus.Start(bin, t.TempDir(), []string{addr}, []string{rules})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(prom.Stop)
	ctx := context.Background()
	c := dial(t)

	// A run that trains, one that fails, one that waits.
	if p := awaitRun(t, startRun(t, c, "it-prom-trains", queue, subsetSpec(t, queue, 2, 3)), 3*time.Minute); p.State != spec.StateCompleted {
		t.Fatalf("the training run: %+v", p)
	}
	failing := subsetSpec(t, queue, 1, 1)
	failing.Checkpoint.URL = "gs://gone?prefix=ckpt/"
	failing.Failure.MaxFailures = spec.Int(0)
	if err := startRun(t, c, "it-prom-fails", queue, failing).Get(ctx, nil); err == nil {
		t.Fatal("the run on a store that refuses connections completed")
	}
	starved := subsetSpec(t, queue, 3, 1) // three ranks; the one worker has two slots
	starved.Scaling.GangTimeout = spec.Duration(10 * time.Minute)
	startRun(t, c, "it-prom-starved", queue, starved)
	defer c.CancelWorkflow(ctx, "it-prom-starved", "")

	alert := func(name, state string) bool {
		alerts, err := prom.Alerts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range alerts {
			if a.Labels["alertname"] == name && a.State == state {
				return true
			}
		}
		return false
	}
	deadline := time.Now().Add(90 * time.Second)
	for !alert("DurabletrainRunFailed", "firing") || !alert("DurabletrainSlotsStarved", "pending") {
		if time.Now().After(deadline) {
			alerts, _ := prom.Alerts(ctx)
			t.Fatalf("after 90 s, the alerts are %+v; want DurabletrainRunFailed firing and DurabletrainSlotsStarved pending\nPrometheus:\n%s", alerts, prom.Log())
		}
		time.Sleep(time.Second)
	}
	health, err := prom.RuleHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"DurabletrainRunFailed", "DurabletrainSlotsStarved", "DurabletrainGPUWithdrawn"} {
		if health[name] != "ok" {
			t.Errorf("rule %s: health %q; want ok", name, health[name])
		}
	}
	// The GPU alert's series is there, at 0: no slot is withdrawn.
	if s, err := prom.Query(ctx, `durabletrain_slots{state="withdrawn"}`); err != nil || len(s) != 1 || s[0].Value != 0 {
		t.Errorf(`durabletrain_slots{state="withdrawn"}: %+v, %v; want one series at 0`, s, err)
	}

	// Every dashboard query, with its $run variable as Grafana's "All".
	for title, exprs := range dashboardQueries(t) {
		for _, expr := range exprs {
			q := strings.ReplaceAll(expr, "$run", ".+")
			samples, err := prom.Query(ctx, q)
			if err != nil {
				t.Errorf("panel %q: %s: %v", title, q, err)
				continue
			}
			mayBeEmpty := strings.Contains(expr, "durabletrain_gpu_") || strings.Contains(expr, "request_failure")
			if len(samples) == 0 && !mayBeEmpty {
				t.Errorf("panel %q: %s returned no data", title, q)
			}
		}
	}
}
