// Package chaos owns the fault-injection harness: it runs the dev server and
// worker processes as separate hosts (network namespaces on one machine)
// under a supervisor that restarts what dies, trains, injects real faults at
// points chosen from a seed (kill -9, SIGSTOP, a partition, SIGTERM, the
// Temporal server killed and restarted on its SQLite file, a corrupted latest
// checkpoint), measures detection and recovery, and checks every run ends
// with weights bit-identical to an uninterrupted run.
package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
)

// Fault kinds.
const (
	Kill      = "kill-9"
	Stop      = "sigstop"
	Partition = "partition"
	Term      = "sigterm"
	Server    = "server-restart"
	Corrupt   = "corrupt-checkpoint"
)

// Kinds is every fault kind.
var Kinds = []string{Kill, Stop, Partition, Term, Server, Corrupt}

// Phases a fault lands in.
const (
	PhaseGang       = "gang-formation"
	PhaseEpoch      = "mid-epoch"
	PhaseCheckpoint = "checkpoint-write"
)

// workflowTaskTimeout is the runs' workflow task timeout. Every host here
// is a workflow worker too (-role both): a host cut off just after it took a
// workflow task holds the run up for this long before the server gives the
// task to another (Temporal's default, 10 s, made a partition look 11–12 s
// slow to detect). A training run's workflow tasks take milliseconds.
const workflowTaskTimeout = 2 * time.Second

// Config is one chaos session.
type Config struct {
	Seed           int64
	Faults         int      // faults to inject in all; every kind appears once there are as many as kinds
	Kinds          []string // default Kinds
	FaultsPerRun   int      // default 3
	Hosts          int      // worker hosts (1 slot each); default 3: a 2-rank gang and a spare
	Ranks          int      // default 2
	Epochs         int      // per run; default 8
	EverySteps     int      // checkpoint.every_steps; default 200
	BatchSize      int      // per rank; default 32
	Dataset        string   // default the full Fashion-MNIST
	Bin            string   // directory with devserver and worker
	Dir            string   // work directory: SQLite file, checkpoints, logs
	Log            io.Writer
	HeartbeatLimit time.Duration // failure.heartbeat_timeout; default 4s
	// StallLimit is failure.stall_timeout: how long a rank waits on a
	// silent ring neighbour (a SIGSTOP, a partition) before it breaks the
	// gang. Default 1s: detection, not recovery, sets the time to train
	// again after a hang (BENCHMARKS.md).
	StallLimit time.Duration
	// FromStorage turns failure.recover_from_peers off: every new gang
	// restores the latest checkpoint, as before survivors kept their state.
	FromStorage bool
	// StickyTimeout is the workers' -sticky-timeout; 0: theirs by default.
	StickyTimeout time.Duration
}

// The runs' failure.heartbeat_timeout and failure.stall_timeout unless a
// Config says otherwise.
const (
	DefaultHeartbeatLimit = 4 * time.Second
	DefaultStallLimit     = time.Second
)

