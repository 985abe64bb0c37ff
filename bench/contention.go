package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/durabletrain/durabletrain/gpuworker"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/simfleet"
)

// benchContention is `bench contention`: many runs at once competing for
// the slots of a simulated fleet (package simfleet says what is simulated).
// Every run must complete; the table gives how long runs waited for their
// first gang (longest against mean: starvation shows as a long tail), and
// how busy the slots were while some run waited (held by a gang, and
// running an epoch: a partial gang holding slots it cannot use shows as
// the gap between the two).
func benchContention(args []string) error {
	fs := flag.NewFlagSet("contention", flag.ContinueOnError)
	runs := fs.Int("runs", 100, "runs started at once")
	ranks := fs.Int("ranks", 8, "ranks per run")
	slots := fs.Int("slots", 256, "slots of the fleet")
	perHost := fs.Int("gpus-per-host", 8, "GPUs (slots) per simulated host, 1 to 8")
	runPerHost := fs.Int("workers-per-host", 1, "each run's scaling.workers_per_host (1: a run's ranks may land on any hosts' free slots)")
	epochs := fs.Int("epochs", 3, "epochs per run")
	epochTime := fs.Duration("epoch-time", 2*time.Second, "what one simulated epoch takes on the trainer")
	gangTimeout := fs.Duration("gang-timeout", time.Minute, "each run's scaling.gang_timeout")
	partitions := fs.Int("task-queue-partitions", 0, "the dev server's partitions per task queue (0: Temporal's 4; deploy/temporal/durabletrain.yaml sets 1 for the GPU queue)")
	sticky := fs.Duration("sticky-timeout", gpuworker.DefaultStickyTimeout, "the control worker's StickyScheduleToStartTimeout (the worker's -sticky-timeout): a workflow task waiting longer on its sticky queue goes to the shared one, to be replayed in full")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *perHost < 1 || *perHost > 8 || *slots%*perHost != 0 || *runs < 1 || *ranks < 1 || *ranks%*runPerHost != 0 {
		return fmt.Errorf("-slots %d -gpus-per-host %d -ranks %d -workers-per-host %d: want whole hosts of 1 to 8 GPUs and runs of whole hosts", *slots, *perHost, *ranks, *runPerHost)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	sim, err := startSimBench(ctx, "contention", "", simfleet.Options{Hosts: *slots / *perHost, GPUsPerHost: *perHost, EpochTime: *epochTime},
		worker.Options{StickyScheduleToStartTimeout: *sticky}, "-task-queue-partitions", strconv.Itoa(*partitions))
	if err != nil {
		return err
	}
	defer sim.close()
	c, queue, controlQueue, ckpt, fleet, stamp := sim.c, sim.queue, sim.control, sim.ckpt, sim.fleet, sim.stamp

	type sample struct {
		at              time.Time
		held, training  int
		total, finished int
	}
	var mu sync.Mutex
	var samples []sample
	finished := 0
	sampling := make(chan struct{})
	go func() {
		defer close(sampling)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				held, training, total := fleet.Usage()
				mu.Lock()
				samples = append(samples, sample{now, held, training, total, finished})
				done := finished == *runs
				mu.Unlock()
				if done {
					return
				}
			}
		}
	}()
	fmt.Fprintf(os.Stderr, "bench contention: %d runs of %d ranks on %d slots (%d hosts of %d)\n", *runs, *ranks, *slots, *slots / *perHost, *perHost)
	s := spec.Training{Trainer: simfleet.Backend, Dataset: spec.Dataset{URL: "mem://"},
		Hyper:      spec.Hyper{Epochs: *epochs},
		Scaling:    spec.Scaling{Workers: *ranks, WorkersPerHost: *runPerHost, TaskQueue: queue, GangTimeout: spec.Duration(*gangTimeout)},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(ckpt), EveryEpochs: 1},
		// Every host in this process on a few cores (as bench scale): a ring
		// link may go unread for seconds without any rank being stuck.
		Failure: spec.Failure{HeartbeatTimeout: spec.Duration(30 * time.Second), StallTimeout: spec.Duration(15 * time.Second)}}
	input, _ := json.Marshal(s)
	start := time.Now()
	ids := make([]string, *runs)
	errs := make([]error, *runs)
	var wg sync.WaitGroup
	for i := range *runs {
		ids[i] = fmt.Sprintf("contention-%s-%03d", stamp, i)
		wg.Go(func() {
			errs[i] = func() error {
				run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: ids[i], TaskQueue: controlQueue}, spec.WorkflowTraining, json.RawMessage(input))
				if err != nil {
					return err
				}
				var p *spec.Progress
				err = run.Get(ctx, &p)
				mu.Lock()
				finished++
				mu.Unlock()
				if err != nil {
					return err
				}
				if p.State != spec.StateCompleted || p.Epoch != *epochs {
					return fmt.Errorf("ended %s at epoch %d of %d", p.State, p.Epoch, *epochs)
				}
				return nil
			}()
		})
	}
	wg.Wait()
	wall := time.Since(start)
	<-sampling
	completed := 0
	for i, err := range errs {
		if err == nil {
			completed++
		} else {
			fmt.Fprintf(os.Stderr, "bench contention: run %s: %v\n", ids[i], err)
		}
	}
	// Each run's wait: from its start to its first epoch, from its history.
	waits := make([]float64, *runs)
	intervals := make([][2]time.Time, *runs)
	forming := 0.0              // slot-seconds held by gangs not yet whole
	tasks, stickyMissed := 0, 0 // workflow tasks, and those that waited out the sticky timeout
	for i, id := range ids {
		h, err := readRunHistory(context.Background(), c, id)
		if err != nil {
			return fmt.Errorf("reading %s's history: %w", id, err)
		}
		from, to, grants := h.from, h.firstEpoch, h.grants
		tasks, stickyMissed = tasks+h.tasks, stickyMissed+h.stickyTimeouts
		waits[i], intervals[i] = to.Sub(from).Seconds(), [2]time.Time{from, to}
		for _, g := range grants {
			forming += to.Sub(g).Seconds() * float64(*runPerHost)
		}
	}
	var heldWhileWaiting, trainingWhileWaiting, n float64
	for _, s := range samples {
		waiting := false
		for _, iv := range intervals {
			waiting = waiting || (!s.at.Before(iv[0]) && s.at.Before(iv[1]))
		}
		if waiting && s.total > 0 {
			heldWhileWaiting += float64(s.held) / float64(s.total)
			trainingWhileWaiting += float64(s.training) / float64(s.total)
			n++
		}
	}
	mean := 0.0
	for _, w := range waits {
		mean += w / float64(len(waits))
	}
	slices.Sort(waits)
	pct := func(x float64) string {
		if n == 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f%%", 100*x/n)
	}
	// The share of the fleet's slot-seconds, from the first start to the
	// last first epoch, that gangs still forming held: what partial gangs cost.
	var first, last time.Time
	for _, iv := range intervals {
		if first.IsZero() || iv[0].Before(first) {
			first = iv[0]
		}
		if iv[1].After(last) {
			last = iv[1]
		}
	}
	formingShare := forming / max(1e-9, last.Sub(first).Seconds()*float64(*slots))
	table([]string{"runs", "ranks/run", "slots", "completed", "wall s", "wait mean s", "wait p50 s", "wait max s", "max/mean", "slots held while runs wait", "slots training while runs wait", "held by gangs forming", "sticky timeout", "workflow tasks", "sticky timeouts"},
		[][]string{{strconv.Itoa(*runs), strconv.Itoa(*ranks), strconv.Itoa(*slots), fmt.Sprintf("%d/%d", completed, *runs), f2(wall.Seconds()),
			f2(mean), f2(simfleet.Quantile(waits, 0.5)), f2(waits[len(waits)-1]), f2(waits[len(waits)-1] / max(mean, 1e-9)),
			pct(heldWhileWaiting), pct(trainingWhileWaiting), fmt.Sprintf("%.0f%%", 100*formingShare),
			sticky.String(), strconv.Itoa(tasks), strconv.Itoa(stickyMissed)}})
	fmt.Printf("contention runs=%d ranks=%d slots=%d completed=%d wait_mean_s=%.2f wait_max_s=%.2f held_while_waiting=%s training_while_waiting=%s sticky_timeout=%v workflow_tasks=%d sticky_timeouts=%d\n",
		*runs, *ranks, *slots, completed, mean, waits[len(waits)-1], pct(heldWhileWaiting), pct(trainingWhileWaiting), *sticky, tasks, stickyMissed)
	if completed != *runs {
		return errors.New("not every run completed")
	}
	return nil
}

