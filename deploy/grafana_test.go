package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// dashboardMetrics are the metric names the Grafana dashboard's queries use,
// without the suffixes Prometheus adds (_total, _seconds, _bucket, ...).
func dashboardMetrics(t *testing.T) []string {
	raw, err := os.ReadFile("grafana/durabletrain.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("grafana/durabletrain.json: %v", err)
	}
	ids := map[int]bool{}
	var names []string
	for _, p := range d.Panels {
		if ids[p.ID] || len(p.Targets) == 0 {
			t.Errorf("panel %q: id %d repeated, or no query", p.Title, p.ID)
		}
		ids[p.ID] = true
		for _, tg := range p.Targets {
			names = append(names, regexp.MustCompile(`\b(?:durabletrain|temporal)_[a-z_]+`).FindAllString(tg.Expr, -1)...)
		}
	}
	return names
}

// TestDashboardChartsOurMetrics: every durabletrain_ series the dashboard
// queries is one the code records (package metricname), so renaming a
// metric without the dashboard fails here. (The temporal_ ones are checked
// against a real worker's /metrics by the integration test.)
func TestDashboardChartsOurMetrics(t *testing.T) {
	known := map[string]bool{}
	for _, n := range metricname.All {
		known[n] = true
	}
	for _, n := range dashboardMetrics(t) {
		if !strings.HasPrefix(n, "durabletrain_") {
			continue
		}
		base := n
		for _, suffix := range []string{"_bucket", "_count", "_sum", "_seconds", "_total"} {
			base = strings.TrimSuffix(base, suffix)
		}
		if !known[base] && !known[n] {
			t.Errorf("the dashboard queries %s, which no code records (metricname.All)", n)
		}
	}
}
