package workflows

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	enumspb "go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

func training(mutate func(*spec.Training)) spec.Training {
	s := spec.Training{}
	if mutate != nil {
		mutate(&s)
	}
	return s.WithDefaults()
}

func TestGangBackoff(t *testing.T) {
	for _, c := range []struct {
		attempt     int
		gangTimeout time.Duration
		jitter      int64
		want        time.Duration
	}{
		{0, 2 * time.Minute, 0, 5 * time.Second},
		{1, 2 * time.Minute, 0, 10 * time.Second},
		{4, 2 * time.Minute, 0, 80 * time.Second},
		{5, 2 * time.Minute, 0, 2 * time.Minute},                       // capped
		{50, 2 * time.Minute, 0, 2 * time.Minute},                      // no overflow
		{0, time.Second, 0, time.Second},                               // a short gang timeout retries sooner
		{0, 100 * time.Millisecond, 0, time.Second},                    // but not below a second
		{0, 2 * time.Minute, int64(7 * time.Second), 7 * time.Second},  // 5s + 7s mod 5s
		{0, 2 * time.Minute, -int64(3 * time.Second), 8 * time.Second}, // jitter is never negative
	} {
		if got := gangBackoff(c.attempt, c.gangTimeout, c.jitter); got != c.want {
			t.Errorf("gangBackoff(%d, %v, %d) = %v; want %v", c.attempt, c.gangTimeout, c.jitter, got, c.want)
		}
	}
}

func TestCheckpointAfterAndRankBatch(t *testing.T) {
	every3 := training(func(s *spec.Training) {
		s.Checkpoint.EveryEpochs = 3
		s.Scaling.Workers = 4
		s.Hyper.Epochs = 10
	})
	for _, c := range []struct {
		epoch, world int
		want         bool
	}{
		{0, 4, false}, {2, 4, true}, {5, 4, true}, {6, 4, false},
		{9, 4, true}, // the last epoch
		{0, 3, true}, // a degraded gang checkpoints every epoch
	} {
		if got := checkpointAfter(every3, c.epoch, 10, c.world); got != c.want {
			t.Errorf("checkpointAfter(epoch %d, world %d) = %v; want %v", c.epoch, c.world, got, c.want)
		}
	}
	for _, c := range []struct{ world, want int }{{4, 128}, {3, 171}, {2, 256}, {1, 512}} {
		if got := rankBatch(every3, c.world); got != c.want {
			t.Errorf("rankBatch(world %d) = %d; want %d (global batch 512 kept)", c.world, got, c.want)
		}
	}
}

func TestContinueAsNew(t *testing.T) {
	for _, c := range []struct {
		name      string
		p         spec.Progress
		length    int
		signals   int
		suggested bool
		want      bool
	}{
		{"short history", spec.Progress{Epoch: 1, Epochs: 5}, 100, 10, false, false},
		{"long history", spec.Progress{Epoch: 1, Epochs: 5}, ContinueAsNewAfterEvents, 10, false, true},
		{"many signals", spec.Progress{Epoch: 1, Epochs: 5}, 100, ContinueAsNewAfterSignals, false, true},
		{"server suggests", spec.Progress{Epoch: 1, Epochs: 5}, 100, 10, true, true},
		{"last epoch done", spec.Progress{Epoch: 5, Epochs: 5}, ContinueAsNewAfterEvents, ContinueAsNewAfterSignals, true, false},
		{"stopping", spec.Progress{Epoch: 1, Epochs: 5, Stopping: true}, ContinueAsNewAfterEvents, 10, true, false},
	} {
		if got := continueAsNew(&c.p, c.length, c.signals, c.suggested); got != c.want {
			t.Errorf("%s: continueAsNew = %v; want %v", c.name, got, c.want)
		}
	}
}

