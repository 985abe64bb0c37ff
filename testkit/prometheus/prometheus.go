// Package prometheus starts a real Prometheus server (Debian's package,
// which scripts/deps.sh test installs) for the tests that claim what a
// Prometheus makes of durabletrain's metrics: it scrapes the targets given
// every second, evaluates the rule files given every second, and answers
// PromQL through its HTTP API (Query, Alerts).
package prometheus

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/testkit/storeproc"
)

// Binary is the server to run: $PROMETHEUS_BIN, else Debian's /usr/bin/prometheus.
func Binary() (string, error) {
	if p := os.Getenv("PROMETHEUS_BIN"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("prometheus"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no prometheus on PATH (scripts/deps.sh test installs Debian's package; or set PROMETHEUS_BIN)")
}

// Promtool is Prometheus's rule checker beside it: $PROMTOOL_BIN, else promtool on PATH.
func Promtool() (string, error) {
	if p := os.Getenv("PROMTOOL_BIN"); p != "" {
		return p, nil
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no promtool on PATH (Debian's prometheus package has it: scripts/deps.sh test)")
}

// Server is a running Prometheus.
type Server struct {
	URL  string // http://127.0.0.1:port
	proc *storeproc.Proc
}

// Start runs bin with its data under dir, scraping targets (host:port of
// /metrics) and evaluating ruleFiles, every second.
func Start(bin, dir string, targets, ruleFiles []string) (*Server, error) {
	port, err := storeproc.FreePort()
	if err != nil {
		return nil, err
	}
	quoted := func(xs []string) string {
		q := make([]string, len(xs))
		for i, x := range xs {
			q[i] = strconv.Quote(x)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	config := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: %s\nscrape_configs:\n  - job_name: durabletrain\n    static_configs:\n      - targets: %s\n",
		quoted(ruleFiles), quoted(targets))
	configPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(configPath, []byte(config), 0o644); err != nil {
		return nil, err
	}
	s := &Server{URL: "http://127.0.0.1:" + strconv.Itoa(port)}
	cmd := exec.Command(bin, "--config.file="+configPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(port), "--log.level=warn")
	s.proc, err = storeproc.Start("Prometheus", cmd, filepath.Join(dir, "prometheus.log"), s.URL+"/-/ready",
		func(code int) bool { return code == http.StatusOK })
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Sample is one series of a query's answer.
type Sample struct {
	Metric map[string]string
	Value  float64
}

// Query evaluates expr now (an instant query) and returns its series.
func (s *Server) Query(ctx context.Context, expr string) ([]Sample, error) {
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := s.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr), &out); err != nil {
		return nil, err
	}
	if out.Status != "success" {
		return nil, fmt.Errorf("prometheus: %s: %s", expr, out.Error)
	}
	if out.Data.ResultType != "vector" {
		return nil, fmt.Errorf("prometheus: %s is a %s; want an instant vector", expr, out.Data.ResultType)
	}
	var samples []Sample
	for _, r := range out.Data.Result {
		str, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(str, 64)
		if err != nil {
			return nil, fmt.Errorf("prometheus: %s: value %v: %w", expr, r.Value[1], err)
		}
		samples = append(samples, Sample{Metric: r.Metric, Value: v})
	}
	return samples, nil
}

// Alert is an alert as the server's rules evaluate it now.
type Alert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"` // pending or firing
	Value  string            `json:"value"`
}

// Alerts are the server's pending and firing alerts.
func (s *Server) Alerts(ctx context.Context) ([]Alert, error) {
	var out struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []Alert `json:"alerts"`
		} `json:"data"`
	}
	if err := s.get(ctx, "/api/v1/alerts", &out); err != nil {
		return nil, err
	}
	return out.Data.Alerts, nil
}

// RuleHealth is each rule's name and health ("ok", or "err" with its
// lastError) as the server last evaluated it.
func (s *Server) RuleHealth(ctx context.Context) (map[string]string, error) {
	var out struct {
		Data struct {
			Groups []struct {
				Rules []struct {
					Name      string `json:"name"`
					Health    string `json:"health"`
					LastError string `json:"lastError"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"data"`
	}
	if err := s.get(ctx, "/api/v1/rules", &out); err != nil {
		return nil, err
	}
	h := map[string]string{}
	for _, g := range out.Data.Groups {
		for _, r := range g.Rules {
			h[r.Name] = strings.TrimSpace(r.Health + " " + r.LastError)
		}
	}
	return h, nil
}

func (s *Server) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// Log is what the server has written so far.
func (s *Server) Log() string { return s.proc.Log() }

// Stop kills the server.
func (s *Server) Stop() { s.proc.Stop() }
