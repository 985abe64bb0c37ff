package logging

import (
	"flag"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
)

func TestBuildNamesTheBadFlag(t *testing.T) {
	for _, c := range []struct {
		o    Options
		want string
	}{
		{Options{Level: "loud", Format: "json"}, "-log-level"},
		{Options{Level: "fatal", Format: "json"}, "-log-level"}, // a level that would exit the worker is not a filter
		{Options{Level: "info", Format: "xml"}, "-log-format"},
	} {
		if _, err := c.o.Build(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err = %v; want one naming %s", c.o, err, c.want)
		}
	}
}

func TestLevelFilters(t *testing.T) {
	var o Options
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o.Register(fs, "json")
	if err := fs.Parse([]string{"-log-level", "WARN", "-log-format", "console"}); err != nil {
		t.Fatal(err)
	}
	log, err := o.Build()
	if err != nil {
		t.Fatal(err)
	}
	if log.Core().Enabled(zapcore.InfoLevel) || !log.Core().Enabled(zapcore.WarnLevel) {
		t.Fatal("-log-level warn should drop info and keep warn")
	}
}
