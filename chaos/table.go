package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// Print writes the report as tables: per kind (count, detection and recovery
// median and max), every fault, and every run.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintln(w, "| fault | injected | recovered | detected median | detected max | training again median | training again max |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
	kinds := map[string][]Fault{}
	var order []string
	for _, f := range r.Faults {
		if _, ok := kinds[f.Kind]; !ok {
			order = append(order, f.Kind)
		}
		kinds[f.Kind] = append(kinds[f.Kind], f)
	}
	slices.Sort(order)
	var all []Fault
	for _, k := range order {
		fs := kinds[k]
		all = append(all, fs...)
		fmt.Fprintln(w, row(k, fs))
	}
	fmt.Fprintln(w, row("all", all))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | fault | phase | target | detected | training again | restored from | steps lost | read from storage | note |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | ---: | ---: | --- | ---: | ---: | --- |")
	for _, f := range r.Faults {
		lost := "–"
		if f.StepsLost >= 0 {
			lost = fmt.Sprint(f.StepsLost)
		}
		from := f.RestoredFrom
		if from == "" {
			from = "–"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f.Run, f.Kind, f.Phase, f.Target, dur(f.Detected), dur(f.Resumed), from, lost, mib(f.BlobBytes), f.Note)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| run | outcome | epochs | faults | failures | preemptions | epochs redone | corrupt checkpoints skipped | final weights = uninterrupted run | seconds |")
	fmt.Fprintln(w, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
	for _, run := range r.Runs {
		outcome := run.State
		if run.Err != "" {
			outcome += " (" + run.Err + ")"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %v | %.1f |\n", run.ID, outcome, run.Epochs, r.faultsIn(run.ID), run.Failures, run.Preemptions, run.Redone, run.Corrupt, run.Identical, run.Seconds)
	}
}

func row(name string, fs []Fault) string {
	var det, res []time.Duration
	ok := 0
	for _, f := range fs {
		if f.OK {
			ok++
		}
		if f.Detected > 0 {
			det = append(det, f.Detected)
		}
		if f.Resumed > 0 {
			res = append(res, f.Resumed)
		}
	}
	return fmt.Sprintf("| %s | %d | %d | %s | %s | %s | %s |", name, len(fs), ok, dur(median(det)), dur(maxOf(det)), dur(median(res)), dur(maxOf(res)))
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// Costs is one line of what a session's faults cost in all: how many
// restores came from a survivor, the steps trained again, and the bytes
// read from storage.
func (r *Report) Costs() string {
	survivor, known, lost, most := 0, 0, 0, 0
	var bytes int64
	for _, f := range r.Faults {
		if f.RestoredFrom == "survivor" {
			survivor++
		}
		if f.StepsLost >= 0 {
			known++
			lost += f.StepsLost
			most = max(most, f.StepsLost)
		}
		bytes += f.BlobBytes
	}
	return fmt.Sprintf("%d of %d restores from a survivor; steps lost %d in all (max %d, over %d faults whose gang had survivors); %s read from storage; %d gangs broken beyond the faults struck", survivor, len(r.Faults), lost, most, known, mib(bytes), r.Unexplained())
}

// faultsIn counts the faults struck in run id.
func (r *Report) faultsIn(id string) int {
	n := 0
	for _, f := range r.Faults {
		if f.Run == id {
			n++
		}
	}
	return n
}

// Unexplained counts the failures and preemptions the runs counted beyond
// one per fault struck in them, the reference run's included: a gang that
// broke with nothing struck (a healthy rank taken for stalled, say). A fault
// breaks at most one gang.
func (r *Report) Unexplained() int {
	n := r.ReferenceBreaks
	for _, run := range r.Runs {
		n += max(0, run.Failures+run.Preemptions-r.faultsIn(run.ID))
	}
	return n
}

func median(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func maxOf(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return slices.Max(d)
}

func dur(d time.Duration) string {
	if d == 0 {
		return "–"
	}
	return strings.TrimSuffix(fmt.Sprintf("%.2fs", d.Seconds()), "")
}

// Problems lists what broke a guarantee: a run that did not complete or
// whose weights differ from the uninterrupted run, or a fault not recovered.
func (r *Report) Problems() []string {
	var out []string
	for _, run := range r.Runs {
		if run.Err != "" || run.State != "completed" {
			out = append(out, fmt.Sprintf("run %s: %s %s", run.ID, run.State, run.Err))
		} else if !run.Identical {
			out = append(out, fmt.Sprintf("run %s: final weights differ from the uninterrupted run", run.ID))
		}
	}
	for _, f := range r.Faults {
		if !f.OK {
			out = append(out, fmt.Sprintf("%s in %s (%s on %s): %s", f.Kind, f.Run, f.Phase, f.Target, f.Note))
		}
		if f.RestoredFrom == "survivor" && (f.StepsLost > 1 || f.BlobBytes > 0) {
			out = append(out, fmt.Sprintf("%s in %s (%s on %s): restored from a survivor, yet %d steps lost and %s read from storage", f.Kind, f.Run, f.Phase, f.Target, f.StepsLost, mib(f.BlobBytes)))
		}
	}
	return out
}
