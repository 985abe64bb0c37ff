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
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	_ "github.com/durabletrain/durabletrain/blobdrivers"
	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/buildinfo"
	"github.com/durabletrain/durabletrain/spec"
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

func train(cmd string, args []string) {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	var c common
	c.flags(fs)
	file := fs.String("f", "", "spec file (JSON); flags below override it")
	id := fs.String("id", "", "workflow ID (default: train-<time>); for resume, the run to resume")
	wait := fs.Bool("wait", false, "draw the progress until the run ends")
	workers := fs.Int("workers", 0, "scaling.workers")
	perHost := fs.Int("workers-per-host", 0, "scaling.workers_per_host: ranks per host (one hold and one activity per host and epoch)")
	epochs := fs.Int("epochs", 0, "hyper.epochs")
	lr := fs.Float64("lr", 0, "hyper.lr")
	batch := fs.Int("batch", 0, "hyper.batch_size")
	data := fs.String("dataset", "", "dataset.url, or an absolute path on the workers (the folder of its files)")
	ckpt := fs.String("checkpoint", "", "checkpoint.url, or an absolute path on the workers (a folder, created if missing)")
	attrs := fs.Bool("search-attributes", false, "search_attributes: upsert DurabletrainState/DurabletrainEpoch (the namespace must have them; the dev server does)")
	taskTimeout := fs.Duration("workflow-task-timeout", 0, "the run's workflow task timeout (default Temporal's, 10s): how long a workflow task taken by a worker that is then cut off delays the run, where workflow workers share hosts with GPU agents (-role both)")
	fs.Parse(args)
	if err := spec.CheckWorkflowID("-id", *id, len("-resumed-20060102T150405")); *id != "" && err != nil {
		fail(exitUsage, "%v", err)
	}
	var s spec.Training
	workflowID := *id
	if cmd == "resume" {
		// The old run's own spec (checkpoint URL, data set, model, scaling), then -f and the flags over it.
		if *id == "" {
			fail(exitUsage, "resume needs -id, the run to resume")
		}
		cl := c.dial()
		old, runName, err := resumeSpec(cl, c.converter(), *id)
		cl.Close()
		if err != nil {
			fail(exitFailed, "%v", err)
		}
		s = old
		s.ResumeFrom = runName
		workflowID = *id + "-resumed-" + time.Now().UTC().Format("20060102T150405")
	}
	if *file != "" {
		raw, err := readSpecFile(*file, spec.MaxSpecBytes)
		if err != nil {
			fail(exitUsage, "%v", err)
		}
		resumeFrom := s.ResumeFrom
		if s, err = spec.Parse(raw); err != nil {
			fail(exitUsage, "%s: %v", *file, err)
		}
		if resumeFrom != "" {
			s.ResumeFrom = resumeFrom
		}
	}
	set := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	set(&s.Scaling.Workers, *workers)
	set(&s.Scaling.WorkersPerHost, *perHost)
	set(&s.Hyper.Epochs, *epochs)
	set(&s.Hyper.BatchSize, *batch)
	if *lr != 0 {
		s.Hyper.LR = *lr
	}
	var err error
	if *data != "" {
		if s.Dataset.URL, err = bloburl.FromFlag("-dataset", *data); err != nil {
			fail(exitUsage, "%v", err)
		}
	}
	if *ckpt != "" {
		if s.Checkpoint.URL, err = bloburl.FromFlag("-checkpoint", *ckpt); err != nil {
			fail(exitUsage, "%v", err)
		}
		if bloburl.IsFlagPath(*ckpt) { // a folder of the workers': made if missing
			s.Checkpoint.URL += "?create_dir=1"
		}
	}
	if *attrs {
		s.SearchAttributes = true
	}
	if workflowID == "" {
		workflowID = "train-" + time.Now().UTC().Format("20060102T150405")
	}
	if err := s.WithDefaults().Validate(); err != nil {
		fail(exitUsage, "%v", err)
	}
	cl := c.dial()
	defer cl.Close()
	input, _ := json.Marshal(s)
	run, err := cl.ExecuteWorkflow(context.Background(), client.StartWorkflowOptions{ID: workflowID, TaskQueue: c.ControlQueue, WorkflowTaskTimeout: *taskTimeout},
		spec.WorkflowTraining, json.RawMessage(input))
	if err != nil {
		fail(exitFailed, "starting the run: %v", err)
	}
	fmt.Printf("started run %s (workflow %s, run ID %s)\n", workflowID, workflowID, run.GetRunID())
	if !*wait {
		return
	}
	watch(cl, workflowID)
}

