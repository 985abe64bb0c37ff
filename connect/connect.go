// Package connect owns how durabletrain's programs reach Temporal: the
// connection settings they share (flags, and the Temporal CLI's environment:
// TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_*,
// TEMPORAL_PROFILE and its TOML file, read by the SDK's contrib/envconfig),
// dialing, and the bridge from zap to the SDK's logger. It links the SDK's
// client only: the starter uses it without linking any worker code.
package connect

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/contrib/envconfig"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"

	"github.com/durabletrain/durabletrain/codec"
	"github.com/durabletrain/durabletrain/internal/keyfile"
	"github.com/durabletrain/durabletrain/spec"
)

// Defaults where neither a flag, the environment nor a profile says.
const (
	DefaultAddress   = "127.0.0.1:7233"
	DefaultNamespace = "default"
	DefaultAPIKeyEnv = "TEMPORAL_API_KEY"
)

// Options say where Temporal is and where durabletrain's workflows run.
// Empty fields come from the Temporal environment configuration, then the
// defaults above.
type Options struct {
	Address   string // host:port of the frontend
	Namespace string
	TLS       bool // TLS with the system's roots, where the environment sets no TLS of its own
	// APIKeyEnv names the environment variable holding an API key (Temporal
	// Cloud); default TEMPORAL_API_KEY.
	APIKeyEnv string
	// ControlQueue is the task queue of the workflows; default spec.DefaultControlQueue.
	ControlQueue string
	// Mutual TLS: the client's certificate and key, the CA that signed the
	// server's certificate (default the system's roots), and the name to
	// verify it by. Any of them turns TLS on.
	TLSCert, TLSKey, TLSCA, TLSServerName string
	// CodecKeyFile holds the payload codec key (package codec): every
	// starter and worker of a deployment is given the same one, and history
	// holds only ciphertext. Empty: payloads are plain JSON.
	CodecKeyFile string
}

// Register adds the connection flags to fs: -address, -namespace, -tls,
// -api-key-env, -tls-cert, -tls-key, -tls-ca, -tls-server-name,
// -codec-key-file and -control-queue.
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.Address, "address", o.Address, "Temporal frontend host:port (default $TEMPORAL_ADDRESS, the Temporal profile's, or "+DefaultAddress+")")
	fs.StringVar(&o.Namespace, "namespace", o.Namespace, "Temporal namespace (default $TEMPORAL_NAMESPACE, the Temporal profile's, or "+DefaultNamespace+")")
	fs.BoolVar(&o.TLS, "tls", o.TLS, "connect with TLS (set by $TEMPORAL_TLS*, the profile, or an API key too)")
	fs.StringVar(&o.APIKeyEnv, "api-key-env", o.APIKeyEnv, "environment variable holding a Temporal Cloud API key (default "+DefaultAPIKeyEnv+")")
	fs.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "client certificate (PEM) for mutual TLS (or $TEMPORAL_TLS_CLIENT_CERT_PATH)")
	fs.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "client private key (PEM) for mutual TLS (or $TEMPORAL_TLS_CLIENT_KEY_PATH)")
	fs.StringVar(&o.TLSCA, "tls-ca", o.TLSCA, "CA certificate (PEM) the server's certificate must chain to (default the system's roots; or $TEMPORAL_TLS_SERVER_CA_CERT_PATH)")
	fs.StringVar(&o.TLSServerName, "tls-server-name", o.TLSServerName, "name the server's certificate must carry (default the -address host)")
	if o.CodecKeyFile == "" {
		o.CodecKeyFile = os.Getenv("DURABLETRAIN_CODEC_KEY_FILE")
	}
	fs.StringVar(&o.CodecKeyFile, "codec-key-file", o.CodecKeyFile, "file holding the payload encryption key (at least 32 bytes, mode 600; default $DURABLETRAIN_CODEC_KEY_FILE): history then holds only ciphertext; give every starter and worker the same one. To rotate, list the new key's file first and the old ones after it, comma-separated: the first encrypts, all decrypt")
	if o.ControlQueue == "" {
		o.ControlQueue = spec.DefaultControlQueue
	}
	fs.StringVar(&o.ControlQueue, "control-queue", o.ControlQueue, "task queue of the workflows")
}

