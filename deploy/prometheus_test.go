package deploy

import (
	"os/exec"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/prometheus"
	"github.com/durabletrain/durabletrain/testkit/storeproc"
)

// TestAlertRulesPassPromtool: the alert rules the README recommends parse
// and check (promtool check rules), and each fires when, and only when, its
// unit tests say (promtool test rules prometheus/alerts_test.yml: a first
// failed run, whose counter series is born at 1, fires at once; slot
// requests that no agent takes fire after 10 minutes; a withdrawn GPU fires
// while it is out).
func TestAlertRulesPassPromtool(t *testing.T) {
	promtool, err := prometheus.Promtool()
	if err != nil {
		storeproc.Missing(t, err)
	}
	for _, args := range [][]string{{"check", "rules", "prometheus/alerts.yml"}, {"test", "rules", "prometheus/alerts_test.yml"}} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %v: %v\n%s", args, err, out)
		}
	}
}