var (
	errUser    = temporal.NewNonRetryableApplicationError("bad data", spec.ErrUser, nil)
	errInfra   = errors.New("connection reset")
	ref1       = &spec.CheckpointRef{ID: "e1", Epoch: 1}
	ref1s5     = &spec.CheckpointRef{ID: "e1s5", Epoch: 1, Step: 5}
	ref2       = &spec.CheckpointRef{ID: "e2", Epoch: 2}
	errPreempt = temporal.NewApplicationError("worker a is shutting down", spec.ErrPreempted, *ref1s5)
)

func TestCharge(t *testing.T) {
	limits := spec.Failure{MaxFailures: spec.Int(1), MaxPreemptions: spec.Int(1)}
	for _, c := range []struct {
		name                  string
		before                spec.Progress
		err                   error
		kind                  string // incident kind; "" for none
		fatal                 string // substring of the run-ending error; "" for none
		failures, preemptions int
	}{
		{"infrastructure within budget", spec.Progress{}, errInfra, spec.IncidentFailure, "", 1, 0},
		{"infrastructure over budget", spec.Progress{Failures: 1}, errInfra, spec.IncidentFailure, "2 failures exceed failure.max_failures 1", 2, 0},
		{"preemption within its own budget", spec.Progress{Failures: 1}, errPreempt, spec.IncidentPreemption, "", 1, 1},
		{"preemptions over budget", spec.Progress{Preemptions: 1}, errPreempt, spec.IncidentPreemption, "2 preemptions exceed failure.max_preemptions 1", 0, 2},
		{"user error ends the run uncounted", spec.Progress{}, errUser, "", "bad data", 0, 0},
		{"wrapped user error", spec.Progress{}, &rankError{what: "rank 1 on b", err: errUser}, "", "bad data", 0, 0},
		{"forged grant is not the run's failure", spec.Progress{Failures: 1}, &rankError{what: "rank 1 on b",
			err: temporal.NewNonRetryableApplicationError("rank 0's placement is not signed", spec.ErrForgedGrant, nil)}, spec.IncidentForgedGrant, "", 1, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := c.before
			inc, fatal := charge(&p, limits, 3, c.err)
			switch {
			case c.kind == "" && inc != nil, c.kind != "" && (inc == nil || inc.Kind != c.kind || inc.Epoch != 3):
				t.Errorf("incident %+v; want kind %q", inc, c.kind)
			case (c.fatal == "") != (fatal == nil) || fatal != nil && !strings.Contains(fatal.Error(), c.fatal):
				t.Errorf("fatal %v; want %q", fatal, c.fatal)
			case p.Failures != c.failures || p.Preemptions != c.preemptions:
				t.Errorf("failures %d preemptions %d; want %d %d", p.Failures, p.Preemptions, c.failures, c.preemptions)
			}
		})
	}
	var app *temporal.ApplicationError
	if !errors.As(runFailure(errUser), &app) || app.Type() != spec.ErrUser || !app.NonRetryable() {
		t.Errorf("runFailure(user error) = %v", runFailure(errUser))
	}
	if !errors.As(runFailure(errInfra), &app) || app.Type() != spec.ErrBudgetExhausted {
		t.Errorf("runFailure(budget) = %v", runFailure(errInfra))
	}
}

