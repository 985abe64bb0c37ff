package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// fakeTrial stands in for TrainingWorkflow: its accuracy after epoch e is
// lr*10 + e/100 (so the trial with the highest lr is best), it reports every
// epoch to its search, and it honours the stop signal at an epoch boundary.
func fakeTrial(mu *sync.Mutex, running *int, maxRunning *int) func(ctx workflow.Context, in json.RawMessage) (*spec.Progress, error) {
	return func(ctx workflow.Context, in json.RawMessage) (*spec.Progress, error) {
		s, err := spec.Parse(in)
		if err != nil {
			return nil, err
		}
		s = s.WithDefaults()
		mu.Lock()
		*running++
		*maxRunning = max(*maxRunning, *running)
		mu.Unlock()
		fakeRunning.Store(s.Name, true)
		defer func() { mu.Lock(); *running--; mu.Unlock(); fakeRunning.Delete(s.Name) }()
		stop := workflow.GetSignalChannel(ctx, spec.SignalStop)
		info := workflow.GetInfo(ctx)
		p := &spec.Progress{Run: s.Name, Epochs: s.Hyper.Epochs, State: spec.StateCompleted}
		first := 0
		if at, ok := fakeResumeAt.Load(s.ResumeFrom); ok { // a PBT segment goes on from its clone's (or its own) epoch
			first = at.(int)
		}
		ahead := -1 // epochs still to train after a stop came
		for e := first; e < s.Hyper.Epochs; e++ {
			if ahead < 0 && stop.ReceiveAsync(nil) {
				ahead = fakeRunAhead
			}
			if ahead == 0 {
				p.State = spec.StateStopped
				break
			}
			if ahead > 0 {
				ahead--
			}
			if err := workflow.Sleep(ctx, time.Second); err != nil {
				p.State = spec.StateCancelled
				return p, err
			}
			m := spec.EpochMetrics{Epoch: e, TestAccuracy: s.Hyper.LR*10 + float64(e)/100, TestLoss: 1 - s.Hyper.LR,
				Other: map[string]float64{"neg_lr": -s.Hyper.LR}} // a metric of its own
			p.Metrics = append(p.Metrics, m)
			p.Epoch = e + 1
			p.Latest = &spec.CheckpointRef{Run: s.Name, ID: "ckpt", Epoch: e + 1}
			fakeResumeAt.Store(s.Name, e+1)
			workflow.SignalExternalWorkflow(ctx, info.ParentWorkflowExecution.ID, "", spec.SignalTrialReport,
				spec.TrialReport{WorkflowID: info.WorkflowExecution.ID, Metrics: m, Checkpoint: p.Latest}).Get(ctx, nil)
		}
		return p, nil
	}
}

// fakeResumeAt is the epoch each run's checkpoint resumes at (a clone's, or
// a trial's own latest); fakeRunning the run names of the trials training.
var fakeResumeAt, fakeRunning sync.Map

// fakeClones registers a CloneCheckpoint that copies nothing: its clone
// resumes at its source's epoch (fakeResumeAt). seen, if given, is told of
// each clone first, one at a time.
func fakeClones(env *testsuite.TestWorkflowEnvironment, seen func(spec.CloneCheckpointInput)) {
	var mu sync.Mutex
	env.RegisterActivityWithOptions(func(ctx context.Context, in spec.CloneCheckpointInput) (*spec.CloneCheckpointResult, error) {
		if seen != nil {
			mu.Lock()
			seen(in)
			mu.Unlock()
		}
		fakeResumeAt.Store(in.Run, in.From.Epoch)
		return &spec.CloneCheckpointResult{Source: in.From, Clone: spec.CheckpointRef{URL: in.URL, Run: in.Run, ID: in.From.ID, Epoch: in.From.Epoch}}, nil
	}, activity.RegisterOptions{Name: spec.ActivityCloneCheckpoint})
}

// fakeRunAhead is how many epochs a fakeTrial trains after its stop
// came: 0, or 1 as a Python rank does (it is into the next iteration
// when its report is decided on).
var fakeRunAhead int