// watch redraws one progress line until the run ends, then prints a summary.
func watch(cl client.Client, id string) {
	start := time.Now()
	tty := isTerminal()
	for {
		p, err := query(cl, id)
		if err == nil {
			line := progressLine(p, time.Since(start))
			if tty {
				fmt.Printf("\r\033[K%s", line)
			} else {
				fmt.Println(line)
			}
		}
		desc, derr := cl.DescribeWorkflowExecution(context.Background(), id, "")
		if derr == nil && desc.WorkflowExecutionInfo.Status != enumspb.WORKFLOW_EXECUTION_STATUS_RUNNING {
			break
		}
		time.Sleep(map[bool]time.Duration{true: 500 * time.Millisecond, false: 5 * time.Second}[tty])
	}
	if tty {
		fmt.Println()
	}
	var p *spec.Progress
	err := cl.GetWorkflow(context.Background(), id, "").Get(context.Background(), &p)
	if err != nil {
		var app *temporal.ApplicationError
		if errors.As(err, &app) {
			fail(exitFailed, "run %s failed (%s): %s", id, app.Type(), app.Error())
		}
		fail(exitFailed, "run %s failed: %v", id, err)
	}
	summary(p, time.Since(start))
}

func progressLine(p *spec.Progress, elapsed time.Duration) string {
	const width = 30
	done := float64(p.Epoch) / float64(max(1, p.Epochs))
	bar := strings.Repeat("█", int(done*width)) + strings.Repeat("░", width-int(done*width))
	line := fmt.Sprintf("%s %s epoch %d/%d", bar, p.State, p.Epoch, p.Epochs)
	if n := len(p.Metrics); n > 0 {
		m := p.Metrics[n-1]
		reported := m.Map() // what the run reported: the three, and any other
		for _, name := range m.Names() {
			if name != spec.MetricTestLoss {
				line += fmt.Sprintf(" · %s %.4g", strings.ReplaceAll(name, "_", " "), reported[name])
			}
		}
		line += fmt.Sprintf(" · %.0f samples/s", m.SamplesPerSecond)
		if done > 0 && done < 1 {
			eta := time.Duration(float64(elapsed) * (1 - done) / done)
			line += fmt.Sprintf(" · ETA %s", eta.Round(time.Second))
		}
	}
	if p.Failures+p.Preemptions > 0 {
		line += fmt.Sprintf(" · %d failures, %d preemptions", p.Failures, p.Preemptions)
	}
	if p.Waiting != "" {
		line += " · " + p.Waiting
	}
	return line
}

func summary(p *spec.Progress, elapsed time.Duration) {
	fmt.Printf("run %s %s after %d/%d epochs in %s (%d gangs, %d failures, %d preemptions)\n",
		p.Run, p.State, p.Epoch, p.Epochs, elapsed.Round(time.Second), p.Generation, p.Failures, p.Preemptions)
	if n := len(p.Metrics); n > 0 {
		m := p.Metrics[n-1]
		var parts []string
		reported := m.Map()
		for _, name := range m.Names() {
			parts = append(parts, fmt.Sprintf("%s %.4g", strings.ReplaceAll(name, "_", " "), reported[name]))
		}
		fmt.Printf("final: %s\n", strings.Join(parts, ", "))
	}
	if p.Latest != nil {
		fmt.Printf("latest checkpoint: %s/%s in %s\n", p.Latest.Run, p.Latest.ID, p.Latest.URL)
	}
	if p.IncidentsDropped > 0 {
		fmt.Printf("(%d older incidents not kept)\n", p.IncidentsDropped)
	}
	for _, inc := range p.Incidents {
		again := ""
		if inc.Repeats > 0 {
			again = fmt.Sprintf(" (and %d times before)", inc.Repeats)
		}
		fmt.Printf("incident: gang %d, epoch %d, %s%s: %s\n", inc.Generation, inc.Epoch, inc.Kind, again, inc.Detail)
	}
}

