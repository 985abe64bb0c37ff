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
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.temporal.io/sdk/client"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/connect"
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

// Build compiles the dev server and the worker (with the given build tags)
// into bin, for Config.Bin.
func Build(bin, tags string, log io.Writer) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	for _, b := range [][]string{{"devserver", ""}, {"worker", tags}} {
		fmt.Fprintf(log, "chaos: building %s\n", b[0])
		cmd := exec.Command("go", "build", "-tags", b[1], "-o", filepath.Join(bin, b[0]), "./cmd/"+b[0])
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %w\n%s", b[0], err, out)
		}
	}
	return nil
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(out)) == "" || strings.TrimSpace(string(out)) == os.DevNull {
		return "", fmt.Errorf("chaos: run from within the durabletrain module (go env GOMOD: %v)", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
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

func (h *Harness) serverAddr() string { return h.net.serverIP() + ":7233" }

func (h *Harness) startProcesses() error {
	logs := filepath.Join(h.cfg.Dir, "logs")
	h.server = &proc{name: "devserver", bin: filepath.Join(h.cfg.Bin, "devserver"), delay: 0,
		args:    []string{"-ip", h.net.serverIP(), "-insecure-public", "-port", "7233", "-ui-port", "0", "-db", filepath.Join(h.cfg.Dir, "temporal.db")},
		logPath: filepath.Join(logs, "devserver.log")}
	if err := h.server.start(); err != nil {
		return err
	}
	for i := range h.cfg.Hosts {
		p := &proc{name: fmt.Sprintf("host-%d", i), netns: h.net.ns(i), bin: filepath.Join(h.cfg.Bin, "worker"), delay: time.Second,
			args: []string{"-address", h.serverAddr(), "-role", "both", "-slots", "1", "-identity", fmt.Sprintf("host-%d", i),
				"-control-queue", "chaos", "-task-queue", "chaos-gpu", "-collective-bind", h.net.ip(i) + ":7070",
				"-collective-transport", "tcp", "-grace", "5s",
				// Storage: the harness's checkpoints, and the data set wherever it is.
				"-storage-roots", bloburl.FromPath(h.ckptDir) + "/," + dataRoot(h.cfg.Dataset) + ",mem://"},
			logPath: filepath.Join(logs, fmt.Sprintf("host-%d.log", i))}
		if h.cfg.StickyTimeout > 0 {
			p.args = append(p.args, "-sticky-timeout", h.cfg.StickyTimeout.String())
		}
		if err := p.start(); err != nil {
			return err
		}
		h.hosts = append(h.hosts, p)
	}
	return nil
}

func (h *Harness) stopProcesses() {
	for _, p := range h.hosts {
		p.stop()
	}
	if h.server != nil {
		h.server.stop()
	}
}

func (h *Harness) dial(ctx context.Context) (client.Client, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := connect.Options{Address: h.serverAddr(), Namespace: "default"}.Dial(zap.NewNop())
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("the dev server never answered at %s: %w", h.serverAddr(), err)
		}
		time.Sleep(500 * time.Millisecond)
	}
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

// progress queries the run; nil while the server does not answer.
func (h *Harness) progress(ctx context.Context, id string) *spec.Progress {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v, err := h.client.QueryWorkflow(qctx, id, "", spec.QueryProgress)
	if err != nil {
		return nil
	}
	var p spec.Progress
	if v.Get(&p) != nil {
		return nil
	}
	return &p
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

// costs fills in what each fault of a run cost from the "restored"
// incident of the first gang formed after it (rank 0 reports it once the
// gang agreed on its state). Where the next fault broke that gang before
// then, the fault's cost is not known and stays blank (with a note), not
// taken from the next fault's gang.
func costs(faults []Fault, p *spec.Progress) {
	stepsPerEpoch := 0
	for _, m := range p.Metrics {
		stepsPerEpoch = max(stepsPerEpoch, m.Steps)
	}
	for i := range faults {
		f := &faults[i]
		if f.Detected == 0 {
			continue // no gang broke (a server restart, or a host that held no slot of it)
		}
		// The generations this fault's recovery can have used: up to the
		// one the next fault that broke a gang struck.
		until := math.MaxInt
		for _, next := range faults[i+1:] {
			if next.Detected > 0 {
				until = next.gen
				break
			}
		}
		found := false
		for _, inc := range p.Incidents {
			if inc.Kind != spec.IncidentRestored || inc.Restore == nil || inc.Generation <= f.gen || inc.Generation > until {
				continue
			}
			found = true
			rr := inc.Restore
			f.RestoredFrom, f.BlobBytes = "storage", rr.Bytes
			if rr.Peer != nil {
				f.RestoredFrom = "survivor"
			}
			if at := rr.SurvivorsAt; at != nil && stepsPerEpoch > 0 {
				from := rr.Restored()
				f.StepsLost = (at.Epoch-from.Epoch)*stepsPerEpoch + at.Step - from.Step
			}
			break
		}
		if !found && until != math.MaxInt {
			f.Note = strings.TrimPrefix(f.Note+"; the next fault broke the new gang before its restore was recorded", "; ")
		}
	}
}

// finalState is the SHA-256 of the final checkpoint's objects, verified.
func (h *Harness) finalState(ctx context.Context, p *spec.Progress) (string, error) {
	if p == nil || p.Latest == nil {
		return "", errors.New("no final checkpoint")
	}
	store, err := checkpoint.Open(ctx, p.Latest.URL, nil)
	if err != nil {
		return "", err
	}
	defer store.Close()
	c, err := store.Verify(ctx, p.Latest.Run, p.Latest.ID)
	if err != nil {
		return "", fmt.Errorf("final checkpoint %s: %w", p.Latest.ID, err)
	}
	if c.Manifest.Epoch != h.cfg.Epochs || c.Manifest.Step != 0 {
		return "", fmt.Errorf("final checkpoint %s is at epoch %d step %d", c.Manifest.ID, c.Manifest.Epoch, c.Manifest.Step)
	}
	var sums []string
	for _, o := range c.Manifest.Objects {
		sums = append(sums, o.Name+":"+o.Hash())
	}
	return strings.Join(sums, ","), nil
}

// waitPhase waits until the run is in the phase, and returns the progress then.
func (h *Harness) waitPhase(ctx context.Context, id, phase string) (*spec.Progress, string) {
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		p := h.progress(ctx, id)
		switch {
		case p == nil:
		case p.State == spec.StateCompleted || p.State == spec.StateFailed:
			return p, phase
		case phase == PhaseGang && p.State == spec.StateFormingGang:
			time.Sleep(time.Duration(h.rng.IntN(300)) * time.Millisecond)
			return h.progress(ctx, id), phase
		case phase == PhaseGang && p.State == spec.StateTraining:
			return p, PhaseEpoch // the gang formed before we could strike
		case phase != PhaseGang && p.State == spec.StateTraining && !h.gangAlive(p):
			// A host of the gang is down (struck by the last fault before
			// the gang formed without it knowing): the run has yet to
			// notice; strike once it has a gang of live hosts again.
		case phase == PhaseEpoch && p.State == spec.StateTraining && len(p.Gang) > 0:
			time.Sleep(time.Duration(200+h.rng.IntN(800)) * time.Millisecond)
			return h.progress(ctx, id), phase
		case phase == PhaseCheckpoint && p.State == spec.StateTraining && len(p.Gang) > 0:
			if h.waitCheckpointWrite(ctx, p.Run) {
				return h.progress(ctx, id), phase
			}
			return h.progress(ctx, id), PhaseEpoch
		}
		time.Sleep(20 * time.Millisecond)
	}
	return h.progress(ctx, id), phase
}

// waitCheckpointWrite polls the run's checkpoint directory for a checkpoint
// being written (objects there, no manifest yet).
func (h *Harness) waitCheckpointWrite(ctx context.Context, run string) bool {
	dir := filepath.Join(h.ckptDir, run)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), "ckpt-") {
				continue
			}
			if _, err := os.Stat(filepath.Join(dir, e.Name(), "MANIFEST.json")); errors.Is(err, os.ErrNotExist) {
				return true
			}
		}
		time.Sleep(time.Millisecond)
	}
	return false
}

// hostOf is the supervised process of the worker a rank runs on.
// gangAlive says whether every host of the run's gang is running.
func (h *Harness) gangAlive(p *spec.Progress) bool {
	for rank := range p.Gang {
		if w := h.hostOf(p, rank); w == nil || !w.alive() {
			return false
		}
	}
	return true
}

func (h *Harness) hostOf(p *spec.Progress, rank int) *proc {
	if p == nil || rank >= len(p.Gang) {
		return nil
	}
	for _, w := range h.hosts {
		if w.name == p.Gang[rank].Worker {
			return w
		}
	}
	return nil
}

// dataRoot is a storage root that holds a data set's URL: its directory.
func dataRoot(url string) string {
	if i := strings.LastIndex(strings.SplitN(url, "?", 2)[0], "/"); i > len("file://") {
		return url[:i+1]
	}
	return url
}
