// Command starter starts and watches durabletrain runs.
//
//	starter train -workers 2 -epochs 10 -wait      start a run (flags, or -f spec.json) and watch it
//	starter status -id RUN                         the run's progress
//	starter stop -id RUN                           finish the epoch, checkpoint, complete (waits; -no-wait to only ask)
//	starter list                                   recent runs
//	starter checkpoints -id RUN                    the run's checkpoints
//	starter resume -id RUN -wait                   a new run from RUN's latest verified checkpoint
//	starter tune -f tune.json -wait                a hyperparameter search, its live status table, the best config
//	starter codec-server -codec-key-file F         decrypts payloads for the Temporal UI and CLI (--codec-endpoint)
//
// Exit codes: 0 done, 1 the run failed, 2 bad input, 3 Temporal unreachable.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.uber.org/zap"

	_ "github.com/durabletrain/durabletrain/blobdrivers"
	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/internal/buildinfo"
)

const (
	exitFailed      = 1
	exitUsage       = 2
	exitUnreachable = 3
)

// common are the flags every command has: where Temporal is (package connect).
type common struct{ connect.Options }

func (c *common) flags(fs *flag.FlagSet) { c.Register(fs) }

// converter is the data converter the client uses (the codec's, with
// -codec-key-file), for payloads read from history.
func (c *common) converter() converter.DataConverter {
	opts, err := c.ClientOptions(zap.NewNop())
	if err != nil || opts.DataConverter == nil {
		return converter.GetDefaultDataConverter()
	}
	return opts.DataConverter
}

func (c *common) dial() client.Client {
	cl, err := c.Dial(zap.NewNop())
	if err != nil {
		fail(exitUnreachable, "%v (is the dev server or your cluster up?)", err)
	}
	return cl
}

// readSpecFile reads the spec file at path, refusing one past limit bytes
// without reading the rest (a -f that names a device or a huge file).
func readSpecFile(path string, limit int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("-f %s: %w", path, err)
	}
	if len(raw) > limit {
		return nil, fmt.Errorf("-f %s: the spec is more than %d bytes; want at most %d", path, limit, limit)
	}
	return raw, nil
}

func fail(code int, format string, args ...any) {
	fmt.Fprintf(os.Stderr, "starter: "+format+"\n", args...)
	os.Exit(code)
}

// commands are the starter's subcommands, in the order help lists them.
var commands = []struct {
	name, synopsis string
	run            func(args []string)
}{
	{"train", "start a run (flags, or -f spec.json); -wait draws its progress until it ends", func(a []string) { train("train", a) }},
	{"status", "a run's progress: state, epoch, metrics, gang, latest checkpoint", status},
	{"stop", "finish the current step, checkpoint and complete (waits; -no-wait only asks)", stop},
	{"list", "recent runs and searches, newest first", list},
	{"checkpoints", "a run's checkpoints, each verified", checkpoints},
	{"resume", "a new run from a run's latest verified checkpoint, with that run's spec", func(a []string) { train("resume", a) }},
	{"plot", "draw a metric of a run, or of every trial of a search, against epoch or step (SVG, PNG, PDF)", plotCmd},
	{"tune", "a hyperparameter search: its live status table and the best config", tuneCmd},
	{"check", "validate a run's or a search's spec without starting it (-kind training|tune -f spec.json)", check},
	{"extract", "write a verified checkpoint's files into a directory (-url -run -id -to)", extract},
	{"codec-server", "decrypt payloads for the Temporal UI and CLI (--codec-endpoint)", codecServer},
	{"version", "the starter's version and build", func([]string) { fmt.Println(buildinfo.String("starter")) }},
	{"help", "this list, or a command's flags: starter help COMMAND", nil}, // main's: it reads this table
}

func usage(w *os.File) {
	fmt.Fprintf(w, "starter starts and watches durabletrain runs on Temporal (%s).\n\nUsage: starter COMMAND [flags]\n\nCommands:\n", buildinfo.ReleaseVersion())
	for _, c := range commands {
		fmt.Fprintf(w, "  %-13s %s\n", c.name, c.synopsis)
	}
	fmt.Fprintf(w, "\nstarter COMMAND -h lists a command's flags. Every command that reaches Temporal takes -address,\n"+
		"-namespace and the TLS flags, or reads TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_TLS_* and TEMPORAL_PROFILE.\n"+
		"Exit codes: 0 done, 1 the run failed, 2 bad input, 3 Temporal unreachable.\n")
}

func helpCmd(args []string) {
	if len(args) == 0 {
		usage(os.Stdout)
		return
	}
	for _, c := range commands {
		if c.name == args[0] && c.run != nil && c.name != "version" {
			c.run([]string{"-h"})
			return
		}
	}
	fail(exitUsage, "help: no command %q; `starter help` lists them", args[0])
}

func main() {
	if len(os.Args) < 2 {
		usage(os.Stderr)
		os.Exit(exitUsage)
	}
	cmd, args := os.Args[1], os.Args[2:]
	switch cmd {
	case "-h", "-help", "--help":
		usage(os.Stdout)
		return
	case "-version", "--version":
		cmd = "version"
	}
	if cmd == "help" {
		helpCmd(args)
		return
	}
	for _, c := range commands {
		if c.name == cmd {
			c.run(args)
			return
		}
	}
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	fail(exitUsage, "unknown command %q; want one of %s (starter help says what each does)", cmd, strings.Join(names, ", "))
}