// resumeSpec is the spec run id was started with, read from the start event
// of its latest run (a run that continued as new carries its spec too, beside
// the state), and the name its checkpoints are stored under.
func resumeSpec(cl client.Client, dc converter.DataConverter, id string) (spec.Training, string, error) {
	ctx := context.Background()
	it := cl.GetWorkflowHistory(ctx, id, "", false, enumspb.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	if !it.HasNext() {
		return spec.Training{}, "", fmt.Errorf("run %s has no history to resume from", id)
	}
	ev, err := it.Next()
	if err != nil {
		return spec.Training{}, "", fmt.Errorf("reading run %s: %w", id, err)
	}
	started := ev.GetWorkflowExecutionStartedEventAttributes()
	if started == nil || started.GetWorkflowType().GetName() != spec.WorkflowTraining {
		return spec.Training{}, "", fmt.Errorf("%s is not a training run (a %s workflow): resume takes a TrainingWorkflow's ID",
			id, started.GetWorkflowType().GetName())
	}
	var raw json.RawMessage
	if in := started.GetInput().GetPayloads(); len(in) > 0 {
		if err := dc.FromPayload(in[0], &raw); err != nil {
			return spec.Training{}, "", fmt.Errorf("run %s: its spec does not decode (encrypted with a codec key this starter lacks? -codec-key-file): %w", id, err)
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return spec.Training{}, "", fmt.Errorf("run %s: its input is not a JSON spec: %w", id, err)
	}
	delete(fields, "continued") // the state continue-as-new carried, not the spec's
	raw, _ = json.Marshal(fields)
	s, err := spec.Parse(raw)
	if err != nil {
		return spec.Training{}, "", fmt.Errorf("run %s: its spec no longer parses: %w", id, err)
	}
	p, err := runProgress(cl, id)
	if err != nil {
		return spec.Training{}, "", err
	}
	if p.Latest == nil {
		return spec.Training{}, "", fmt.Errorf("run %s has no checkpoint yet: nothing to resume from (start it again with train)", id)
	}
	return s, p.Run, nil
}

func query(cl client.Client, id string) (*spec.Progress, error) {
	v, err := cl.QueryWorkflow(context.Background(), id, "", spec.QueryProgress)
	if err != nil {
		return nil, fmt.Errorf("querying run %s: %w", id, err)
	}
	var p *spec.Progress
	return p, v.Get(&p)
}

// runCommand parses the flags of a command about one run (-id) and dials Temporal.
func runCommand(name string, args []string, extra func(*flag.FlagSet)) (client.Client, string) {
	var c common
	return runCommandWith(&c, name, args, extra)
}

// runCommandWith is runCommand for a command that also needs the
// connection's options afterwards (its data converter).
func runCommandWith(c *common, name string, args []string, extra func(*flag.FlagSet)) (client.Client, string) {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	c.flags(fs)
	id := fs.String("id", "", "workflow ID of the run")
	if extra != nil {
		extra(fs)
	}
	fs.Parse(args)
	if *id == "" {
		fail(exitUsage, "%s needs -id, the run's workflow ID", name)
	}
	return c.dial(), *id
}

func status(args []string) {
	var asJSON *bool
	var c common
	cl, id := runCommandWith(&c, "status", args, func(fs *flag.FlagSet) { asJSON = fs.Bool("json", false, "print the whole progress as JSON") })
	defer cl.Close()
	p, err := query(cl, id)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	if *asJSON {
		b, _ := json.MarshalIndent(p, "", "  ")
		fmt.Println(string(b))
		return
	}
	fmt.Println(progressLine(p, 0))
	for _, pl := range p.Gang {
		gpu := pl.GPU
		if gpu == "" {
			gpu = "CPU slot"
		}
		fmt.Printf("  rank %d on %s slot %d (%s)\n", pl.Rank, pl.Worker, pl.Slot, gpu)
	}
	if p.Latest != nil {
		fmt.Printf("  latest checkpoint %s/%s\n", p.Latest.Run, p.Latest.ID)
	}
	printHeartbeats(cl, c.converter(), id)
}

// printHeartbeats shows the latest heartbeat of each of the run's
// activities now running (a host's epoch, a held slot): the step it is at
// and, on a GPU slot, the NVML readings it carries, as the Temporal UI's
// pending activities do. A run that has ended has none.
func printHeartbeats(cl client.Client, dc converter.DataConverter, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := cl.DescribeWorkflowExecution(ctx, id, "")
	if err != nil {
		fmt.Printf("  (no heartbeats: %v)\n", err)
		return
	}
	for _, pa := range d.GetPendingActivities() {
		if pa.GetHeartbeatDetails() == nil {
			continue
		}
		var details map[string]any
		if err := dc.FromPayloads(pa.GetHeartbeatDetails(), &details); err != nil {
			fmt.Printf("  %s: heartbeat details unreadable: %v\n", pa.GetActivityType().GetName(), err)
			continue
		}
		b, _ := json.Marshal(details) // sorted keys
		age := time.Since(pa.GetLastHeartbeatTime().AsTime()).Round(100 * time.Millisecond)
		fmt.Printf("  %s on %s, heartbeat %v ago: %s\n", pa.GetActivityType().GetName(), pa.GetLastWorkerIdentity(), age, b)
	}
}

func stop(args []string) {
	var noWait *bool
	cl, id := runCommand("stop", args, func(fs *flag.FlagSet) {
		noWait = fs.Bool("no-wait", false, "only ask (a signal); do not wait for the run to checkpoint and end")
	})
	defer cl.Close()
	ctx := context.Background()
	if *noWait {
		if err := cl.SignalWorkflow(ctx, id, "", spec.SignalStop, nil); err != nil {
			fail(exitFailed, "stopping %s: %v", id, err)
		}
		fmt.Printf("asked run %s to stop after its current epoch\n", id)
		return
	}
	fmt.Printf("stopping run %s after its current epoch...\n", id)
	h, err := cl.UpdateWorkflow(ctx, client.UpdateWorkflowOptions{WorkflowID: id, UpdateName: spec.UpdateStop,
		WaitForStage: client.WorkflowUpdateStageCompleted})
	if err != nil {
		fail(exitFailed, "stopping %s: %v", id, err)
	}
	var res spec.StopResult
	if err := h.Get(ctx, &res); err != nil {
		fail(exitFailed, "stopping %s: %v", id, err)
	}
	fmt.Printf("run %s %s after %d epochs", id, res.State, res.Epoch)
	if res.Latest != nil {
		fmt.Printf("; checkpoint %s/%s (epoch %d step %d)", res.Latest.Run, res.Latest.ID, res.Latest.Epoch, res.Latest.Step)
	}
	fmt.Println()
}

func list(args []string) {
	fs := flag.NewFlagSet("list", flag.ExitOnError)
	var c common
	c.flags(fs)
	limit := fs.Int("n", 20, "how many runs and searches, newest first")
	fs.Parse(args)
	cl := c.dial()
	defer cl.Close()
	resp, err := cl.ListWorkflow(context.Background(), &workflowservice.ListWorkflowExecutionsRequest{
		PageSize: int32(*limit), Query: "WorkflowType = '" + spec.WorkflowTraining + "' OR WorkflowType = '" + spec.WorkflowTune + "'"})
	if err != nil {
		fail(exitFailed, "listing runs: %v", err)
	}
	if len(resp.Executions) == 0 {
		fmt.Println("no runs or searches yet (starter train, starter tune)")
		return
	}
	fmt.Printf("%-40s %-6s %-12s %-19s  %s\n", "ID", "KIND", "STATE", "STARTED", "")
	for _, e := range resp.Executions {
		kind := "run"
		switch {
		case e.GetType().GetName() == spec.WorkflowTune:
			kind = "search"
		case e.GetParentExecution() != nil:
			kind = "trial"
		}
		status := strings.ToLower(strings.TrimPrefix(e.Status.String(), "WORKFLOW_EXECUTION_STATUS_"))
		// Runs started with search_attributes say their own state and epoch.
		var state string
		var epoch int64 = -1
		if f := e.GetSearchAttributes().GetIndexedFields(); f != nil {
			converter.GetDefaultDataConverter().FromPayload(f[spec.SearchAttributeState], &state)
			converter.GetDefaultDataConverter().FromPayload(f[spec.SearchAttributeEpoch], &epoch)
		}
		if state != "" {
			status = state
		}
		line := fmt.Sprintf("%-40s %-6s %-12s %-19s", e.Execution.WorkflowId, kind, status, e.StartTime.AsTime().Local().Format(time.DateTime))
		if epoch >= 0 {
			line += fmt.Sprintf("  epoch %d", epoch)
		}
		if p := e.GetParentExecution(); p != nil {
			line += "  of " + p.GetWorkflowId()
		}
		fmt.Println(line)
	}
}

func isTerminal() bool {
	st, err := os.Stdout.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func checkpoints(args []string) {
	cl, id := runCommand("checkpoints", args, nil)
	defer cl.Close()
	p, err := query(cl, id)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	if p.Latest == nil {
		fmt.Printf("run %s has no checkpoint yet\n", id)
		return
	}
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, p.Latest.URL, nil)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	defer store.Close()
	ids, err := store.IDs(ctx, p.Run)
	if err != nil {
		fail(exitFailed, "%v", err)
	}
	for _, cid := range ids {
		c, err := store.Verify(ctx, p.Run, cid)
		if err != nil {
			fmt.Printf("%s  NOT USABLE: %v\n", cid, err)
			continue
		}
		m := c.Manifest
		fmt.Printf("%s  epoch %d step %d  test accuracy %.4f  %s\n", cid, m.Epoch, m.Step, m.Metrics["test_accuracy"], m.Created.Format(time.RFC3339))
	}
}
