package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"go.temporal.io/sdk/client"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tensorboard"
)

// plotCmd draws a metric of a run, or of every trial of a search, against
// epoch (from the run's progress) or step (from the TensorBoard event files
// its rank 0 wrote beside its checkpoints), as SVG, PNG or PDF.
func plotCmd(args []string) {
	fs := flag.NewFlagSet("plot", flag.ExitOnError)
	var c common
	c.flags(fs)
	id := fs.String("id", "", "workflow ID of a run, or of a search (one curve per trial)")
	metric := fs.String("metric", "", "what to draw: "+strings.Join(spec.Metrics, ", ")+", samples_per_second, or (with -x step) loss; default test_accuracy, or the search's metric")
	x := fs.String("x", "epoch", "the x axis: epoch or step")
	out := fs.String("o", "", "the file to write; its extension picks the format: .svg, .png or .pdf (default ID-METRIC.svg)")
	fs.Parse(args)
	if *id == "" {
		fail(exitUsage, "plot needs -id, a run's or a search's workflow ID")
	}
	if *x != "epoch" && *x != "step" {
		fail(exitUsage, "-x %q: want epoch or step", *x)
	}
	if *out != "" {
		if ext := strings.ToLower(filepath.Ext(*out)); ext != ".svg" && ext != ".png" && ext != ".pdf" {
			fail(exitUsage, "-o %s: want a file ending in .svg, .png or .pdf", *out)
		}
	}
	cl := c.dial()
	defer cl.Close()
	ctx := context.Background()
	desc, err := cl.DescribeWorkflowExecution(ctx, *id, "")
	if err != nil {
		fail(exitFailed, "no run or search %s: %v", *id, err)
	}
	type curve struct {
		label string
		id    string
	}
	var curves []curve
	title := "run " + *id
	switch desc.GetWorkflowExecutionInfo().GetType().GetName() {
	case spec.WorkflowTune:
		r, err := tuneResults(cl, *id)
		if err != nil {
			fail(exitFailed, "%v", err)
		}
		if *metric == "" {
			*metric = r.Metric
		}
		for _, t := range r.Trials {
			if t.WorkflowID != "" {
				curves = append(curves, curve{fmt.Sprintf("trial %d %s", t.Trial, configLabel(t)), t.WorkflowID})
			}
		}
		title = fmt.Sprintf("search %s (%s)", *id, r.Scheduler)
	case spec.WorkflowTraining:
		curves = []curve{{*id, *id}}
	default:
		fail(exitUsage, "%s is a %s workflow; plot draws TrainingWorkflow and TuneWorkflow runs", *id, desc.GetWorkflowExecutionInfo().GetType().GetName())
	}
	if *metric == "" {
		*metric = spec.MetricTestAccuracy
	}
	if err := checkPlotMetric(*metric, *x); err != nil {
		fail(exitUsage, "%v", err)
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text, p.Y.Label.Text = *x, *metric
	p.Legend.Top = true
	drawn := 0
	for i, cv := range curves {
		pts, err := series(ctx, cl, cv.id, *metric, *x)
		if err != nil {
			fmt.Printf("%s: %v\n", cv.label, err)
			continue
		}
		if len(pts) == 0 {
			continue
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			fail(exitFailed, "%s: %v", cv.label, err)
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
		p.Add(line)
		p.Legend.Add(cv.label, line)
		drawn++
	}
	if drawn == 0 {
		fail(exitFailed, "nothing to draw: %s has no %s values against %s yet", *id, *metric, *x)
	}
	p.Add(plotter.NewGrid())
	p.BackgroundColor = color.White
	if *out == "" {
		*out = fmt.Sprintf("%s-%s.svg", safeFileName(*id), *metric)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, *out); err != nil {
		fail(exitFailed, "writing %s: %v", *out, err)
	}
	fmt.Printf("wrote %s: %s against %s, %d curve(s)\n", *out, *metric, *x, drawn)
}

func checkPlotMetric(metric, x string) error {
	epochMetrics := append(slices.Clone(spec.Metrics), "samples_per_second")
	if slices.Contains(epochMetrics, metric) || metric == "loss" && x == "step" {
		return nil
	}
	if metric == "loss" {
		return errors.New("-metric loss is the loss of each step: use it with -x step (train_loss is the epoch's mean)")
	}
	return fmt.Errorf("-metric %q: want one of %s, or loss with -x step", metric, strings.Join(epochMetrics, ", "))
}

// series is one run's points: by epoch from its progress, by step from its
// event files.
func series(ctx context.Context, cl client.Client, id, metric, x string) (plotter.XYs, error) {
	p, err := runProgress(cl, id)
	if err != nil {
		return nil, err
	}
	if x == "epoch" {
		var pts plotter.XYs
		for _, m := range p.Metrics {
			v := m.SamplesPerSecond
			if metric != "samples_per_second" {
				v, _ = m.Value(metric)
			}
			pts = append(pts, plotter.XY{X: float64(m.Epoch + 1), Y: v})
		}
		return pts, nil
	}
	if p.Latest == nil {
		return nil, errors.New("no checkpoint yet, so no storage to read its event files from")
	}
	store, err := checkpoint.Open(ctx, p.Latest.URL, nil)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	names, err := store.EventFiles(ctx, p.Run)
	if err != nil {
		return nil, err
	}
	byStep := map[int64]float64{}
	for _, n := range names {
		raw, err := store.ReadEvents(ctx, p.Run, n)
		if err != nil {
			return nil, err
		}
		events, err := tensorboard.Decode(bytes.NewReader(raw))
		if err != nil {
			fmt.Printf("%s: %v (using the events before the damage)\n", n, err)
		}
		for _, e := range events {
			if v, ok := e.Scalars[metric]; ok {
				byStep[e.Step] = v // a step trained again after a failure: its last value
			}
		}
	}
	steps := make([]int64, 0, len(byStep))
	for s := range byStep {
		steps = append(steps, s)
	}
	sort.Slice(steps, func(i, j int) bool { return steps[i] < steps[j] })
	pts := make(plotter.XYs, len(steps))
	for i, s := range steps {
		pts[i] = plotter.XY{X: float64(s), Y: byStep[s]}
	}
	return pts, nil
}

// runProgress is a run's progress: its query's answer, or, where no worker
// answers queries, the result of the closed run.
func runProgress(cl client.Client, id string) (*spec.Progress, error) {
	p, err := query(cl, id)
	if err == nil && p != nil {
		return p, nil
	}
	ctx := context.Background()
	if gerr := cl.GetWorkflow(ctx, id, "").Get(ctx, &p); gerr == nil && p != nil {
		return p, nil
	}
	return nil, err
}

func tuneResults(cl client.Client, id string) (*spec.TuneResults, error) {
	v, err := cl.QueryWorkflow(context.Background(), id, "", spec.QueryResults)
	var r *spec.TuneResults
	if err == nil {
		err = v.Get(&r)
	}
	if err != nil || r == nil {
		ctx := context.Background()
		if gerr := cl.GetWorkflow(ctx, id, "").Get(ctx, &r); gerr == nil && r != nil {
			return r, nil
		}
		return nil, fmt.Errorf("search %s: %v", id, err)
	}
	return r, nil
}

func configLabel(t spec.TrialStatus) string {
	keys := make([]string, 0, len(t.Config))
	for k := range t.Config {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, k[strings.LastIndex(k, ".")+1:]+"="+string(t.Config[k]))
	}
	return strings.Join(parts, " ")
}

func safeFileName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r < ' ' {
			return '_'
		}
		return r
	}, s)
}
