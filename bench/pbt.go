package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/simfleet"
)

// benchPBT is `bench pbt`: population-based training against the search
// of fixed hyperparameters on the same budget. Both are real TuneWorkflows
// on the embedded Temporal server, their trials real TrainingWorkflows
// training the native MLP on real data, on simulated hosts (package
// simfleet: real agents and workers, fake GPUs). With the same seed both
// start from the same population of configs; the fixed search trains each
// to the end, PBT lets the weakest trials clone the strongest ones'
// checkpoints and perturb their hyperparameters every interval.
func benchPBT(args []string) error {
	fs := flag.NewFlagSet("pbt", flag.ContinueOnError)
	trials := fs.Int("trials", 8, "trials (the population), all at once")
	epochs := fs.Int("epochs", 8, "epochs per trial")
	interval := fs.Int("interval", 2, "PBT's perturbation_interval, in epochs")
	seedList := fs.String("seeds", "1", "search seeds, comma-separated")
	data := fs.String("data", dataset.DefaultURL, "Fashion-MNIST bucket URL (file://)")
	space := fs.String("space", `{"config.lr": {"loguniform": [1e-5, 0.1]}, "config.batch_size": {"choice": [32, 64, 128, 256, 512]}}`, "param_space, as JSON")
	timeout := fs.Duration("timeout", time.Hour, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !strings.HasPrefix(*data, "file://") {
		return fmt.Errorf("-data %s: want a file:// URL (the simulated hosts share the machine)", *data)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	hosts := (*trials + 7) / 8
	sim, err := startSimBench(ctx, "pbt", "", simfleet.Options{Hosts: hosts, GPUsPerHost: min(8, *trials), Native: true,
		DataRoot: strings.TrimSuffix(*data, "/") + "/"}, worker.Options{})
	if err != nil {
		return err
	}
	defer sim.close()
	train := spec.Training{Dataset: spec.Dataset{URL: *data}, Hyper: spec.Hyper{Epochs: *epochs},
		Scaling:    spec.Scaling{Workers: 1, TaskQueue: sim.queue, GangTimeout: spec.Duration(10 * time.Minute)},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(sim.ckpt)}}
	trainJSON, _ := json.Marshal(train)
	fmt.Printf("# PBT vs fixed hyperparameters: %d trials at once, %d epochs each, native MLP on %s; PBT every %d epochs\n", *trials, *epochs, *data, *interval)
	fmt.Printf("# param_space: %s\n\n", strings.Join(strings.Fields(*space), " "))
	var rows [][]string
	for _, field := range strings.Split(*seedList, ",") {
		seed, err := strconv.ParseUint(strings.TrimSpace(field), 10, 64)
		if err != nil {
			return fmt.Errorf("-seeds: %q is not a seed", field)
		}
		row := []string{strconv.FormatUint(seed, 10)}
		for _, scheduler := range []string{`{"type": "fifo"}`, fmt.Sprintf(`{"type": "pbt", "perturbation_interval": %d}`, *interval)} {
			input := fmt.Sprintf(`{"name": "pbt-bench-%s-%d-%d", "train": %s, "param_space": %s, "num_samples": %d, "max_concurrent_trials": %d,
				"metric": "test_accuracy", "mode": "max", "seed": %d, "scheduler": %s}`, sim.stamp, seed, len(row), trainJSON, *space, *trials, *trials, seed, scheduler)
			start := time.Now()
			run, err := sim.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: fmt.Sprintf("pbt-bench-%s-%d-%d", sim.stamp, seed, len(row)), TaskQueue: sim.control},
				spec.WorkflowTune, json.RawMessage(input))
			if err != nil {
				return err
			}
			var res spec.TuneResults
			if err := run.Get(ctx, &res); err != nil {
				return err
			}
			best, mean, exploits := -1.0, 0.0, 0
			for _, t := range res.Trials {
				if t.Last != nil {
					mean += *t.Last / float64(len(res.Trials))
					best = max(best, *t.Last)
				}
				exploits += t.Segment
			}
			fmt.Fprintf(os.Stderr, "bench pbt: seed %d %s: %s, best trial %d, %.0fs\n", seed, res.Scheduler, res.State, res.Best, time.Since(start).Seconds())
			if res.BestTrial != nil {
				b := res.BestTrial
				fmt.Printf("seed %d %-4s best trial %d: test accuracy %.4f, config %s", seed, res.Scheduler, b.Trial, *b.Last, spec.Config(b.Config).JSON())
				for _, e := range b.Lineage {
					fmt.Printf("; epoch %d took trial %d's %s %s", e.Epoch, e.From, e.Cloned, spec.Config(e.Changed).JSON())
				}
				fmt.Println()
			}
			row = append(row, f4(best), f4(mean))
			if res.Scheduler == "pbt" {
				row = append(row, strconv.Itoa(exploits))
			}
			row = append(row, fmt.Sprintf("%.0f", time.Since(start).Seconds()))
		}
		rows = append(rows, row)
	}
	fmt.Println()
	table([]string{"seed", "fixed: best test accuracy", "fixed: mean", "fixed wall s", "pbt: best test accuracy", "pbt: mean", "pbt exploits", "pbt wall s"}, rows)
	return nil
}