// ClientOptions resolves the options into the SDK's: the Temporal
// environment configuration first (profile file, then TEMPORAL_*
// variables), then the flags over it.
func (o Options) ClientOptions(log *zap.Logger) (client.Options, error) {
	opts, err := envconfig.LoadDefaultClientOptions()
	if err != nil {
		return client.Options{}, fmt.Errorf("the Temporal environment configuration (TEMPORAL_* variables, TEMPORAL_CONFIG_FILE, TEMPORAL_PROFILE): %w", err)
	}
	if o.Address != "" {
		opts.HostPort = o.Address
	}
	if opts.HostPort == "" {
		opts.HostPort = DefaultAddress
	}
	if o.Namespace != "" {
		opts.Namespace = o.Namespace
	}
	if opts.Namespace == "" {
		opts.Namespace = DefaultNamespace
	}
	if env := o.APIKeyEnv; env != "" && env != DefaultAPIKeyEnv { // the default one envconfig has read
		key := os.Getenv(env)
		if key == "" {
			return client.Options{}, fmt.Errorf("-api-key-env: %s is empty; want the API key in it, or leave -api-key-env out", env)
		}
		opts.Credentials = client.NewAPIKeyStaticCredentials(key)
		if opts.ConnectionOptions.TLS == nil {
			opts.ConnectionOptions.TLS = &tls.Config{}
		}
	}
	if o.TLS && opts.ConnectionOptions.TLS == nil {
		opts.ConnectionOptions.TLS = &tls.Config{}
	}
	if err := o.mutualTLS(&opts); err != nil {
		return client.Options{}, err
	}
	if o.CodecKeyFile != "" {
		var keys [][]byte
		for _, path := range strings.Split(o.CodecKeyFile, ",") {
			key, err := keyfile.Read(strings.TrimSpace(path), "-codec-key-file")
			if err != nil {
				return client.Options{}, err
			}
			keys = append(keys, key)
		}
		c, err := codec.New(keys[0], keys[1:]...)
		if err != nil {
			return client.Options{}, fmt.Errorf("-codec-key-file: %w", err)
		}
		opts.DataConverter = c.DataConverter()
		// Failure messages and stack traces name URLs and paths too: into the payload with them.
		opts.FailureConverter = temporal.NewDefaultFailureConverter(temporal.DefaultFailureConverterOptions{
			DataConverter: opts.DataConverter, EncodeCommonAttributes: true})
	}
	opts.Logger = SDKLogger(log)
	return opts, nil
}

// mutualTLS applies the -tls-* flags over the environment's TLS settings.
func (o Options) mutualTLS(opts *client.Options) error {
	if o.TLSCert == "" && o.TLSKey == "" && o.TLSCA == "" && o.TLSServerName == "" {
		return nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if opts.ConnectionOptions.TLS != nil {
		cfg = opts.ConnectionOptions.TLS.Clone()
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return errors.New("-tls-cert and -tls-key: give both (a client certificate and its key) or neither")
	}
	if o.TLSCert != "" {
		pair, err := tls.LoadX509KeyPair(o.TLSCert, o.TLSKey)
		if err != nil {
			return fmt.Errorf("-tls-cert/-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	if o.TLSCA != "" {
		pem, err := os.ReadFile(o.TLSCA)
		if err != nil {
			return fmt.Errorf("-tls-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("-tls-ca: %s holds no PEM certificate", o.TLSCA)
		}
		cfg.RootCAs = pool
	}
	if o.TLSServerName != "" {
		cfg.ServerName = o.TLSServerName
	}
	opts.ConnectionOptions.TLS = cfg
	return nil
}

// Dial connects a client with the resolved options.
func (o Options) Dial(log *zap.Logger) (client.Client, error) {
	opts, err := o.ClientOptions(log)
	if err != nil {
		return nil, err
	}
	c, err := client.Dial(opts)
	if err != nil {
		return nil, fmt.Errorf("cannot reach Temporal at %s (namespace %s): %w", opts.HostPort, opts.Namespace, err)
	}
	return c, nil
}

// SDKLogger bridges zap to the Temporal SDK's logger. The SDK's lines about
// a run that has ended (see quietEndings) go to debug.
func SDKLogger(log *zap.Logger) sdklog.Logger {
	if log == nil {
		log = zap.NewNop()
	}
	return sdklog.NewStructuredLogger(slog.New(quietEndings{zapslog.NewHandler(log.Core())}))
}

// runEnded is how the server answers a heartbeat or a completion of an
// activity whose workflow has closed.
const runEnded = "workflow execution already completed"

// cancelRequested is the error a heartbeat returns when the activity's
// cancellation was requested (the SDK's CanceledError).
const cancelRequested = "canceled"

// quietEndings demotes to debug what the SDK logs when a slot's HoldSlot
// heartbeats after its run has completed, or after the run asked it to
// stop (at every run's end, and whenever a gang re-forms): the expected
// ways a hold learns that it is done (the slot is then released at once),
// not faults. Every run's end used to log one per slot as a warning.
type quietEndings struct{ slog.Handler }

func (q quietEndings) Handle(ctx context.Context, r slog.Record) error {
	if r.Level > slog.LevelDebug && (r.Message == "RecordActivityHeartbeat with error" || r.Message == "Task processing failed with error") {
		why, errText := "", ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key != "Error" {
				return true
			}
			switch errText = a.Value.String(); {
			case strings.Contains(errText, runEnded):
				why = " (its run has ended)"
			case errText == cancelRequested && r.Message == "RecordActivityHeartbeat with error":
				why = " (its cancellation was requested)"
			}
			return false
		})
		if why != "" {
			if !q.Handler.Enabled(ctx, slog.LevelDebug) {
				return nil
			}
			r = slog.NewRecord(r.Time, slog.LevelDebug, r.Message+why, r.PC)
			r.AddAttrs(slog.String("Error", errText))
		}
	}
	return q.Handler.Handle(ctx, r)
}

func (q quietEndings) WithAttrs(attrs []slog.Attr) slog.Handler {
	return quietEndings{q.Handler.WithAttrs(attrs)}
}

func (q quietEndings) WithGroup(name string) slog.Handler {
	return quietEndings{q.Handler.WithGroup(name)}
}