// searchEnv is a test environment for TuneWorkflow whose trials are
// fakeTrial; written is set to the results the search writes, and
// maxRunning to the most trials that ran at once.
func searchEnv() (env *testsuite.TestWorkflowEnvironment, written **spec.TuneResults, maxRunning *int) {
	var suite testsuite.WorkflowTestSuite
	env = suite.NewTestWorkflowEnvironment()
	var mu sync.Mutex
	running := 0
	written, maxRunning = new(*spec.TuneResults), new(int)
	env.RegisterWorkflowWithOptions(TuneWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTune})
	env.RegisterWorkflowWithOptions(fakeTrial(&mu, &running, maxRunning), workflow.RegisterOptions{Name: spec.WorkflowTraining})
	env.RegisterActivityWithOptions(func(ctx context.Context, in spec.WriteTuneResultsInput) (string, error) {
		*written = in.Results
		return in.Name + "/results.csv in " + in.URL, nil
	}, activity.RegisterOptions{Name: spec.ActivityWriteTuneResults})
	return env, written, maxRunning
}

func TestTuneWithASHAStopsTheWorseTrialsAndKeepsTheBest(t *testing.T) {
	env, writtenTo, maxRunningOf := searchEnv()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "search-1"})
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{
		"train": {"hyper": {"epochs": 8}},
		"param_space": {"hyper.lr": {"grid_search": [0.006, 0.008, 0.001, 0.004, 0.002, 0.007, 0.003, 0.005]}},
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2,
		"scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2, "max_t": 8}}`))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res spec.TuneResults
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	written, maxRunning := *writtenTo, *maxRunningOf
	if len(res.Trials) != 8 || res.State != spec.TuneCompleted || written == nil {
		t.Fatalf("results %+v", res)
	}
	early := 0
	for _, tr := range res.Trials {
		t.Logf("trial %d %s epochs %d last %v: %s", tr.Trial, tr.Status, tr.Epochs, *tr.Last, tr.Reason)
		if tr.Status == spec.TrialEarlyStop {
			early++
		}
	}
	if early < 4 {
		t.Fatalf("%d of 8 trials stopped early; ASHA with reduction factor 2 should stop at least half", early)
	}
	if res.Best != 1 || res.Trials[1].Status != spec.TrialCompleted || res.Trials[1].Epochs != 8 {
		t.Fatalf("best trial %d; want 1 (the highest lr), run to its end", res.Best)
	}
	if maxRunning > 2 {
		t.Fatalf("%d trials ran at once; max_concurrent_trials is 2", maxRunning)
	}
}

func TestTuneRefusesABadSpecAtOnce(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(TuneWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTune})
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"param_space": {"hyper.learning_rate": {"choice": [0.1]}}}`))
	if err := env.GetWorkflowError(); err == nil || !strings.Contains(err.Error(), "learning_rate") {
		t.Fatalf("got %v, want an error naming hyper.learning_rate", err)
	}
}

// Cancelling a search cancels its running trials, waits until they have
// closed, starts no more, writes the results, and closes as cancelled.
func TestTuneCancelledClosesItsTrials(t *testing.T) {
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestWorkflowEnvironment()
	var mu sync.Mutex
	running, maxRunning := 0, 0
	env.RegisterWorkflowWithOptions(TuneWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTune})
	env.RegisterWorkflowWithOptions(fakeTrial(&mu, &running, &maxRunning), workflow.RegisterOptions{Name: spec.WorkflowTraining})
	var written *spec.TuneResults
	env.RegisterActivityWithOptions(func(ctx context.Context, in spec.WriteTuneResultsInput) (string, error) {
		written = in.Results
		return in.Name + "/results.csv in " + in.URL, nil
	}, activity.RegisterOptions{Name: spec.ActivityWriteTuneResults})
	env.RegisterDelayedCallback(env.CancelWorkflow, 2500*time.Millisecond)
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{
		"train": {"hyper": {"epochs": 8}},
		"param_space": {"hyper.lr": {"grid_search": [0.006, 0.008, 0.001, 0.004, 0.002, 0.007]}},
		"max_concurrent_trials": 2}`))
	var canceled *temporal.CanceledError
	if err := env.GetWorkflowError(); !errors.As(err, &canceled) {
		t.Fatalf("got %v; want the search cancelled", err)
	}
	if written == nil || written.State != spec.TuneCancelled {
		t.Fatalf("results written: %+v", written)
	}
	for _, tr := range written.Trials {
		if tr.Status != spec.TrialCancelled {
			t.Fatalf("trial %d is %s; want cancelled", tr.Trial, tr.Status)
		}
	}
	if written.Trials[0].Epochs != 2 || written.Trials[0].Checkpoint == nil {
		t.Fatalf("the first trial kept %d epochs and checkpoint %v; want its 2 epochs and their checkpoint", written.Trials[0].Epochs, written.Trials[0].Checkpoint)
	}
	if running != 0 {
		t.Fatalf("%d trials still running after the search closed", running)
	}
}

