package integration

import (
	"context"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// spanCollector is an OTLP/gRPC trace receiver: what a worker started with
// -tracing exports arrives here, over the real protocol.
type spanCollector struct {
	collectortrace.UnimplementedTraceServiceServer
	mu     sync.Mutex
	names  map[string]int
	traces map[string]map[string]bool // trace ID → span names in it
}

func (c *spanCollector) Export(_ context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				c.names[s.Name]++
				id := string(s.TraceId)
				if c.traces[id] == nil {
					c.traces[id] = map[string]bool{}
				}
				c.traces[id][s.Name] = true
			}
		}
	}
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// TestWorkerExportsTraces: with -tracing a worker exports Temporal's spans
// (the workflow, its activities) and ours (gang.join, epoch.train,
// epoch.evaluate, checkpoint.save) in the same traces.
func TestWorkerExportsTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	col := &spanCollector{names: map[string]int{}, traces: map[string]map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, col)
	go srv.Serve(ln)
	defer srv.Stop()

	queue := "it-tracing"
	startWorkerWith(t, "worker-t", "both", queue, append(append([]string{}, testPolicy...),
		"-tracing", "-otlp-endpoint", ln.Addr().String(), "-otlp-insecure"))
	c := dial(t)
	p := awaitRun(t, startRun(t, c, "it-tracing-1", queue, subsetSpec(t, queue, 1, 2)), 3*time.Minute)
	if p.Epoch != 2 {
		t.Fatalf("the run ended at epoch %d", p.Epoch)
	}
	want := []string{"RunWorkflow:TrainingWorkflow", "StartActivity:RunEpoch", "RunActivity:RunEpoch", "RunActivity:HoldSlot",
		"gang.join", "epoch.train", "epoch.evaluate", "checkpoint.save"}
	deadline := time.Now().Add(15 * time.Second) // the exporter batches for a second
	for {
		col.mu.Lock()
		var missing []string
		for _, n := range want {
			if col.names[n] == 0 {
				missing = append(missing, n)
			}
		}
		// Ours sit in the same trace as Temporal's activity span.
		together := false
		for _, names := range col.traces {
			together = together || names["RunActivity:RunEpoch"] && names["epoch.train"] && names["checkpoint.save"]
		}
		var seen []string
		for n := range col.names {
			seen = append(seen, n)
		}
		col.mu.Unlock()
		if len(missing) == 0 && together {
			break
		}
		if time.Now().After(deadline) {
			sort.Strings(seen)
			t.Fatalf("spans missing: %v (epoch spans in the activity's trace: %v); received %v", missing, together, seen)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
