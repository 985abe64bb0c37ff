package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/simfleet"
)

// benchTune is `bench tune`: one hyperparameter search of many trials on
// a simulated fleet (package simfleet says what is simulated), each trial
// a real TrainingWorkflow with its own gang of one fake GPU. It reports
// how the search lived within Temporal's limits: its executions (it
// continues as new), the most events, signals and bytes one execution
// took, and its largest payload.
func benchTune(args []string) error {
	fs := flag.NewFlagSet("tune", flag.ContinueOnError)
	trials := fs.Int("trials", 1000, "trials (num_samples)")
	concurrent := fs.Int("concurrent", 32, "max_concurrent_trials")
	epochs := fs.Int("epochs", 2, "epochs per trial")
	slots := fs.Int("slots", 32, "slots of the fleet (8 per simulated host)")
	epochTime := fs.Duration("epoch-time", 10*time.Millisecond, "what one simulated epoch takes on the trainer")
	timeout := fs.Duration("timeout", time.Hour, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *slots < 8 || *slots%8 != 0 {
		return fmt.Errorf("-slots %d: want whole hosts of 8", *slots)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	sim, err := startSimBench(ctx, "tune", "", simfleet.Options{Hosts: *slots / 8, GPUsPerHost: 8, EpochTime: *epochTime}, worker.Options{})
	if err != nil {
		return err
	}
	defer sim.close()
	train := spec.Training{Trainer: simfleet.Backend, Dataset: spec.Dataset{URL: "mem://"}, Hyper: spec.Hyper{Epochs: *epochs},
		Scaling:    spec.Scaling{Workers: 1, TaskQueue: sim.queue, GangTimeout: spec.Duration(10 * time.Minute)},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(sim.ckpt)}}
	trainJSON, _ := json.Marshal(train)
	input := fmt.Sprintf(`{"name": "tune-bench", "train": %s, "param_space": {"hyper.lr": {"loguniform": [0.0001, 0.1]}},
		"num_samples": %d, "max_concurrent_trials": %d, "metric": "test_accuracy", "mode": "max",
		"scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2, "max_t": %d}}`, trainJSON, *trials, *concurrent, *epochs+1)
	start := time.Now()
	cpu0 := sim.srv.cpuSeconds()
	run, err := sim.c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "tune-bench-" + sim.stamp, TaskQueue: sim.control},
		spec.WorkflowTune, json.RawMessage(input))
	if err != nil {
		return err
	}
	go every(ctx, 30*time.Second, func() { // say where the search stands
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := sim.c.QueryWorkflow(qctx, run.GetID(), "", spec.QueryResults)
		cancel()
		var r spec.TuneResults
		if err == nil && v.Get(&r) == nil {
			fmt.Fprintf(os.Stderr, "bench tune: %v: %d of %d trials started, %v\n", time.Since(start).Round(time.Second), r.Started, r.Total, r.Counts())
		}
	})
	firstRunID := run.GetRunID()
	var res spec.TuneResults
	runErr := run.Get(ctx, &res)
	wall := time.Since(start).Seconds()
	cpu := sim.srv.cpuSeconds() - cpu0
	ch, err := simfleet.MeasureChain(context.Background(), sim.c, run.GetID(), firstRunID)
	if err != nil && runErr == nil {
		runErr = err
	}
	counts := res.Counts()
	ended := 0
	for _, st := range []string{spec.TrialCompleted, spec.TrialEarlyStop, spec.TrialStopped} {
		ended += counts[st]
	}
	completed := runErr == nil && res.State == spec.TuneCompleted && ended == *trials
	fmt.Fprintf(os.Stderr, "bench tune: %v; best trial %d; results %s (%d parts)\n", counts, res.Best, res.ResultsCSV, len(res.Parts))
	table([]string{"trials", "concurrent", "epochs", "wall s", "trials/s", "executions", "max events/execution", "max signals/execution", "max history MiB", "largest payload B", "server CPU s/trial"},
		[][]string{{strconv.Itoa(*trials), strconv.Itoa(*concurrent), strconv.Itoa(*epochs), f2(wall), f2(float64(*trials) / wall), strconv.Itoa(ch.Executions),
			strconv.Itoa(ch.MaxEvents), strconv.Itoa(ch.MaxSignals), f2(float64(ch.MaxHistoryBytes) / (1 << 20)), strconv.Itoa(ch.MaxPayloadBytes), fmt.Sprintf("%.3f", cpu/float64(*trials))}})
	fmt.Printf("tune trials=%d executions=%d completed=%v max_events=%d max_signals=%d max_payload_bytes=%d\n",
		*trials, ch.Executions, completed, ch.MaxEvents, ch.MaxSignals, ch.MaxPayloadBytes)
	if runErr != nil {
		return runErr
	}
	if !completed {
		return errors.New("the search did not complete every trial")
	}
	return nil
}