func (c Config) withDefaults() Config {
	if len(c.Kinds) == 0 {
		c.Kinds = Kinds
	}
	if c.FaultsPerRun == 0 {
		c.FaultsPerRun = 3
	}
	if c.Hosts == 0 {
		c.Hosts = 3
	}
	if c.Ranks == 0 {
		c.Ranks = 2
	}
	if c.Epochs == 0 {
		c.Epochs = 8
	}
	if c.EverySteps == 0 {
		c.EverySteps = 200
	}
	if c.BatchSize == 0 {
		c.BatchSize = 32
	}
	if c.Dataset == "" {
		c.Dataset = spec.DefaultDatasetURL
	}
	if c.HeartbeatLimit == 0 {
		c.HeartbeatLimit = DefaultHeartbeatLimit
	}
	if c.StallLimit == 0 {
		c.StallLimit = DefaultStallLimit
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	return c
}

// Fault is one injected fault and what it cost.
type Fault struct {
	Run      string
	Kind     string
	Phase    string
	Target   string
	Detected time.Duration // until the run counted it (0: not a failure of the run, as a server restart)
	Resumed  time.Duration // until a gang trained again (server: until the run made progress again)
	Note     string
	OK       bool
	// What the gang that trained again restored (from the run's
	// "restored" incident): "survivor" or "storage"; the steps it trained
	// again (-1: unknown, no rank of it survived the gang before); and the
	// bytes a rank of it read from storage.
	RestoredFrom string
	StepsLost    int
	BlobBytes    int64
	gen          int       // the run's generation when struck
	at           time.Time // when it was injected
	tooLate      bool      // the run ended before it could be struck
}

// RunResult is one training run under faults.
type RunResult struct {
	ID          string
	State       string
	Epochs      int
	Failures    int
	Preemptions int
	Redone      int // epochs trained more than once
	Corrupt     int // corrupt checkpoints detected and skipped
	Identical   bool
	Seconds     float64
	Err         string
}

// Report is a chaos session's outcome.
type Report struct {
	Faults    []Fault
	Runs      []RunResult
	Reference string // SHA-256 of the uninterrupted run's final state
	// ReferenceBreaks counts the failures and preemptions of the run with
	// no faults: each a gang broken with nothing struck.
	ReferenceBreaks int
}

// Harness runs a chaos session.
type Harness struct {
	cfg     Config
	net     hostNet
	server  *proc
	hosts   []*proc
	client  client.Client
	rng     *rand.Rand
	ckptDir string
}

// Run sets the hosts up, trains a reference run and the runs under faults,
// and tears everything down.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	h, err := start(ctx, cfg, hostNet{bridge: "dtcbr0", prefix: "10.231.7"})
	if err != nil {
		return nil, err
	}
	defer h.close()

	rep := &Report{}
	h.logf("reference run: %d ranks, %d epochs, no faults", cfg.Ranks, cfg.Epochs)
	ref, err := h.runWithFaults(ctx, "chaos-reference", nil, rep)
	if err != nil {
		return rep, fmt.Errorf("reference run: %w", err)
	}
	if rep.Reference, err = h.finalState(ctx, ref); err != nil {
		return rep, fmt.Errorf("reference run: %w", err)
	}
	if len(rep.Runs) > 0 {
		rep.ReferenceBreaks = rep.Runs[0].Failures + rep.Runs[0].Preemptions
	}
	rep.Runs = rep.Runs[:0]
	plan := h.plan()
	again := map[string]bool{} // kinds planned again once already
	for i := 0; len(plan) > 0; i++ {
		n := min(cfg.FaultsPerRun, len(plan))
		kinds := plan[:n]
		plan = plan[n:]
		id := fmt.Sprintf("chaos-%d-%d", cfg.Seed, i)
		h.logf("run %s: faults %s", id, strings.Join(kinds, ", "))
		p, err := h.runWithFaults(ctx, id, kinds, rep)
		var later []string
		rep.Faults, later = planAgain(rep.Faults, len(kinds), again)
		for _, kind := range later {
			h.logf("  %s: planned again in a later run", kind)
		}
		plan = append(plan, later...)
		r := &rep.Runs[len(rep.Runs)-1]
		if err != nil {
			r.Err = err.Error()
			continue
		}
		state, err := h.finalState(ctx, p)
		if err != nil {
			r.Err = err.Error()
			continue
		}
		r.Identical = state == rep.Reference
	}
	return rep, nil
}

// planAgain takes the last n faults, those of the run just ended: one the
// run ended before it could strike (earlier faults took the run's time)
// tested nothing, so its kind goes back to the plan, once per kind (again
// remembers), and its record goes. A second miss stays, as a problem.
func planAgain(faults []Fault, n int, again map[string]bool) (kept []Fault, later []string) {
	base := len(faults) - n
	kept = append([]Fault(nil), faults[:base]...)
	for _, f := range faults[base:] {
		if f.tooLate && !again[f.Kind] {
			again[f.Kind] = true
			later = append(later, f.Kind)
			continue
		}
		kept = append(kept, f)
	}
	return kept, later
}

