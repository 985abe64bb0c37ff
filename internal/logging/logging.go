// Package logging owns how durabletrain's binaries build their zap logger
// from the -log-level and -log-format flags (or DURABLETRAIN_LOG_LEVEL and
// DURABLETRAIN_LOG_FORMAT).
package logging

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Options are the two flags.
type Options struct {
	Level  string // debug, info, warn, error
	Format string // json (one object a line, for collectors) or console (for people)
}

// Register adds -log-level and -log-format to fs, with defaults from the
// environment, else info and the given format.
func (o *Options) Register(fs *flag.FlagSet, defaultFormat string) {
	o.Level = envOr("DURABLETRAIN_LOG_LEVEL", "info")
	o.Format = envOr("DURABLETRAIN_LOG_FORMAT", defaultFormat)
	fs.StringVar(&o.Level, "log-level", o.Level, "debug, info, warn or error (default $DURABLETRAIN_LOG_LEVEL or info)")
	fs.StringVar(&o.Format, "log-format", o.Format, "json (a JSON object a line) or console (default $DURABLETRAIN_LOG_FORMAT or "+defaultFormat+")")
}

// Build makes the logger, writing to standard error.
func (o Options) Build() (*zap.Logger, error) {
	var level zapcore.Level
	if err := level.UnmarshalText([]byte(strings.ToLower(o.Level))); err != nil || level < zapcore.DebugLevel || level > zapcore.ErrorLevel {
		return nil, fmt.Errorf("-log-level %q: want debug, info, warn or error", o.Level)
	}
	var cfg zap.Config
	switch strings.ToLower(o.Format) {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.Development = false
		cfg.EncoderConfig.EncodeLevel = zapcore.CapitalLevelEncoder
	default:
		return nil, fmt.Errorf("-log-format %q: want json or console", o.Format)
	}
	cfg.Level = zap.NewAtomicLevelAt(level)
	cfg.OutputPaths, cfg.ErrorOutputPaths = []string{"stderr"}, []string{"stderr"}
	cfg.Sampling = nil // a rank's every line matters when a run fails
	return cfg.Build()
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
