package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	enumspb "go.temporal.io/api/enums/v1"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
)

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