// start makes the hosts, starts the dev server and a worker per host, and
// connects; close undoes it all. cfg must have its defaults.
func start(ctx context.Context, cfg Config, net hostNet) (*Harness, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	h := &Harness{cfg: cfg, net: net, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0xc4a05))}
	h.ckptDir = filepath.Join(cfg.Dir, "checkpoints")
	for _, d := range []string{h.ckptDir, filepath.Join(cfg.Dir, "logs")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := h.net.setUp(cfg.Hosts); err != nil {
		return nil, err
	}
	err := h.startProcesses()
	if err == nil {
		h.client, err = h.dial(ctx)
	}
	if err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

func (h *Harness) close() {
	if h.client != nil {
		h.client.Close()
	}
	h.stopProcesses()
	h.net.tearDown(h.cfg.Hosts)
}

// plan is the sequence of fault kinds: every kind once per round, in an
// order drawn from the seed.
func (h *Harness) plan() []string {
	var plan []string
	for len(plan) < h.cfg.Faults {
		round := append([]string(nil), h.cfg.Kinds...)
		h.rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
		plan = append(plan, round...)
	}
	return plan[:h.cfg.Faults]
}

func (h *Harness) logf(format string, args ...any) {
	fmt.Fprintf(h.cfg.Log, "chaos: "+format+"\n", args...)
}

func (h *Harness) spec(id string) spec.Training {
	return spec.Training{
		Name:       id,
		Dataset:    spec.Dataset{URL: h.cfg.Dataset},
		Hyper:      spec.Hyper{Epochs: h.cfg.Epochs, BatchSize: h.cfg.BatchSize},
		Scaling:    spec.Scaling{Workers: h.cfg.Ranks, TaskQueue: "chaos-gpu", GangTimeout: spec.Duration(time.Minute)},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(h.ckptDir) + "?metadata=skip", EverySteps: h.cfg.EverySteps, KeepLast: spec.Int(3)},
		Failure: spec.Failure{MaxFailures: spec.Int(20), MaxPreemptions: spec.Int(20), HeartbeatTimeout: spec.Duration(h.cfg.HeartbeatLimit),
			StallTimeout: spec.Duration(h.cfg.StallLimit), RecoverFromPeers: spec.Bool(!h.cfg.FromStorage)},
	}
}

// runWithFaults starts a run, injects the given faults one after another
// (each once the run has recovered from the last), and waits for the end.
func (h *Harness) runWithFaults(ctx context.Context, id string, kinds []string, rep *Report) (*spec.Progress, error) {
	start := time.Now()
	input, _ := json.Marshal(h.spec(id))
	run, err := h.client.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: id, TaskQueue: "chaos", WorkflowTaskTimeout: workflowTaskTimeout}, spec.WorkflowTraining, json.RawMessage(input))
	if err != nil {
		return nil, err
	}
	for i, kind := range kinds {
		phases := []string{PhaseEpoch, PhaseCheckpoint}
		if i == 0 {
			phases = append(phases, PhaseGang)
		}
		f := h.inject(ctx, id, kind, phases[h.rng.IntN(len(phases))])
		f.StepsLost = -1
		h.logf("  %-18s %-16s on %-9s at %s detected %-8v resumed %-8v %s", f.Kind, f.Phase, f.Target, stamp(f.at), f.Detected.Round(time.Millisecond), f.Resumed.Round(time.Millisecond), f.Note)
		rep.Faults = append(rep.Faults, f)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var p *spec.Progress
	err = run.Get(wctx, &p)
	if herr := h.saveHistory(wctx, id); herr != nil {
		h.logf("  could not keep %s's history: %v", id, herr)
	}
	r := RunResult{ID: id, Seconds: time.Since(start).Seconds()}
	if p != nil {
		r.State, r.Epochs, r.Failures, r.Preemptions = p.State, p.Epoch, p.Failures, p.Preemptions
		seen := map[int]bool{}
		for _, m := range p.Metrics {
			if seen[m.Epoch] {
				r.Redone++
			}
			seen[m.Epoch] = true
		}
		for _, inc := range p.Incidents {
			if inc.Kind == "corrupt-checkpoint" {
				r.Corrupt++
			}
		}
		costs(rep.Faults[len(rep.Faults)-len(kinds):], p)
	}
	rep.Runs = append(rep.Runs, r)
	if err != nil {
		return p, err
	}
	if p.State != spec.StateCompleted || p.Epoch != h.cfg.Epochs {
		return p, fmt.Errorf("run %s ended %s at epoch %d of %d", id, p.State, p.Epoch, h.cfg.Epochs)
	}
	return p, nil
}