func TestMergeEpoch(t *testing.T) {
	ok := func(ref *spec.CheckpointRef) rankEnd {
		return rankEnd{where: "rank", result: spec.EpochResult{Metrics: spec.EpochMetrics{Epoch: 1}, Checkpoint: ref}}
	}
	failed := func(where string, err error) rankEnd { return rankEnd{where: where, err: err} }
	first := func(err error) error { return &rankError{what: "first", err: err} }
	for _, c := range []struct {
		name     string
		ranks    []rankEnd
		first    error
		leftWith []*spec.CheckpointRef
		counts   bool
		latest   *spec.CheckpointRef
		err      string // substring; "" for none
		kind     string
	}{
		{"every rank finished", []rankEnd{ok(ref2), ok(nil)}, nil, nil, true, ref2, "", ""},
		{"a rank failed before any checkpoint", []rankEnd{ok(nil), failed("rank 1 on b", errInfra)}, first(errInfra), nil, false, nil, "first: connection reset", kindInfrastructure},
		{"rank 0 committed, then rank 1 failed", []rankEnd{ok(ref2), failed("rank 1 on b", errInfra)}, first(errInfra), nil, true, ref2, "first", kindInfrastructure},
		{"a preemption explains the rest", []rankEnd{failed("rank 0 on a", errInfra), failed("rank 1 on b", errPreempt)}, first(errInfra), nil, false, ref1s5, "rank 1 on b: worker a is shutting down", spec.ErrPreempted},
		{"a user error explains everything", []rankEnd{failed("rank 0 on a", errPreempt), failed("rank 1 on b", errUser)}, first(errPreempt), nil, false, ref1s5, "rank 1 on b: bad data", spec.ErrUser},
		{"a slot's lease reported a checkpoint", []rankEnd{failed("rank 0 on a", errInfra)}, first(errInfra), []*spec.CheckpointRef{nil, ref1}, false, ref1, "first", kindInfrastructure},
		{"the newest checkpoint wins", []rankEnd{ok(ref1), failed("r", errPreempt)}, first(errPreempt), []*spec.CheckpointRef{ref2}, true, ref2, "first", spec.ErrPreempted},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := mergeEpoch(c.ranks, c.first, c.leftWith)
			if (out.result != nil) != c.counts {
				t.Errorf("epoch counts: %v; want %v", out.result != nil, c.counts)
			}
			if out.latest != c.latest && (out.latest == nil || c.latest == nil || out.latest.ID != c.latest.ID) {
				t.Errorf("latest %+v; want %+v", out.latest, c.latest)
			}
			if (c.err == "") != (out.err == nil) || out.err != nil && (!strings.Contains(out.err.Error(), c.err) || errorKind(out.err) != c.kind) {
				t.Errorf("err %v (%s); want %q (%s)", out.err, errorKind(out.err), c.err, c.kind)
			}
		})
	}
}