// A trial report that does not decode, sent by anyone who may signal the
// namespace, is dropped: the search does not wait for the next good report
// inside its selector, and here closes at once when cancelled before any
// trial has reported.
func TestTuneCorruptReportDoesNotWedgeTheSearch(t *testing.T) {
	env, writtenTo, _ := searchEnv()
	env.RegisterDelayedCallback(func() {
		env.SignalWorkflow(spec.SignalTrialReport, "not a report")
	}, 500*time.Millisecond)
	env.RegisterDelayedCallback(env.CancelWorkflow, 700*time.Millisecond)
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{
		"train": {"hyper": {"epochs": 8}},
		"param_space": {"hyper.lr": {"grid_search": [0.006, 0.008]}},
		"max_concurrent_trials": 2}`))
	var canceled *temporal.CanceledError
	if err := env.GetWorkflowError(); !errors.As(err, &canceled) {
		t.Fatalf("got %v; want the search cancelled", err)
	}
	if written := *writtenTo; written == nil || written.State != spec.TuneCancelled {
		t.Fatalf("results written: %+v", written)
	}
}

// TestTuneContinuesAsNewAndMovesRows: a search of more trials than it
// lists continues as new whenever the server suggests it (here at every
// chance: each execution drains the trials it started, then continues),
// moves its finished rows out in parts, and ends with every trial counted
// once, the best one found, and the parts handed to the CSV writer.
func TestTuneContinuesAsNewAndMovesRows(t *testing.T) {
	const n = spec.MaxListedTrials + 100
	parts := map[string][]spec.TrialStatus{}
	input := json.RawMessage(fmt.Sprintf(`{"train": {"hyper": {"epochs": 2}},
		"param_space": {"hyper.lr": {"uniform": [0.001, 0.01]}}, "num_samples": %d,
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 40}`, n))
	written, executions, maxRunning := runSearchExecutions(t, "big-search", input, 40, func(env *testsuite.TestWorkflowEnvironment, _ int) {
		env.RegisterActivityWithOptions(func(ctx context.Context, in spec.WriteTuneRowsInput) (string, error) {
			key := fmt.Sprintf("%s/trials/part-%05d.jsonl", in.Name, in.Part)
			parts[key] = in.Rows
			return key, nil
		}, activity.RegisterOptions{Name: spec.ActivityWriteTuneRows})
		env.SetContinueAsNewSuggested(true)
	})
	if executions < 10 || maxRunning > 40 {
		t.Fatalf("%d executions, %d trials at once; want at least 10 (a drain every 40 trials) and at most 40", executions, maxRunning)
	}
	seen := map[int]bool{}
	var best spec.TrialStatus
	for _, rows := range append([][]spec.TrialStatus{written.Trials}, mapValues(parts)...) {
		for _, r := range rows {
			if seen[r.Trial] || r.Status != spec.TrialCompleted || r.Epochs != 2 {
				t.Fatalf("trial %d: %s after %d epochs, seen before %v", r.Trial, r.Status, r.Epochs, seen[r.Trial])
			}
			seen[r.Trial] = true
			if best.Last == nil || *r.Last > *best.Last {
				best = r
			}
		}
	}
	if len(seen) != n || len(written.Parts) != len(parts) || len(written.Trials) > spec.MaxListedTrials {
		t.Fatalf("%d trials seen, %d parts (%d written), %d rows listed; want %d, all parts, at most %d", len(seen), len(written.Parts), len(parts), len(written.Trials), n, spec.MaxListedTrials)
	}
	if c := written.Counts(); c[spec.TrialCompleted] != n || written.State != spec.TuneCompleted {
		t.Fatalf("counts %v, state %s; want %d completed", c, written.State, n)
	}
	if written.Best != best.Trial || written.BestTrial == nil || written.BestTrial.Trial != best.Trial {
		t.Fatalf("best %d (%+v); want trial %d", written.Best, written.BestTrial, best.Trial)
	}
	t.Logf("%d trials over %d executions, %d parts, %d rows listed at the end; best trial %d", n, executions, len(parts), len(written.Trials), best.Trial)
}

func mapValues[K comparable, V any](m map[K]V) []V {
	var out []V
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// TestTuneRanksByItsScope: a search's scope reaches its rows: each trial's
// score is the mean of every epoch's value under "avg", and the results say
// which scope ranked them.
func TestTuneRanksByItsScope(t *testing.T) {
	env, _, _ := searchEnv()
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "search-scope"})
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{
		"train": {"hyper": {"epochs": 4}},
		"param_space": {"hyper.lr": {"grid_search": [0.002, 0.006]}},
		"metric": "test_accuracy", "mode": "max", "scope": "avg"}`))
	var res spec.TuneResults
	if err := env.GetWorkflowResult(&res); err != nil {
		t.Fatal(err)
	}
	if res.Scope != spec.ScopeAvg || len(res.Trials) != 2 || res.Best < 0 {
		t.Fatalf("results %+v; want 2 trials ranked by avg", res)
	}
	for _, tr := range res.Trials {
		if tr.Score == nil || tr.Mean == nil || *tr.Score != *tr.Mean || tr.Values != tr.Epochs || tr.Epochs != 4 {
			t.Fatalf("trial %d: score %v, mean %v, %d values over %d epochs; want the mean of 4 epochs' values as its score", tr.Trial, tr.Score, tr.Mean, tr.Values, tr.Epochs)
		}
	}
}

