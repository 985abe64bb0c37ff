package workflows

import (
	"sync"

	"go.temporal.io/sdk/client"
)

// countingMetrics is a client.MetricsHandler that adds up the counters
// recorded through it, by name (tags ignored); gauges and timers go nowhere.
type countingMetrics struct {
	mu     sync.Mutex
	counts map[string]int64
}

func (m *countingMetrics) WithTags(map[string]string) client.MetricsHandler { return m }
func (m *countingMetrics) Counter(name string) client.MetricsCounter {
	return countedCounter{m, name}
}
func (m *countingMetrics) Gauge(string) client.MetricsGauge {
	return client.MetricsNopHandler.Gauge("")
}
func (m *countingMetrics) Timer(string) client.MetricsTimer {
	return client.MetricsNopHandler.Timer("")
}

// count is what the counter name has added up to.
func (m *countingMetrics) count(name string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counts[name]
}

type countedCounter struct {
	m    *countingMetrics
	name string
}

func (c countedCounter) Inc(n int64) {
	c.m.mu.Lock()
	defer c.m.mu.Unlock()
	c.m.counts[c.name] += n
}