func TestNewer(t *testing.T) {
	for _, c := range []struct{ a, b, want *spec.CheckpointRef }{
		{nil, nil, nil}, {ref1, nil, ref1}, {nil, ref1, ref1}, {ref1, ref1s5, ref1s5}, {ref2, ref1s5, ref2},
	} {
		if got := newer(c.a, c.b); got != c.want {
			t.Errorf("newer(%v, %v) = %v; want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestSkippedIncidentOncePerGang(t *testing.T) {
	s := spec.SkippedCheckpoint{ID: "ckpt-e3", Reason: "hash mismatch"}
	inc := skippedIncident(nil, 2, 3, s)
	if inc == nil || inc.Kind != spec.IncidentCorruptCheckpoint || inc.Detail != "ckpt-e3: hash mismatch" {
		t.Fatalf("first report: %+v", inc)
	}
	if again := skippedIncident([]spec.Incident{*inc}, 2, 3, s); again != nil {
		t.Fatalf("the same gang's second report made %+v", again)
	}
	if next := skippedIncident([]spec.Incident{*inc}, 3, 3, s); next == nil {
		t.Fatal("a later gang's report was dropped")
	}
}

func TestRunNameAndDetails(t *testing.T) {
	for in, want := range map[string]string{"a/b": "a-b", "--x": "x", "///": "run", "ok.name_1": "ok.name_1", strings.Repeat("x", 300): strings.Repeat("x", 200)} {
		if got := legacyRunName(in); got != want {
			t.Errorf("legacyRunName(%q) = %q; want %q", in, got, want)
		}
	}
	// Run names are one to one: IDs that a character substitution or a cut
	// would merge keep names of their own, valid checkpoint run names.
	ids := []string{"a/b", "a-b", "a b", "a:b", "--x", "x", "///", "run", "ok.name_1", strings.Repeat("x", 300), strings.Repeat("x", 301), strings.Repeat("x", 200)}
	seen := map[string]string{}
	for _, id := range ids {
		n := runName(id)
		if other, dup := seen[n]; dup {
			t.Errorf("IDs %q and %q share the run name %q", other, id, n)
		}
		seen[n] = id
		if len(n) > 200 || unsafeRunChars.MatchString(n) || strings.IndexAny(n[:1], "._=+@-") == 0 {
			t.Errorf("runName(%q) = %q is not a checkpoint run name", id, n)
		}
	}
	if runName("ok.name_1") != "ok.name_1" {
		t.Error("an ID that is a run name as it stands was changed")
	}
	p := &spec.Progress{State: spec.StateTraining, Epoch: 2, Epochs: 5, Generation: 3, Failures: 1,
		Gang:    []spec.Placement{{Worker: "a"}, {Worker: "b"}},
		Metrics: []spec.EpochMetrics{{TestAccuracy: 0.81234, TrainLoss: 0.5, SamplesPerSecond: 1000}}}
	want := "**training** · epoch 2/5 · test accuracy 0.8123 · train loss 0.5000 · 1000 samples/s · gang 3 on a, b · 1 failures, 0 preemptions"
	if got := details(p); got != want {
		t.Errorf("details:\n got %s\nwant %s", got, want)
	}
	// An exec program's report: what it reported, no accuracy of 0; a
	// program that ends itself has no epoch count.
	ex := &spec.Progress{State: spec.StateTraining, Epoch: 3, Epochs: spec.MaxEpochs, Failures: 2, Preemptions: 1, Generation: 2,
		Gang:      []spec.Placement{{Worker: "h1"}, {Worker: "h2"}, {Worker: "h1"}},
		Incidents: []spec.Incident{{Kind: spec.IncidentPreemption}}, IncidentsDropped: 2,
		Metrics: []spec.EpochMetrics{{Epoch: 2, Other: map[string]float64{"loss": 0.25, "acc": 0.5, "a": 1, "b": 2, "z": 3, "epoch": 2},
			Absent: []string{spec.MetricTestAccuracy, spec.MetricTestLoss, spec.MetricTrainLoss}}}}
	if got, want := details(ex), "**training** · epoch 3 · a 1 · acc 0.5 · b 2 · loss 0.25 · 1 more metrics · gang 2 on h1 (2 ranks), h2 · 2 failures, 1 preemptions"; got != want {
		t.Errorf("details of an exec run:\n got %s\nwant %s", got, want)
	}
	m := memo(ex)
	if got, want := fmt.Sprint(m), "map[epoch:3 epochs:<nil> failures:2 incidents:3 metrics:map[a:1 acc:0.5 b:2 epoch:2 loss:0.25 z:3] preemptions:1]"; got != want {
		t.Errorf("memo of an exec run:\n got %s\nwant %s", got, want)
	}
	if m := memo(p); m["epochs"] != 5 || fmt.Sprint(m["metrics"]) != "map[test_accuracy:0.81234 test_loss:0 train_loss:0.5]" {
		t.Errorf("memo of a native run: %v", m)
	}
	p.State, p.Waiting = spec.StateFormingGang, `gang 4: 1 of 2 slots granted on task queue "gpu"; waiting until 12:00:00 (scaling.gang_timeout 1m0s)`
	if got := details(p); !strings.HasSuffix(got, "\n\n"+p.Waiting) {
		t.Errorf("details of a run waiting for slots:\n%s\nwant what it waits for", got)
	}
}

func TestStopCriterionAndBestTrial(t *testing.T) {
	m := spec.EpochMetrics{TestAccuracy: 0.9, TestLoss: 0.3, TrainLoss: 0.2}
	for _, c := range []struct {
		stop   map[string]float64
		epochs int
		want   string
	}{
		{nil, 3, ""},
		{map[string]float64{"training_iteration": 3}, 3, "stop.training_iteration: 3 reached 3"},
		{map[string]float64{"training_iteration": 4}, 3, ""},
		{map[string]float64{"test_accuracy": 0.85}, 1, "stop.test_accuracy: 0.9 reached 0.85"},
		{map[string]float64{"test_loss": 0.5}, 1, ""},
	} {
		if got := stopCriterion(c.stop, c.epochs, m); got != c.want {
			t.Errorf("stopCriterion(%v, %d) = %q; want %q", c.stop, c.epochs, got, c.want)
		}
	}
	v := func(f float64) *float64 { return &f }
	trials := []spec.TrialStatus{
		{Trial: 0, Last: v(0.8), Status: spec.TrialCompleted},
		{Trial: 1, Last: v(0.95), Status: spec.TrialFailed}, // a failed trial is never best
		{Trial: 2, Last: v(0.9), Status: spec.TrialEarlyStop},
		{Trial: 3, Status: spec.TrialPending},
	}
	if got := bestTrial(trials, spec.ModeMax); got != 2 {
		t.Errorf("best by max = %d; want 2", got)
	}
	if got := bestTrial(trials, spec.ModeMin); got != 0 {
		t.Errorf("best by min = %d; want 0", got)
	}
	if got := bestTrial(nil, spec.ModeMax); got != -1 {
		t.Errorf("best of none = %d; want -1", got)
	}
	// Under another scope the score ranks: trial 2's last value is the best,
	// trial 0's average is.
	scored := append([]spec.TrialStatus{}, trials...)
	scored[0].Score, scored[2].Score = v(0.85), v(0.7)
	if got := bestTrial(scored, spec.ModeMax); got != 0 {
		t.Errorf("best by score = %d; want 0", got)
	}
	if searchState(&spec.TuneResults{Trials: trials}) != spec.TuneFailedTrials || searchState(&spec.TuneResults{Trials: trials[2:]}) != spec.TuneCompleted ||
		searchState(&spec.TuneResults{Trials: trials[2:], Unlisted: map[string]int{spec.TrialFailed: 1}}) != spec.TuneFailedTrials {
		t.Error("searchState")
	}
	// A big search's best row may have moved out: BestTrial keeps it, and
	// a better row still listed takes its place.
	res := &spec.TuneResults{Mode: spec.ModeMax, Trials: []spec.TrialStatus{{Trial: 7, Last: v(0.5), Status: spec.TrialRunning}},
		BestTrial: &spec.TrialStatus{Trial: 3, Last: v(0.7), Status: spec.TrialCompleted}}
	bestTrialOf(res)
	if res.Best != 3 || res.BestTrial.Trial != 3 {
		t.Errorf("best %d (%+v); want the moved trial 3", res.Best, res.BestTrial)
	}
	res.Trials[0].Last = v(0.75)
	bestTrialOf(res)
	if res.Best != 7 || res.BestTrial.Trial != 7 {
		t.Errorf("best %d; want the listed trial 7 once it is better", res.Best)
	}
}

func TestAskAgainAfter(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"heartbeat timed out", temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_HEARTBEAT, nil), true},
		{"signal failed", errors.New("telling workflow w about slot 0: unavailable"), true},
		{"worker stopping", temporal.NewApplicationError("worker w is shutting down", spec.ErrPreempted), true},
		{"no slot", temporal.NewApplicationError("no 8 free slots", spec.ErrNoSlot), true},
		{"no worker took it in time", fmt.Errorf("activity error: %w", temporal.NewTimeoutError(enumspb.TIMEOUT_TYPE_SCHEDULE_TO_START, nil)), false},
		{"cancelled", temporal.NewCanceledError(), false},
		{"bad request", temporal.NewNonRetryableApplicationError("a hold of 99 slots", spec.ErrUser, nil), false},
		{"nil", nil, false},
	} {
		if got := askAgainAfter(c.err); got != c.want {
			t.Errorf("%s: askAgainAfter = %v; want %v", c.name, got, c.want)
		}
	}
}