// runSearchExecutions runs a search to its end over as many executions
// as it continues as new (at most limit), its trials fakeTrial's; setup
// prepares each execution's environment (more activities, the server's
// suggestion). It returns the results written, the executions, and the
// most trials that ran at once.
func runSearchExecutions(t *testing.T, id string, input json.RawMessage, limit int, setup func(env *testsuite.TestWorkflowEnvironment, execution int)) (*spec.TuneResults, int, int) {
	t.Helper()
	var mu sync.Mutex
	running, maxRunning := 0, 0
	var written *spec.TuneResults
	executions := 0
	for ; written == nil && executions < limit; executions++ {
		var suite testsuite.WorkflowTestSuite
		env := suite.NewTestWorkflowEnvironment()
		env.SetTestTimeout(time.Minute)
		env.RegisterWorkflowWithOptions(TuneWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTune})
		env.RegisterWorkflowWithOptions(fakeTrial(&mu, &running, &maxRunning), workflow.RegisterOptions{Name: spec.WorkflowTraining})
		env.RegisterActivityWithOptions(func(ctx context.Context, in spec.WriteTuneResultsInput) (string, error) {
			written = in.Results
			return "results.csv", nil
		}, activity.RegisterOptions{Name: spec.ActivityWriteTuneResults})
		env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: id})
		if executions > 0 {
			env.SetContinuedExecutionRunID(fmt.Sprintf("run-%d", executions-1))
		}
		if setup != nil {
			setup(env, executions)
		}
		env.ExecuteWorkflow(spec.WorkflowTune, input)
		err := env.GetWorkflowError()
		var can *workflow.ContinueAsNewError
		switch {
		case errors.As(err, &can):
			if err := converterDecode(can, &input); err != nil {
				t.Fatal(err)
			}
			if len(input) > 1<<20 {
				t.Fatalf("execution %d carries %d bytes", executions, len(input))
			}
		case err != nil:
			t.Fatal(err)
		}
	}
	if written == nil {
		t.Fatalf("the search did not end in %d executions", executions)
	}
	return written, executions, maxRunning
}

// suggestCAN has the server suggest continue-as-new in every execution.
func suggestCAN(env *testsuite.TestWorkflowEnvironment, _ int) { env.SetContinueAsNewSuggested(true) }

