package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/connect"
	"github.com/durabletrain/durabletrain/gpuworker"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/simfleet"
)

// benchScale runs one row of the scale table: a run of -ranks ranks on a
// simulated fleet (package simfleet says what is simulated) against a dev
// server of its own, in a child process whose CPU time it reads.
func benchScale(args []string) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	ranks := fs.Int("ranks", 64, "ranks of the run")
	perHost := fs.Int("gpus-per-host", 8, "GPUs (ranks) per simulated host, 1 to 8")
	epochs := fs.Int("epochs", 3, "epochs")
	epochTime := fs.Duration("epoch-time", time.Second, "what one simulated epoch takes on the trainer")
	perRank := fs.Bool("per-rank", false, "the design before hosts: one hold and one RunEpoch per rank (scaling.workers_per_host 1)")
	address := fs.String("address", "", "a Temporal server to use instead of starting one (its CPU time is then not measured)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up after this long")
	ckptEvery := fs.Int("checkpoint-every", 1, "checkpoint.every_epochs")
	suggestCAN := fs.Int("suggest-continue-as-new", 0, "history length at which the server tells the run to continue as new (0: Temporal's 4096); lower to cross the boundary often")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *suggestCAN > 0 && *address != "" {
		return errors.New("-suggest-continue-as-new configures the bench's own server: not with -address")
	}
	if *perHost < 1 || *perHost > 8 || *ranks < *perHost || *ranks%*perHost != 0 {
		return fmt.Errorf("-ranks %d -gpus-per-host %d: want 1 to 8 GPUs per host and whole hosts", *ranks, *perHost)
	}
	hosts := *ranks / *perHost
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	sim, err := startSimBench(ctx, "scale", *address, simfleet.Options{Hosts: hosts, GPUsPerHost: *perHost, EpochTime: *epochTime}, worker.Options{},
		"-suggest-continue-as-new", strconv.Itoa(*suggestCAN))
	if err != nil {
		return err
	}
	defer sim.close()
	c, srv, queue, ckpt, fleet, stamp := sim.c, sim.srv, sim.queue, sim.ckpt, sim.fleet, sim.stamp
	fmt.Fprintf(os.Stderr, "bench scale: %d simulated hosts of %d GPUs up in %v\n", hosts, *perHost, time.Since(start).Round(time.Millisecond))

	wph := *perHost
	if *perRank {
		wph = 1
	}
	s := spec.Training{Trainer: simfleet.Backend, Dataset: spec.Dataset{URL: "mem://"},
		Hyper:      spec.Hyper{Epochs: *epochs},
		Scaling:    spec.Scaling{Workers: *ranks, WorkersPerHost: wph, TaskQueue: queue, GangTimeout: spec.Duration(10 * time.Minute)},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(ckpt), EveryEpochs: *ckptEvery},
		// A simulated fleet runs every host in this process on a few cores: a
		// ring link may go unread for seconds without any rank being stuck.
		Failure: spec.Failure{HeartbeatTimeout: spec.Duration(30 * time.Second), StallTimeout: spec.Duration(15 * time.Second)}}
	input, _ := json.Marshal(s)
	cpu0 := srv.cpuSeconds()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "scale-" + stamp, TaskQueue: sim.control},
		spec.WorkflowTraining, json.RawMessage(input))
	if err != nil {
		return err
	}
	go every(ctx, 15*time.Second, func() { // say where the run stands
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := c.QueryWorkflow(qctx, run.GetID(), run.GetRunID(), spec.QueryProgress)
		cancel()
		var p spec.Progress
		if err == nil && v.Get(&p) == nil {
			last := ""
			if n := len(p.Incidents); n > 0 {
				last = fmt.Sprintf("; last incident: %s: %s", p.Incidents[n-1].Kind, p.Incidents[n-1].Detail)
			}
			fmt.Fprintf(os.Stderr, "bench scale: %s, epoch %d/%d, gang %d, world %d, trained %d rank-epochs %s%s\n",
				p.State, p.Epoch, p.Epochs, p.Generation, p.World, fleet.Epochs.Load(), p.Waiting, last)
		}
	})
	firstRunID := run.GetRunID() // Get follows continue-as-new and moves GetRunID to the last run
	var p *spec.Progress
	runErr := run.Get(ctx, &p)
	cpu := srv.cpuSeconds() - cpu0
	if p != nil {
		for _, inc := range p.Incidents {
			fmt.Fprintf(os.Stderr, "bench scale: incident at epoch %d, gang %d: %s: %s\n", inc.Epoch, inc.Generation, inc.Kind, inc.Detail)
		}
	}
	completed := runErr == nil && p != nil && p.State == spec.StateCompleted && p.Epoch == *epochs
	rep, err := simfleet.Measure(context.Background(), c, run.GetID(), firstRunID)
	if err != nil && runErr == nil {
		runErr = err
	}
	limit, used := rep.Binding()
	fmt.Fprintf(os.Stderr, "bench scale: %d executions, %d gangs formed, %d taken over at continue-as-new, %d epochs measured, at most %d signals and %d events in one execution; %d trainers built, %d checkpoint restores\n",
		rep.Executions, len(rep.GangSeconds), len(rep.HandoverSeconds), rep.Epochs, rep.MaxSignals, rep.MaxEvents, fleet.Ranks.Load(), fleet.Restores.Load())
	if n := len(rep.OverheadSeconds); n >= 2000 {
		// A long run's overhead should not grow with its epochs: the first
		// thousand against the last.
		first, last := rep.OverheadSeconds[:1000], rep.OverheadSeconds[n-1000:]
		fmt.Fprintf(os.Stderr, "bench scale: Temporal overhead per epoch, first 1,000 epochs p50 %.4f s (p99 %.4f), last 1,000 p50 %.4f s (p99 %.4f)\n",
			simfleet.Quantile(first, 0.5), simfleet.Quantile(first, 0.99), simfleet.Quantile(last, 0.5), simfleet.Quantile(last, 0.99))
	}
	if boundary, others := rep.Overheads(); len(boundary) > 0 {
		fmt.Fprintf(os.Stderr, "bench scale: Temporal overhead of the first epoch after continue-as-new p50 %.3f s (max %.3f, %d epochs), of the others p50 %.3f s (max %.3f, %d epochs); handover p50 %.3f s (max %.3f)\n",
			simfleet.Quantile(boundary, 0.5), simfleet.Quantile(boundary, 1), len(boundary), simfleet.Quantile(others, 0.5), simfleet.Quantile(others, 1), len(others),
			simfleet.Quantile(rep.HandoverSeconds, 0.5), simfleet.Quantile(rep.HandoverSeconds, 1))
	}
	design := "hosts"
	if *perRank {
		design = "per-rank"
	}
	table([]string{"design", "ranks", "hosts", "executions", "epochs", "gang p50 s", "gang p99 s", "Temporal overhead/epoch p50 s", "max s", "agent s/epoch p50", "events/epoch", "largest payload B", "peak pending", "server CPU s/epoch", "closest limit"},
		[][]string{{design, strconv.Itoa(*ranks), strconv.Itoa(hosts), strconv.Itoa(rep.Executions), strconv.Itoa(rep.Epochs),
			f2(simfleet.Quantile(rep.GangSeconds, 0.5)), f2(simfleet.Quantile(rep.GangSeconds, 0.99)),
			f2(simfleet.Quantile(rep.OverheadSeconds, 0.5)), f2(simfleet.Quantile(rep.OverheadSeconds, 1)), f2(simfleet.Quantile(rep.AgentSeconds, 0.5)),
			fmt.Sprintf("%.1f", rep.EventsPerEpoch()), strconv.Itoa(rep.MaxPayloadBytes), strconv.Itoa(rep.PeakPending),
			f2(cpu / float64(max(1, rep.Epochs))), fmt.Sprintf("%s (%.0f%%)", limit, 100*used)}})
	fmt.Printf("scale ranks=%d hosts=%d epochs=%d completed=%v gang_p99_s=%.3f overhead_per_epoch_s=%.3f events_per_epoch=%.1f max_payload_bytes=%d\n",
		*ranks, hosts, *epochs, completed, simfleet.Quantile(rep.GangSeconds, 0.99), simfleet.Quantile(rep.OverheadSeconds, 0.5),
		rep.EventsPerEpoch(), rep.MaxPayloadBytes)
	if runErr != nil {
		return runErr
	}
	if !completed {
		return errors.New("the run did not complete")
	}
	return nil
}

