package connect

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// clean makes the test independent of the machine's Temporal environment.
func clean(t *testing.T) {
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "TEMPORAL_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	t.Setenv("TEMPORAL_CONFIG_FILE", filepath.Join(t.TempDir(), "none.toml"))
}

func TestDefaultsWithNothingSet(t *testing.T) {
	clean(t)
	var o Options
	o.Register(flag.NewFlagSet("x", flag.ContinueOnError))
	c, err := o.ClientOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HostPort != DefaultAddress || c.Namespace != DefaultNamespace || c.ConnectionOptions.TLS != nil || c.Credentials != nil {
		t.Fatalf("got %s %s tls=%v creds=%v", c.HostPort, c.Namespace, c.ConnectionOptions.TLS, c.Credentials)
	}
	if o.ControlQueue != "durabletrain" {
		t.Fatalf("control queue %q", o.ControlQueue)
	}
}

func TestEnvironmentThenFlags(t *testing.T) {
	clean(t)
	t.Setenv("TEMPORAL_ADDRESS", "env-host:7233")
	t.Setenv("TEMPORAL_NAMESPACE", "env-ns")
	t.Setenv("TEMPORAL_API_KEY", "k")
	var o Options
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o.Register(fs)
	c, err := o.ClientOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HostPort != "env-host:7233" || c.Namespace != "env-ns" || c.Credentials == nil || c.ConnectionOptions.TLS == nil {
		t.Fatalf("from the environment: %s %s creds=%v tls=%v (an API key implies TLS)", c.HostPort, c.Namespace, c.Credentials, c.ConnectionOptions.TLS)
	}
	if err := fs.Parse([]string{"-address", "flag-host:1", "-namespace", "flag-ns"}); err != nil {
		t.Fatal(err)
	}
	if c, _ = o.ClientOptions(nil); c.HostPort != "flag-host:1" || c.Namespace != "flag-ns" {
		t.Fatalf("flags should win: %s %s", c.HostPort, c.Namespace)
	}
}

func TestProfileFile(t *testing.T) {
	clean(t)
	file := filepath.Join(t.TempDir(), "temporal.toml")
	os.WriteFile(file, []byte("[profile.prod]\naddress = \"prod:7233\"\nnamespace = \"training\"\n[profile.prod.tls]\n"), 0o600)
	t.Setenv("TEMPORAL_CONFIG_FILE", file)
	t.Setenv("TEMPORAL_PROFILE", "prod")
	c, err := Options{}.ClientOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.HostPort != "prod:7233" || c.Namespace != "training" || c.ConnectionOptions.TLS == nil {
		t.Fatalf("got %s %s tls=%v", c.HostPort, c.Namespace, c.ConnectionOptions.TLS)
	}
	t.Setenv("TEMPORAL_PROFILE", "staging")
	if _, err := (Options{}).ClientOptions(nil); err == nil || !strings.Contains(err.Error(), "staging") {
		t.Fatalf("a missing profile: got %v, want an error naming it", err)
	}
}

func TestAPIKeyFromAnotherVariable(t *testing.T) {
	clean(t)
	o := Options{APIKeyEnv: "MY_KEY"}
	if _, err := o.ClientOptions(nil); err == nil || !strings.Contains(err.Error(), "MY_KEY is empty") {
		t.Fatalf("got %v, want the variable named", err)
	}
	t.Setenv("MY_KEY", "secret")
	c, err := o.ClientOptions(nil)
	if err != nil || c.Credentials == nil || c.ConnectionOptions.TLS == nil {
		t.Fatalf("got %v creds=%v tls=%v", err, c.Credentials, c.ConnectionOptions.TLS)
	}
}

// The SDK's warnings about a heartbeat after the run completed, or after it
// asked the activity to stop, are expected at every run's end: debug, not
// warn. Other heartbeat errors stay warnings.
func TestRunEndIsNotAWarning(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := SDKLogger(zap.New(core)).(interface {
		Warn(string, ...interface{})
	})
	l.Warn("RecordActivityHeartbeat with error", "Error", errors.New("workflow execution already completed"))
	l.Warn("RecordActivityHeartbeat with error", "Error", temporal.NewCanceledError()) // the run asked the hold to stop
	l.Warn("RecordActivityHeartbeat with error", "Error", errors.New("connection refused"))
	l.Warn("Task processing failed with error", "Error", temporal.NewCanceledError()) // not a heartbeat: stays
	all := logs.All()
	if len(all) != 4 || all[0].Level != zapcore.DebugLevel || all[1].Level != zapcore.DebugLevel ||
		all[2].Level != zapcore.WarnLevel || all[3].Level != zapcore.WarnLevel {
		t.Fatalf("logged %+v", all)
	}
	if all[1].ContextMap()["Error"] != "canceled" {
		t.Fatalf("the demoted line lost its error: %+v", all[1])
	}
}