// TestTuneWithTPE: a TPE search chooses each trial's config as it starts,
// from the trials that ended: after its random startup trials it moves to
// the learning rates that scored best (fakeTrial's accuracy grows with lr),
// and, one trial at a time, a search that continues as new after every
// trial chooses exactly the configs of one that never did.
func TestTuneWithTPE(t *testing.T) {
	input := json.RawMessage(`{"train": {"hyper": {"epochs": 2}},
		"param_space": {"hyper.lr": {"uniform": [0.001, 0.5]}, "hyper.optimizer": {"choice": ["adam", "sgd"]}}, "num_samples": 24,
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2, "seed": 4,
		"search_alg": {"type": "tpe", "n_startup_trials": 6}}`)
	once, executions, _ := runSearchExecutions(t, "tpe-search", input, 100, nil)
	if executions != 1 {
		t.Fatalf("%d executions without a suggestion to continue as new", executions)
	}
	lr := func(r spec.TrialStatus) float64 {
		var v float64
		json.Unmarshal(r.Config["hyper.lr"], &v)
		return v
	}
	var startup, modelled float64
	for _, r := range once.Trials {
		if r.Status != spec.TrialCompleted || r.Config == nil {
			t.Fatalf("trial %d: %s, config %v", r.Trial, r.Status, r.Config)
		}
		if r.Trial < 6 {
			startup += lr(r) / 6
		} else if r.Trial >= 12 {
			modelled += lr(r) / 12
		}
	}
	t.Logf("mean lr: random startup trials %.3f, trials 12-23 %.3f; best trial %d", startup, modelled, once.Best)
	if !(modelled > 0.35 && modelled > startup) {
		t.Fatalf("TPE's later trials have a mean lr of %.3f (the startup's %.3f); want them near the top of [0.001, 0.5]", modelled, startup)
	}
	// One trial at a time, a drain changes no trial's observations.
	input = json.RawMessage(strings.Replace(string(input), `"max_concurrent_trials": 2`, `"max_concurrent_trials": 1`, 1))
	once, _, _ = runSearchExecutions(t, "tpe-search", input, 100, nil)
	split, executions, _ := runSearchExecutions(t, "tpe-search", input, 100, suggestCAN)
	if executions < 10 {
		t.Fatalf("%d executions; want a drain every few trials", executions)
	}
	for i, r := range split.Trials {
		if a, b := spec.Config(r.Config).JSON(), spec.Config(once.Trials[i].Config).JSON(); a != b {
			t.Fatalf("trial %d: %s across %d executions, %s in one", r.Trial, a, executions, b)
		}
	}
}

