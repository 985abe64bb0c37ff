package gpuworker

import (
	"context"
	"strconv"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/activities"
	"github.com/durabletrain/durabletrain/telemetry/metricname"
)

// sampleEvery is how often the GPU gauges are read: finer than a
// Prometheus scrape (15 s by default) and cheap (a lock and an NVML call per GPU).
const sampleEvery = 2 * time.Second

// slotGauges is the agent's SlotsChanged: the free, held and withdrawn
// gauges, updated the moment a slot is taken or freed, or its GPU withdrawn
// from service or brought back.
func slotGauges(h client.MetricsHandler) func(free, held, withdrawn int) {
	gauge := func(state string) client.MetricsGauge {
		return h.WithTags(map[string]string{"state": state}).Gauge(metricname.Slots)
	}
	free, held, out := gauge("free"), gauge("held"), gauge("withdrawn")
	return func(f, hd, w int) {
		free.Update(float64(f))
		held.Update(float64(hd))
		out.Update(float64(w))
	}
}

// sampleGPUs records each GPU's load every interval until ctx ends.
func sampleGPUs(ctx context.Context, h client.MetricsHandler, agent *activities.Agent, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
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
