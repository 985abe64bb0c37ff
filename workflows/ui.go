package workflows

// This file owns what the Temporal UI shows of a training run: its
// current details (the line under "User Metadata"), its memo, and its
// search attributes, published at every change of state, epoch and
// restore.

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// publishesProgress: a run that publishes its memo and search attributes
// at every change of state and every epoch, so that the Temporal UI's
// memo and DurabletrainEpoch agree with the progress query (before, the
// memo changed at epochs only and the search attributes at states only).
func publishesProgress(ctx workflow.Context) bool {
	return workflow.GetVersion(ctx, "publish-progress", workflow.DefaultVersion, 1) >= 1
}

// publish writes what the Temporal UI shows of the run's progress: its
// memo, and (when the spec asks) its search attributes.
func (r *run) publish(ctx workflow.Context) {
	m := memo(r.p)
	key := fmt.Sprint(r.p.State, " ", m) // fmt sorts a map's keys: the same progress, the same key
	if key == r.published {
		return
	}
	r.published = key
	workflow.UpsertMemo(ctx, m) // replay compares the command's kind, not the memo
	r.upsertSearchAttributes(ctx)
}

func (r *run) upsertSearchAttributes(ctx workflow.Context) {
	if r.spec.SearchAttributes {
		if err := workflow.UpsertTypedSearchAttributes(ctx, stateAttribute.ValueSet(r.p.State), epochAttribute.ValueSet(int64(r.p.Epoch))); err != nil {
			workflow.GetLogger(ctx).Warn("search attributes not upserted", "error", err)
		}
	}
}

// details is the text the Temporal UI shows for a running run.
func details(p *spec.Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "**%s** · epoch %d", p.State, p.Epoch)
	if p.Epochs < spec.MaxEpochs { // a run that ends itself (a program's own loop) has no count to show
		fmt.Fprintf(&b, "/%d", p.Epochs)
	}
	if m, ok := p.LastMetrics(); ok {
		// What the epoch reported, no more: an exec program that reports
		// only its loss shows no accuracy of 0.
		if v, ok := m.Value(spec.MetricTestAccuracy); ok {
			fmt.Fprintf(&b, " · test accuracy %.4f", v)
		}
		if v, ok := m.Value(spec.MetricTrainLoss); ok {
			fmt.Fprintf(&b, " · train loss %.4f", v)
		}
		const shownOther = 4
		// A program's own "epoch" is left out: the line begins with the run's.
		names := slices.Sorted(maps.Keys(m.Other))
		names = slices.DeleteFunc(names, func(k string) bool { return k == "epoch" || k == "training_iteration" })
		for _, k := range names[:min(len(names), shownOther)] {
			fmt.Fprintf(&b, " · %s %.4g", k, m.Other[k])
		}
		if len(names) > shownOther {
			fmt.Fprintf(&b, " · %d more metrics", len(names)-shownOther)
		}
		if m.SamplesPerSecond > 0 {
			fmt.Fprintf(&b, " · %.0f samples/s", m.SamplesPerSecond)
		}
	}
	if len(p.Gang) > 0 {
		// Each worker once, with its count of ranks where it holds several.
		const shown = 8
		var order []string
		ranks := map[string]int{}
		for _, pl := range p.Gang {
			if ranks[pl.Worker] == 0 {
				order = append(order, pl.Worker)
			}
			ranks[pl.Worker]++
		}
		var workers []string
		for _, w := range order[:min(len(order), shown)] {
			if n := ranks[w]; n > 1 {
				w = fmt.Sprintf("%s (%d ranks)", w, n)
			}
			workers = append(workers, w)
		}
		if len(order) > shown {
			workers = append(workers, fmt.Sprintf("and %d more hosts", len(order)-shown))
		}
		fmt.Fprintf(&b, " · gang %d on %s", p.Generation, strings.Join(workers, ", "))
	}
	if p.Failures+p.Preemptions > 0 {
		fmt.Fprintf(&b, " · %d failures, %d preemptions", p.Failures, p.Preemptions)
	}
	if p.Waiting != "" {
		fmt.Fprintf(&b, "\n\n%s", p.Waiting)
	}
	return b.String()
}

// memo is the run's memo, which the Temporal UI shows and a list of runs
// can show: its epoch, the epochs it trains (absent while the run's own
// program decides when it ends), the newest epoch's metrics as reported
// (by name, test_accuracy and the rest only when reported), and its
// failures, preemptions and incidents so far. Replaced whole at every
// epoch; bounded by spec.MaxOtherMetrics.
func memo(p *spec.Progress) map[string]any {
	m := map[string]any{"epoch": p.Epoch, "failures": p.Failures, "preemptions": p.Preemptions,
		"incidents": len(p.Incidents) + p.IncidentsDropped, "epochs": nil}
	if p.Epochs < spec.MaxEpochs {
		m["epochs"] = p.Epochs
	}
	if last, ok := p.LastMetrics(); ok {
		m["metrics"] = last.Map()
	}
	return m
}