func TestTuneWithTPERefusesAGrid(t *testing.T) {
	env, _, _ := searchEnv()
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"param_space": {"hyper.lr": {"grid_search": [0.1, 0.01]}}, "search_alg": {"type": "tpe"}}`))
	err := env.GetWorkflowError()
	if err == nil || !strings.Contains(err.Error(), `param_space.hyper.lr is a grid_search; search_alg "tpe" models every dimension`) {
		t.Fatalf("got %v", err)
	}
}

// TestTuneWithPBT: 8 trials at once, PBT every 2 epochs. The weakest
// quarter stop, clone a checkpoint of the top quarter (the CloneCheckpoint
// activity is given the donor's latest checkpoint) and go on as a new
// segment of the same trial from the clone, with the donor's config
// perturbed; the lineage says which trial each took, and the population
// ends with higher learning rates (fakeTrial's accuracy grows with lr) than
// it began with.
func TestTuneWithPBT(t *testing.T) {
	env, writtenTo, _ := searchEnv()
	var mu sync.Mutex
	var clones []spec.CloneCheckpointInput
	fakeClones(env, func(in spec.CloneCheckpointInput) { clones = append(clones, in) })
	started := map[string]spec.Training{}
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, args converter.EncodedValues) {
		var in json.RawMessage
		args.Get(&in)
		s, _ := spec.Parse(in)
		mu.Lock()
		started[info.WorkflowExecution.ID] = s
		mu.Unlock()
	})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "pbt-1"})
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"name": "pbt-1",
		"train": {"hyper": {"epochs": 10}},
		"param_space": {"hyper.lr": {"uniform": [0.001, 0.05]}}, "num_samples": 8, "seed": 7,
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 8,
		"scheduler": {"type": "pbt", "perturbation_interval": 2}}`))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res spec.TuneResults
	env.GetWorkflowResult(&res)
	lrOf := func(cfg map[string]json.RawMessage) float64 {
		var v float64
		json.Unmarshal(cfg["hyper.lr"], &v)
		return v
	}
	var before, after float64
	exploited := 0
	for _, r := range res.Trials {
		first := started[r.WorkflowID]
		before += first.Hyper.LR / 8
		after += lrOf(r.Config) / 8
		if r.Status != spec.TrialCompleted || r.Epochs != 10 {
			t.Fatalf("trial %d: %s after %d epochs", r.Trial, r.Status, r.Epochs)
		}
		if r.Segment != len(r.Lineage) {
			t.Fatalf("trial %d: %d segments, lineage %+v", r.Trial, r.Segment, r.Lineage)
		}
		for k, e := range r.Lineage {
			exploited++
			seg := started[fmt.Sprintf("%s-p%d", r.WorkflowID, k+1)]
			if seg.ResumeFrom == "" || seg.Name != fmt.Sprintf("pbt-1-trial-%03d-p%d", r.Trial, k+1) {
				t.Fatalf("trial %d segment %d started as %+v", r.Trial, k+1, seg)
			}
			if e.From == r.Trial || !strings.HasSuffix(e.Cloned, "/ckpt") || e.Epoch%2 != 0 {
				t.Fatalf("trial %d exploit %+v", r.Trial, e)
			}
			t.Logf("trial %d at epoch %d took trial %d's %s, changed %s", r.Trial, e.Epoch, e.From, e.Cloned, spec.Config(e.Changed).JSON())
		}
	}
	if exploited == 0 || len(clones) != exploited {
		t.Fatalf("%d exploits, %d clones", exploited, len(clones))
	}
	for _, c := range clones {
		if c.From.Run == "" || c.From.Epoch < 1 || !strings.Contains(c.Run, "-clone") {
			t.Fatalf("clone input %+v", c)
		}
	}
	t.Logf("mean lr: %.4f at the start, %.4f at the end; %d exploits; best trial %d", before, after, exploited, res.Best)
	if !(after > before) {
		t.Fatalf("PBT did not move the population to better learning rates: %.4f -> %.4f", before, after)
	}
	if w := *writtenTo; w == nil || w.Scheduler != "pbt" {
		t.Fatalf("results written: %+v", w)
	}
}