// every calls f every d until ctx ends.
func every(ctx context.Context, d time.Duration, f func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

func f2(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

// simBench is what the fleet benchmarks run on: a dev server of their own
// (unless given an address), a worker of the control queue, and a
// simulated fleet on a GPU queue of its own, with checkpoints in a
// temporary folder.
type simBench struct {
	srv            *serverProc // nil on a server given by address
	c              client.Client
	stamp          string
	queue, control string
	ckpt           string
	fleet          *simfleet.Fleet
	closers        []func()
}

// control is the options of the control queue's workflow worker.
func startSimBench(ctx context.Context, name, address string, o simfleet.Options, control worker.Options, serverArgs ...string) (b *simBench, err error) {
	b = &simBench{stamp: strconv.FormatInt(time.Now().UnixNano(), 36)}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	if address == "" {
		if b.srv, err = startServer(ctx, serverArgs...); err != nil {
			return nil, err
		}
		b.closers = append(b.closers, b.srv.stop)
		address = b.srv.addr
	}
	// The workflows' and the SDK's warnings go to stderr: they say why a
	// gang did not form or did not cross a continue-as-new.
	cfg := zap.NewDevelopmentConfig()
	cfg.Level, cfg.Development, cfg.DisableStacktrace = zap.NewAtomicLevelAt(zap.WarnLevel), false, true
	logger, err := cfg.Build()
	if err != nil {
		return nil, err
	}
	if b.c, err = (connect.Options{Address: address, Namespace: "default"}).Dial(logger); err != nil {
		return nil, err
	}
	b.closers = append(b.closers, b.c.Close)
	b.queue, b.control = name+"-gpu-"+b.stamp, name+"-control-"+b.stamp
	if b.ckpt, err = os.MkdirTemp("", "durabletrain-"+name+"-checkpoints-"); err != nil {
		return nil, err
	}
	b.closers = append(b.closers, func() { os.RemoveAll(b.ckpt) })
	w := worker.New(b.c, b.control, control)
	gpuworker.RegisterWorkflows(w, policy.Policy{StorageRoots: []string{bloburl.FromPath(b.ckpt) + "/", "mem://"}}) // a search's results go beside the checkpoints
	if err := w.Start(); err != nil {
		return nil, err
	}
	b.closers = append(b.closers, w.Stop)
	o.TaskQueue, o.StorageRoot = b.queue, bloburl.FromPath(b.ckpt)+"/"
	if b.fleet, err = simfleet.Start(b.c, o); err != nil {
		return nil, err
	}
	b.closers = append(b.closers, b.fleet.Stop)
	return b, nil
}

// close takes everything down, in the reverse order.
func (b *simBench) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}

// serverProc is a dev server in a child process (cmd/devserver, built here).
type serverProc struct {
	cmd  *exec.Cmd
	addr string
	dir  string
}

func startServer(ctx context.Context, args ...string) (*serverProc, error) {
	dir, err := os.MkdirTemp("", "durabletrain-scale-")
	if err != nil {
		return nil, err
	}
	bin := filepath.Join(dir, "devserver")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/devserver").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("building cmd/devserver (run bench scale from the repository root): %v\n%s", err, out)
	}
	addrs, err := freeAddrs(1)
	if err != nil {
		return nil, err
	}
	_, port, _ := strings.Cut(addrs[0], ":")
	cmd := exec.Command(bin, append([]string{"-db", "", "-port", port, "-ui-port", "0"}, args...)...)
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &serverProc{cmd: cmd, dir: dir, addr: addrs[0]}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "devserver: Temporal frontend on") {
				ready <- true
			}
		}
		ready <- false
	}()
	select {
	case ok := <-ready:
		if ok {
			return p, nil
		}
	case <-time.After(2 * time.Minute):
	}
	p.stop()
	return nil, errors.New("the dev server did not start")
}

func (p *serverProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	p.cmd.Wait()
	os.RemoveAll(p.dir)
}

// cpuSeconds is the server process's user and system CPU time so far.
func (p *serverProc) cpuSeconds() float64 {
	if p == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // clock ticks: USER_HZ is 100 on Linux
}
