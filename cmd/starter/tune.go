package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// tuneCmd starts a search (TuneWorkflow) from a tune spec file and, with
// -wait, prints its status table as Ray Tune does until it ends, then the
// best trial's config and checkpoint. With -id of a running search and no
// -f, it only watches.
func tuneCmd(args []string) {
	fs := flag.NewFlagSet("tune", flag.ExitOnError)
	var c common
	c.flags(fs)
	file := fs.String("f", "", "tune spec file (JSON): train, param_space, num_samples, metric, mode, scheduler, ...")
	id := fs.String("id", "", "workflow ID (default: tune-<time>); without -f, the search to watch")
	wait := fs.Bool("wait", false, "print the status table until the search ends")
	fs.Parse(args)
	// The spec is read, and its trials expanded, before anything is dialled:
	// a search that would be refused is refused here, at once.
	var raw []byte
	if *file != "" {
		var err error
		if raw, err = readSpecFile(*file, tune.MaxSpecBytes); err != nil {
			fail(exitUsage, "%v", err)
		}
		s, err := tune.ParseSpec(raw)
		if err == nil {
			_, err = tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
		}
		if err != nil {
			fail(exitUsage, "%s: %v", *file, err)
		}
	}
	if err := spec.CheckWorkflowID("-id", *id, len("-trial-0000")); *id != "" && err != nil {
		fail(exitUsage, "%v", err)
	}
	cl := c.dial()
	defer cl.Close()
	ctx := context.Background()
	if *file != "" {
		if *id == "" {
			*id = "tune-" + time.Now().Format("20060102-150405")
		}
		run, err := cl.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: *id, TaskQueue: c.ControlQueue}, spec.WorkflowTune, json.RawMessage(raw))
		if err != nil {
			fail(exitFailed, "starting search %s: %v", *id, err)
		}
		fmt.Printf("started search %s (run ID %s)\n", *id, run.GetRunID())
	} else if *id == "" {
		fail(exitUsage, "tune needs -f (a tune spec to start) or -id (a search to watch)")
	}
	if !*wait && *file != "" {
		return
	}
	run := cl.GetWorkflow(ctx, *id, "")
	done := make(chan error, 1)
	var final *spec.TuneResults
	go func() { done <- run.Get(ctx, &final) }()
	last := ""
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				var app *temporal.ApplicationError
				if errors.As(err, &app) {
					fail(exitFailed, "search %s failed: %s", *id, app.Message())
				}
				fail(exitFailed, "search %s failed: %v", *id, err)
			}
			printTuneTable(final)
			printBest(final)
			return
		case <-tick.C:
			v, err := cl.QueryWorkflow(ctx, *id, "", spec.QueryResults)
			if err != nil {
				continue
			}
			var r *spec.TuneResults
			if v.Get(&r) != nil || r == nil {
				continue
			}
			if s := tuneTable(r); s != last {
				fmt.Print(s)
				last = s
			}
		}
	}
}

// tuneTable is Ray Tune's status table: a count by status, then a row per trial.
func tuneTable(r *spec.TuneResults) string {
	var b strings.Builder
	counts := r.Counts()
	var parts []string
	for _, st := range []string{spec.TrialRunning, spec.TrialStopping, spec.TrialExploiting, spec.TrialPaused, spec.TrialPending, spec.TrialCompleted, spec.TrialEarlyStop, spec.TrialStopped, spec.TrialFailed, spec.TrialCancelled} {
		if counts[st] > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", counts[st], st))
		}
	}
	fmt.Fprintf(&b, "== search %s: %s (scheduler %s, %s %s) ==\n", r.Name, strings.Join(parts, ", "), r.Scheduler, r.Mode, r.Metric)
	paths := r.ConfigPaths()
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	pbt := r.Scheduler == "pbt" // each trial's exploits, and the trial it took its weights from last
	head := fmt.Sprintf("trial\tstatus\t%s\tepochs\tlast %s\tbest", strings.Join(paths, "\t"), r.Metric)
	if pbt {
		head += "\texploits\tlast exploit"
	}
	fmt.Fprintln(tw, head)
	for _, t := range r.Trials {
		var cfg []string
		for _, p := range paths {
			cfg = append(cfg, string(t.Config[p]))
		}
		line := fmt.Sprintf("%d\t%s\t%s\t%d\t%s\t%s", t.Trial, t.Status, strings.Join(cfg, "\t"), t.Epochs, metric(t.Last), metric(t.Best))
		if pbt {
			last := "-"
			if n := len(t.Lineage); n > 0 {
				last = fmt.Sprintf("epoch %d from trial %d", t.Lineage[n-1].Epoch, t.Lineage[n-1].From)
			}
			line += fmt.Sprintf("\t%d\t%s", t.Segment, last)
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	return b.String()
}

func printTuneTable(r *spec.TuneResults) { fmt.Print(tuneTable(r)) }

func printBest(r *spec.TuneResults) {
	if r.Best < 0 {
		fmt.Printf("search %s ended (%s) without a trial to recommend\n", r.Name, r.State)
		return
	}
	t := r.BestTrial
	if t == nil { // a search recorded before best_trial
		if t = r.Row(r.Best); t == nil {
			fmt.Printf("search %s ended (%s); its best trial is %d\n", r.Name, r.State, r.Best)
			return
		}
	}
	cfg, _ := json.Marshal(t.Config)
	by := metric(t.Last)
	if r.Scope != "" && r.Scope != spec.ScopeLast && t.Score != nil {
		by = fmt.Sprintf("%s %s, last %s", r.Scope, metric(t.Score), metric(t.Last))
	}
	fmt.Printf("search %s %s: best trial %d (%s %s) with config %s\n", r.Name, r.State, t.Trial, r.Metric, by, cfg)
	if t.Checkpoint != nil {
		fmt.Printf("its checkpoint: %s/%s in %s\n", t.Checkpoint.Run, t.Checkpoint.ID, t.Checkpoint.URL)
	}
	if r.ResultsCSV != "" {
		fmt.Printf("results table: %s\n", r.ResultsCSV)
	}
}

func metric(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.4f", *v)
}
