package gpuworker

import (
	"context"
	"strconv"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/activities"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// sampleEvery is how often the slot and GPU gauges are read: finer than a
// Prometheus scrape (15 s by default) and cheap (a lock and an NVML call per GPU).
const sampleEvery = 2 * time.Second

// sampleAgent records the agent's free and held slots and each GPU's load
// until ctx ends.
func sampleAgent(ctx context.Context, h client.MetricsHandler, agent *activities.Agent, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	free, held := h.WithTags(map[string]string{"state": "free"}).Gauge(metricname.Slots), h.WithTags(map[string]string{"state": "held"}).Gauge(metricname.Slots)
	for {
		f, hd := agent.SlotCounts()
		free.Update(float64(f))
		held.Update(float64(hd))
		if agent.Devices != nil {
			for _, slot := range agent.Slots {
				g, ok := agent.Devices.Stats(slot)
				if slot.GPU == "" || !ok {
					continue
				}
				gh := h.WithTags(map[string]string{"gpu": strconv.Itoa(slot.Index), "gpu_name": slot.GPU})
				gh.Gauge(metricname.GPUUtilization).Update(float64(g.UtilizationPercent))
				gh.Gauge(metricname.GPUMemoryUsed).Update(float64(g.MemoryUsedBytes))
				gh.Gauge(metricname.GPUMemoryTotal).Update(float64(g.MemoryTotalBytes))
				gh.Gauge(metricname.GPUTemperature).Update(float64(g.TemperatureCelsius))
				gh.Gauge(metricname.GPUPowerWatts).Update(g.PowerWatts)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