// runHistory is what bench contention reads off one run's history.
type runHistory struct {
	// from is when the run started, firstEpoch when its first epoch was
	// scheduled (how long it waited for its first gang), and grants when
	// each slot grant before it arrived (a gang holds a granted host until
	// it is whole).
	from, firstEpoch time.Time
	grants           []time.Time
	// tasks counts its workflow tasks, stickyTimeouts those that timed out
	// before a worker took them (ScheduleToStart: on a sticky queue, the
	// sticky timeout; the task then goes to the shared queue, replayed in full).
	tasks, stickyTimeouts int
}

// readRunHistory reads a run's whole history once.
func readRunHistory(ctx context.Context, c client.Client, id string) (runHistory, error) {
	var h runHistory
	it := c.GetWorkflowHistory(ctx, id, "", false, 0)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			return h, err
		}
		switch {
		case e.GetWorkflowExecutionStartedEventAttributes() != nil && h.from.IsZero():
			h.from = e.GetEventTime().AsTime()
		case e.GetWorkflowTaskScheduledEventAttributes() != nil:
			h.tasks++
		case e.GetWorkflowTaskTimedOutEventAttributes().GetTimeoutType() == enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START:
			h.stickyTimeouts++
		}
		if !h.firstEpoch.IsZero() {
			continue
		}
		if s := e.GetWorkflowExecutionSignaledEventAttributes(); s != nil && s.GetSignalName() == spec.SignalSlotGranted {
			h.grants = append(h.grants, e.GetEventTime().AsTime())
		}
		if a := e.GetActivityTaskScheduledEventAttributes(); a != nil && a.GetActivityType().GetName() == spec.ActivityRunEpoch {
			h.firstEpoch = e.GetEventTime().AsTime()
		}
	}
	if h.firstEpoch.IsZero() {
		return h, errors.New("no epoch was scheduled")
	}
	return h, nil
}