// TestTunePBTTimeSharesItsSlots: a population of 8 on 2 slots moves
// together, as Ray's PBT runs one: a trial at a perturbation point gives its
// slot to the trial that has trained least (every trial starts before any
// trains past the first interval), pauses keep their epochs, and an
// exploit's clone is made as it is decided, while the trial is still
// stopping, so the donor cannot prune the checkpoint chosen (it did: a
// clone then took the donor's last checkpoint, and the trial trained no more).
func TestTunePBTTimeSharesItsSlots(t *testing.T) {
	env, _, maxRunningOf := searchEnv()
	var clones []spec.CloneCheckpointInput
	var clonedWhileStopping []bool
	fakeClones(env, func(in spec.CloneCheckpointInput) {
		trial := in.Run[:strings.LastIndex(in.Run, "-p")]
		stopping := false
		fakeRunning.Range(func(k, _ any) bool {
			stopping = stopping || strings.HasPrefix(k.(string), trial)
			return !stopping
		})
		clones, clonedWhileStopping = append(clones, in), append(clonedWhileStopping, stopping)
	})
	type start struct {
		id    string
		epoch int
	}
	var starts []start
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, args converter.EncodedValues) {
		var in json.RawMessage
		args.Get(&in)
		s, _ := spec.Parse(in)
		at, _ := fakeResumeAt.Load(s.ResumeFrom)
		e, _ := at.(int)
		starts = append(starts, start{info.WorkflowExecution.ID, e})
	})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "pbt-ts"})
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"name": "pbt-ts",
		"train": {"hyper": {"epochs": 10}},
		"param_space": {"hyper.lr": {"uniform": [0.001, 0.05]}}, "num_samples": 8, "seed": 7,
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2,
		"scheduler": {"type": "pbt", "perturbation_interval": 2}}`))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res spec.TuneResults
	env.GetWorkflowResult(&res)
	if *maxRunningOf > 2 {
		t.Fatalf("%d trials ran at once on 2 slots", *maxRunningOf)
	}
	exploits := 0
	for _, r := range res.Trials {
		if r.Status != spec.TrialCompleted || r.Epochs != 10 || r.Segment < len(r.Lineage) {
			t.Fatalf("trial %d: %s after %d epochs, %d segments, lineage %+v", r.Trial, r.Status, r.Epochs, r.Segment, r.Lineage)
		}
		exploits += len(r.Lineage)
	}
	firsts, resumes := 0, 0
	for _, s := range starts {
		if !strings.Contains(s.id, "-p") {
			firsts++
		} else {
			resumes++
			if firsts < 8 && s.epoch > 2 {
				t.Fatalf("a segment resumed at epoch %d before every trial had started: %v", s.epoch, starts)
			}
		}
	}
	t.Logf("%d starts (%d segments), %d exploits: %v", len(starts), resumes, exploits, starts)
	if firsts != 8 || resumes < 8*3 {
		t.Fatalf("%d trials started and %d segments; want 8, each paused at least at epochs 2, 4 and 6", firsts, resumes)
	}
	if exploits == 0 || len(clones) != exploits {
		t.Fatalf("%d exploits, %d clones", exploits, len(clones))
	}
	for k, c := range clones {
		if !clonedWhileStopping[k] || c.Before != 10 {
			t.Fatalf("clone %+v: made while its trial was still stopping: %v; want true, and before its 10 epochs", c, clonedWhileStopping[k])
		}
	}
}

// TestTimeSharedPBTEndsAtTheStopCriterionNotTheRunsEpochs: a function
// trainer's run has many epochs (its program ends where it will) and
// trains one more after each stop, as a Python rank does. With a
// stop.training_iteration the search knows where its trials end: no clone
// is of a donor's checkpoint there (it would leave its trial nothing to
// train), and a trial paused as it reached it ends instead of being
// started again to find that out (CI, 2026-12-07).
func TestTimeSharedPBTEndsAtTheStopCriterionNotTheRunsEpochs(t *testing.T) {
	fakeRunAhead = 1
	defer func() { fakeRunAhead = 0 }()
	env, _, _ := searchEnv()
	var clones []spec.CloneCheckpointInput
	fakeClones(env, func(in spec.CloneCheckpointInput) { clones = append(clones, in) })
	var resumedAt []int
	env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, args converter.EncodedValues) {
		var in json.RawMessage
		args.Get(&in)
		s, _ := spec.Parse(in)
		if at, ok := fakeResumeAt.Load(s.ResumeFrom); ok && s.ResumeFrom != "" {
			resumedAt = append(resumedAt, at.(int))
		}
	})
	env.SetStartWorkflowOptions(client.StartWorkflowOptions{ID: "pbt-stop"})
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"name": "pbt-stop",
		"train": {"hyper": {"epochs": 1000}}, "stop": {"training_iteration": 6},
		"param_space": {"hyper.lr": {"uniform": [0.001, 0.05]}}, "num_samples": 4, "seed": 3,
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 2,
		"scheduler": {"type": "pbt", "perturbation_interval": 1}}`))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res spec.TuneResults
	env.GetWorkflowResult(&res)
	for _, r := range res.Trials {
		if r.Status != spec.TrialStopped || r.Epochs < 6 || r.Epochs > 8 { // the stop, and the trial's stop signal, each an epoch late at most
			t.Fatalf("trial %d: %s (%s) after %d epochs; want stopped by stop.training_iteration at 6 to 8; lineage %+v, resumed at %v", r.Trial, r.Status, r.Reason, r.Epochs, r.Lineage, resumedAt)
		}
	}
	if len(clones) == 0 {
		t.Fatal("no exploit in 4 trials of 6 iterations perturbed every one")
	}
	for _, c := range clones {
		if c.From.Epoch >= 6 || c.Before != 6 {
			t.Fatalf("clone %+v: of epoch %d, before %d; want below 6, the stop criterion", c, c.From.Epoch, c.Before)
		}
	}
	for _, at := range resumedAt {
		if at >= 6 {
			t.Fatalf("a segment started at epoch %d, past its stop criterion: %v", at, resumedAt)
		}
	}
	t.Logf("%d clones, segments resumed at %v", len(clones), resumedAt)
}

