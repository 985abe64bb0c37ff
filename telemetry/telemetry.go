// Package telemetry owns what a durabletrain process tells its operators:
// metrics (the Temporal SDK's and durabletrain's own, one Prometheus registry
// served on /metrics), tracing (Temporal's OpenTelemetry interceptor and our
// spans, exported over OTLP), and the health endpoints /healthz and /readyz.
//
// Every metric goes through the SDK's client.MetricsHandler: the SDK's
// contrib/opentelemetry handler over an OpenTelemetry meter whose reader is
// the Prometheus exporter, except the per-rank ones (metricname.PerRank),
// kept in client_golang series that are forgotten once their run is idle
// (runseries.go). Workflow code records through
// workflow.GetMetricsHandler (the SDK drops what replay would repeat),
// activities through activity.GetMetricsHandler, the worker's samplers
// through Telemetry.Metrics. The names are package metricname's.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.temporal.io/sdk/client"
	temporalotel "go.temporal.io/sdk/contrib/opentelemetry"
	"go.temporal.io/sdk/interceptor"
	"go.uber.org/zap"
)

// Options say what to serve and where to send traces.
type Options struct {
	// Service names the process in traces and in target_info (worker, starter).
	Service string
	// Version is the release, a label of every series' target_info.
	Version string
	// Tracing sends spans over OTLP/gRPC, to OTLPEndpoint or where the
	// OTEL_EXPORTER_OTLP_* variables say (default localhost:4317).
	Tracing bool
	// OTLPEndpoint is host:port of the collector; empty: OTEL_EXPORTER_OTLP_ENDPOINT.
	OTLPEndpoint string
	// OTLPInsecure sends spans without TLS (a collector beside the worker).
	OTLPInsecure bool
	// RunRetention is how long a run's per-rank series (metricname.PerRank)
	// stay on /metrics after the last update of any of them; zero:
	// DefaultRunRetention.
	RunRetention time.Duration
	// MaxRunSeries bounds the per-rank series kept; zero: DefaultMaxRunSeries.
	MaxRunSeries int
}

// Telemetry is one process's metrics, tracing and health.
type Telemetry struct {
	Registry *prometheus.Registry
	// Metrics is the handler to give client.Options.MetricsHandler; the
	// worker's own samplers record through it too.
	Metrics client.MetricsHandler
	// Tracer makes our spans (a no-op one when tracing is off).
	Tracer trace.Tracer
	// Interceptors go into client.Options.Interceptors: Temporal's tracing
	// interceptor when tracing is on.
	Interceptors []interceptor.ClientInterceptor
	Health       *Health

	log      *zap.Logger
	runs     *runSeries
	shutdown []func(context.Context) error
	mu       sync.Mutex
	server   *http.Server
}

// secondsBuckets suit the durations we time, from a 4 KiB all-reduce (tens
// of microseconds) to gang formation and checkpoints (minutes). OpenTelemetry's
// default buckets are for milliseconds.
var secondsBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// New builds the registry, the meter provider that feeds it, and the tracer.
func New(ctx context.Context, o Options, log *zap.Logger) (*Telemetry, error) {
	if log == nil {
		log = zap.NewNop()
	}
	t := &Telemetry{Registry: prometheus.NewRegistry(), Health: NewHealth("starting"), log: log}
	t.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(t.Registry), otelprom.WithoutScopeInfo())
	if err != nil {
		return nil, fmt.Errorf("telemetry: the Prometheus exporter: %w", err)
	}
	res := resource.NewSchemaless(semconv.ServiceName("durabletrain-"+o.Service), semconv.ServiceVersion(o.Version))
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res),
		sdkmetric.WithView(sdkmetric.NewView(sdkmetric.Instrument{Kind: sdkmetric.InstrumentKindHistogram, Unit: "s"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: secondsBuckets}})))
	t.shutdown = append(t.shutdown, provider.Shutdown)
	otelHandler := temporalotel.NewMetricsHandler(temporalotel.MetricsHandlerOptions{
		Meter: provider.Meter("durabletrain"),
		// The SDK's default panics on an instrument error: a metric must never take a worker down.
		OnError:              func(err error) { log.Warn("metric not recorded", zap.Error(err)) },
		UseMonotonicCounters: true,
		InitialAttributes:    attribute.NewSet(),
	})
	t.runs = newRunSeries(o.RunRetention, o.MaxRunSeries, log)
	t.Registry.MustRegister(t.runs)
	t.Metrics = &runAwareHandler{base: otelHandler, tags: map[string]string{}, store: t.runs}
	t.Tracer = noop.NewTracerProvider().Tracer("durabletrain")
	if o.Tracing {
		opts := []otlptracegrpc.Option{}
		if o.OTLPEndpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpoint(o.OTLPEndpoint))
		}
		if o.OTLPInsecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("telemetry: the OTLP trace exporter: %w", err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(time.Second)), sdktrace.WithResource(res))
		t.shutdown = append(t.shutdown, tp.Shutdown)
		t.Tracer = tp.Tracer("durabletrain")
		// The agent's spans (package activities) go through the global provider.
		otel.SetTracerProvider(tp)
		otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}))
		ti, err := temporalotel.NewTracingInterceptor(temporalotel.TracerOptions{Tracer: tp.Tracer("temporal-sdk-go"),
			TextMapPropagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})})
		if err != nil {
			return nil, fmt.Errorf("telemetry: Temporal's tracing interceptor: %w", err)
		}
		t.Interceptors = append(t.Interceptors, ti)
	}
	return t, nil
}

// Handler serves /metrics, /healthz and /readyz.
func (t *Telemetry) Handler() http.Handler {
	mux := http.NewServeMux()
	// A series that cannot be gathered is logged and left out; the rest are served.
	mux.Handle("/metrics", promhttp.HandlerFor(t.Registry, promhttp.HandlerOpts{ErrorLog: zap.NewStdLog(t.log), Registry: t.Registry,
		ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", t.Health.serveLive)
	mux.HandleFunc("/readyz", t.Health.serveReady)
	return mux
}

// Listen serves Handler on addr until Close; it returns the bound address
// (":0" picks a port).
func (t *Telemetry) Listen(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("-metrics-listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: t.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, MaxHeaderBytes: 16 << 10}
	t.mu.Lock()
	t.server = srv
	t.mu.Unlock()
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.log.Error("the metrics and health endpoint stopped", zap.Error(err))
		}
	}()
	return ln.Addr().String(), nil
}

// Close stops serving and flushes the spans not yet exported.
func (t *Telemetry) Close(ctx context.Context) error {
	t.mu.Lock()
	srv := t.server
	t.mu.Unlock()
	var errs []error
	if srv != nil {
		errs = append(errs, srv.Shutdown(ctx))
	}
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}