// TestTunePBTCarriesItsSegmentsAcrossContinueAsNew: the server suggests
// continue-as-new while trials are exploiting. The search stops deciding,
// clones what it was cloning, lets the other trials finish, and carries the
// cloned segments: the next execution starts them first, and every trial
// still trains all its epochs.
func TestTunePBTCarriesItsSegmentsAcrossContinueAsNew(t *testing.T) {
	input := json.RawMessage(`{"name": "pbt-can", "train": {"hyper": {"epochs": 10}},
		"param_space": {"hyper.lr": {"uniform": [0.001, 0.05]}}, "num_samples": 8, "seed": 7,
		"metric": "test_accuracy", "mode": "max", "max_concurrent_trials": 8,
		"scheduler": {"type": "pbt", "perturbation_interval": 2}}`)
	segmentsStarted := map[int][]string{} // execution -> segment workflow IDs started
	written, executions, _ := runSearchExecutions(t, "pbt-can", input, 5, func(env *testsuite.TestWorkflowEnvironment, execution int) {
		fakeClones(env, nil)
		env.SetOnChildWorkflowStartedListener(func(info *workflow.Info, _ workflow.Context, _ converter.EncodedValues) {
			if strings.Contains(info.WorkflowExecution.ID, "-p") {
				segmentsStarted[execution] = append(segmentsStarted[execution], info.WorkflowExecution.ID)
			}
		})
		if execution == 0 {
			// Just after the first exploits were decided (epoch 2), before their clones finish.
			env.RegisterDelayedCallback(func() { env.SetContinueAsNewSuggested(true) }, 2500*time.Millisecond)
		}
	})
	if written == nil || executions != 2 {
		t.Fatalf("%d executions, results %v; want 2", executions, written != nil)
	}
	carried := 0
	for _, r := range written.Trials {
		if r.Status != spec.TrialCompleted || r.Epochs != 10 || r.Segment != len(r.Lineage) {
			t.Fatalf("trial %d: %s after %d epochs, %d segments, lineage %+v", r.Trial, r.Status, r.Epochs, r.Segment, r.Lineage)
		}
		carried += r.Segment
	}
	t.Logf("segments started: %v", segmentsStarted)
	if carried == 0 || len(segmentsStarted[1]) != carried || len(segmentsStarted[0]) != 0 {
		t.Fatalf("%d segments; started in the first execution %v, in the second %v: want every one carried to the second", carried, segmentsStarted[0], segmentsStarted[1])
	}
}

// A search ranks by any metric its trials report, and stops on one; a
// metric no trial reports fails the search at the first report, naming it
// and what was reported.
func TestTuneByAnyMetric(t *testing.T) {
	env, writtenTo, _ := searchEnv()
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"train": {"hyper": {"epochs": 3}},
		"param_space": {"hyper.lr": {"grid_search": [0.003, 0.001, 0.002]}}, "max_concurrent_trials": 3,
		"metric": "neg_lr", "mode": "max", "stop": {"neg_lr": -0.0015}}`))
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	var res spec.TuneResults
	env.GetWorkflowResult(&res)
	if res.Best != 1 || res.Trials[1].Status != spec.TrialStopped || res.Trials[1].Metrics["neg_lr"] != -0.001 {
		t.Fatalf("best %d; trial 1 %+v", res.Best, res.Trials[1])
	}
	if w := *writtenTo; w == nil || w.Trials[0].Metrics["test_accuracy"] == 0 {
		t.Fatalf("rows written without their metrics: %+v", w)
	}
	env, _, _ = searchEnv()
	env.ExecuteWorkflow(spec.WorkflowTune, json.RawMessage(`{"train": {"hyper": {"epochs": 3}},
		"param_space": {"hyper.lr": {"grid_search": [0.003, 0.001]}}, "max_concurrent_trials": 2, "metric": "f1"}`))
	err := env.GetWorkflowError()
	if err == nil || !strings.Contains(err.Error(), `the search's metric is "f1", but the run's epoch 0 reported only neg_lr, test_accuracy, test_loss, train_loss`) {
		t.Fatalf("a metric never reported: %v", err)
	}
}
