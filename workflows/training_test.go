package workflows

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/mock"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/workflow"

	"github.com/durabletrain/durabletrain/spec"
)

// harness runs TrainingWorkflow on the SDK's test environment with fake GPU
// agents: HoldSlot blocks until released, and grants arrive as signals.
type harness struct {
	t     *testing.T
	env   *testsuite.TestWorkflowEnvironment
	mu    sync.Mutex
	runs  []spec.EpochInput    // RunEpoch calls, in order
	holds []spec.HoldSlotInput // HoldSlot calls, in order
	// epoch decides each RunEpoch call's outcome; nil means success.
	epoch func(in spec.EpochInput) error
	// hold is what a HoldSlot does; nil holds the slot until released.
	hold func(ctx context.Context, in spec.HoldSlotInput) error
	// noSlot: the HoldSlot calls refused at once for want of free slots.
	noSlot func(in spec.HoldSlotInput, asked int) bool
	// earlierRelease: the fake agent granting this hold is of a release
	// before the small all-reduce (its placement does not say SmallAllReduce).
	earlierRelease func(in spec.HoldSlotInput) bool
	// lost: the HoldSlot calls that end with this error before their grant.
	lost func(in spec.HoldSlotInput, asked int) error
	// restoredEpoch: the epoch a rank's state is at (default: the one asked for).
	restoredEpoch func(in spec.EpochInput) int
	// restoreReport: what a rank's epoch result says it restored (default: nothing).
	restoreReport func(in spec.EpochInput) *spec.RestoreReport
	// finished: the RunEpoch calls whose program says its training ended before the epoch.
	finished func(in spec.EpochInput, epoch int) bool
	// grants[g]: how many of generation g's slots the fake agents grant (default: none).
	grants map[int]int
	// counted: the counters the workflow recorded, by name.
	counted *countingMetrics
	saves   int
	// blockEpoch: the RunEpoch calls that block until cancelled.
	blockEpoch func(in spec.EpochInput) bool
	// blockSave: SaveCheckpoint blocks until cancelled.
	blockSave bool
	// releases are the ReleaseHold calls, in order, with the queue each was sent to.
	releases []release
	// releaseDelay, if set, is how long a ReleaseHold takes before it is recorded.
	releaseDelay func(spec.ReleaseHoldInput) time.Duration
	// swallowed: the HoldSlot calls a stopped worker's open poll took: they
	// neither grant nor end (swallowedIDs: their activity IDs).
	swallowed    func(in spec.HoldSlotInput) bool
	swallowedIDs []string
	// queued: the HoldSlot calls that count as still waiting in the task
	// queue when the run asks which of its holds started (startedHolds,
	// whose calls startedReads counts); every other call has started.
	queued       func(in spec.HoldSlotInput) bool
	started      []string
	startedReads int
}

type release struct {
	queue string
	in    spec.ReleaseHoldInput
}

// newHarness registers the fake activities, and those of more (which the
// mocks must follow).
func newHarness(t *testing.T, more ...func(*harness)) *harness {
	var suite testsuite.WorkflowTestSuite
	counted := &countingMetrics{counts: map[string]int64{}}
	suite.SetMetricsHandler(counted)
	h := &harness{t: t, env: suite.NewTestWorkflowEnvironment(), grants: map[int]int{}, counted: counted}
	h.env.SetTestTimeout(20 * time.Second)
	h.env.RegisterWorkflowWithOptions(TrainingWorkflow, workflow.RegisterOptions{Name: spec.WorkflowTraining})
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in spec.HoldSlotInput) error {
		h.mu.Lock()
		grant := h.grants[in.Generation]
		asked := 0
		for _, x := range h.holds {
			if x.Generation == in.Generation && x.Request == in.Request {
				asked++
			}
		}
		h.holds = append(h.holds, in)
		if h.queued == nil || !h.queued(in) {
			h.started = append(h.started, activity.GetInfo(ctx).ActivityID)
		}
		h.mu.Unlock()
		if h.swallowed != nil && h.swallowed(in) {
			h.mu.Lock()
			h.swallowedIDs = append(h.swallowedIDs, activity.GetInfo(ctx).ActivityID)
			h.mu.Unlock()
			<-ctx.Done()
			return ctx.Err()
		}
		if h.noSlot != nil && h.noSlot(in, asked) {
			return temporal.NewApplicationError("no free slots on host-x", spec.ErrNoSlot)
		}
		if h.lost != nil {
			if err := h.lost(in, asked); err != nil {
				return err
			}
		}
		if in.Request < grant { // this fake agent has a slot for it: tell the workflow where
			pl := spec.Placement{
				Worker: fmt.Sprintf("host-%d", (in.Request+in.Generation)%3), HostQueue: fmt.Sprintf("q-%d-%d", in.Generation, in.Request),
				Collective: fmt.Sprintf("10.0.%d.%d:7070", in.Request/256, in.Request%256), PublicKey: fakePublicKey(in.Generation, in.Request),
				SmallAllReduce: h.earlierRelease == nil || !h.earlierRelease(in)}
			pl.GatherLinks = pl.SmallAllReduce
			for i := range in.Slots {
				pl.Slots = append(pl.Slots, i)
			}
			h.env.SignalWorkflow(spec.SignalSlotGranted, spec.SlotGranted{Generation: in.Generation, Request: in.Request, Attempt: in.Attempt, Placement: pl, RunID: in.RunID})
		}
		if h.hold != nil {
			return h.hold(ctx, in)
		}
		<-ctx.Done()
		return ctx.Err()
	}, activity.RegisterOptions{Name: spec.ActivityHoldSlot})
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in spec.EpochInput) (spec.EpochResult, error) {
		h.mu.Lock()
		h.runs = append(h.runs, in)
		h.mu.Unlock()
		if h.blockEpoch != nil && h.blockEpoch(in) {
			<-ctx.Done()
			return spec.EpochResult{}, ctx.Err()
		}
		if h.epoch != nil {
			if err := h.epoch(in); err != nil {
				return spec.EpochResult{}, err
			}
		}
		epoch := in.Epoch
		if h.restoredEpoch != nil {
			epoch = h.restoredEpoch(in)
		}
		if h.finished != nil && h.finished(in, epoch) {
			return spec.EpochResult{Rank: in.Rank, Finished: true, Metrics: spec.EpochMetrics{Epoch: epoch}}, nil
		}
		res := spec.EpochResult{Rank: in.Rank, Metrics: spec.EpochMetrics{Epoch: epoch, Steps: 10, TestAccuracy: 0.5 + 0.01*float64(epoch)}}
		if h.restoreReport != nil {
			res.Restored = h.restoreReport(in)
		}
		if in.Rank == 0 && (in.Checkpoint || (epoch+1)%in.Spec.Checkpoint.EveryEpochs == 0) {
			res.Checkpoint = &spec.CheckpointRef{URL: in.Spec.Checkpoint.URL, Run: in.Run, ID: fmt.Sprintf("ckpt-e%06d", epoch+1), Epoch: epoch + 1}
		}
		return res, nil
	}, activity.RegisterOptions{Name: spec.ActivityRunEpoch})
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in spec.SaveCheckpointInput) (spec.CheckpointRef, error) {
		h.mu.Lock()
		h.saves++
		h.mu.Unlock()
		if h.blockSave {
			<-ctx.Done()
			return spec.CheckpointRef{}, ctx.Err()
		}
		return spec.CheckpointRef{Run: in.Run, ID: "ckpt-on-stop"}, nil
	}, activity.RegisterOptions{Name: spec.ActivitySaveCheckpoint})
	h.env.RegisterActivityWithOptions(func(ctx context.Context, in spec.ReleaseHoldInput) error {
		if h.releaseDelay != nil {
			time.Sleep(h.releaseDelay(in))
		}
		h.mu.Lock()
		h.releases = append(h.releases, release{activity.GetInfo(ctx).TaskQueue, in})
		h.mu.Unlock()
		return nil
	}, activity.RegisterOptions{Name: spec.ActivityReleaseHold})
	for _, register := range more {
		register(h)
	}
	h.env.OnActivity(startedHolds, mock.Anything).Return(func(context.Context) ([]string, error) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.startedReads++
		return slices.Clone(h.started), nil
	})
	return h
}

// released reports whether the hold was let go of (ReleaseHold ran).
func (h *harness) released(id holdID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.releases {
		if (holdID{r.in.Generation, r.in.Request}) == id {
			return true
		}
	}
	return false
}

// inputs is a copy of the RunEpoch inputs so far (cancelled fakes may still be finishing).
// inputs are the RunEpoch calls' inputs, one per rank as the agent
// expands a host's (spec.EpochInput.RankInputs).
func (h *harness) inputs() []spec.EpochInput {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ranks []spec.EpochInput
	for _, in := range h.runs {
		ins, _, err := in.RankInputs()
		if err != nil {
			h.t.Fatalf("epoch input %+v does not expand: %v", in, err)
		}
		ranks = append(ranks, ins...)
	}
	return ranks
}

// grant makes the fake agents grant `slots` of generation gen's slot requests.
func (h *harness) grant(gen, slots int, _ time.Duration) {
	h.mu.Lock()
	h.grants[gen] = slots
	h.mu.Unlock()
}

// query is the run's progress as its query answers it.
func (h *harness) query() *spec.Progress {
	v, err := h.env.QueryWorkflow(spec.QueryProgress)
	if err != nil {
		h.t.Fatal(err)
	}
	var p *spec.Progress
	if err := v.Get(&p); err != nil {
		h.t.Fatal(err)
	}
	return p
}

func (h *harness) start(specJSON string) (*spec.Progress, error) {
	h.env.ExecuteWorkflow(spec.WorkflowTraining, json.RawMessage(specJSON))
	if !h.env.IsWorkflowCompleted() {
		h.t.Fatal("the workflow did not complete")
	}
	var p *spec.Progress
	err := h.env.GetWorkflowResult(&p)
	return p, err
}

func TestHappyPath(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, time.Second)
	p, err := h.start(`{"name": "demo", "hyper": {"epochs": 3}, "scaling": {"workers": 2}, "checkpoint": {"every_epochs": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Epoch != 3 || len(p.Metrics) != 3 || p.Generation != 1 || p.Failures != 0 {
		t.Fatalf("progress %+v", p)
	}
	if len(h.inputs()) != 6 {
		t.Fatalf("%d RunEpoch calls, want 6", len(h.inputs()))
	}
	for _, in := range h.inputs() {
		if in.Run != "demo" || len(in.Peers) != 2 || in.Generation != 1 {
			t.Fatalf("epoch input %+v", in)
		}
		// No secret in history: each rank is told its peers' public keys.
		if in.Secret != nil || len(in.PublicKeys) != 2 || !bytes.Equal(in.PublicKeys[1], fakePublicKey(1, 1)) {
			t.Fatalf("epoch input's keys: secret %x, public keys %x", in.Secret, in.PublicKeys)
		}
		// every_epochs 2: checkpoints after epoch 1 (the 2nd) and after the last.
		if want := in.Epoch == 1 || in.Epoch == 2; in.Checkpoint != want {
			t.Fatalf("epoch %d checkpoint=%v", in.Epoch, in.Checkpoint)
		}
		if in.Peers[in.Rank] != fmt.Sprintf("10.0.0.%d:7070", in.Rank) {
			t.Fatalf("rank %d sent to peers %v", in.Rank, in.Peers)
		}
	}
	if p.Latest == nil || p.Latest.Epoch != 3 {
		t.Fatalf("latest checkpoint %+v", p.Latest)
	}
	// The run lets go of both hosts before it closes, each on its own queue.
	h.wantReleases(1, 2)
}

// wantReleases: the hosts of generation gen (the first n requests) were
// each told to let go of their hold, on their own queue, by the run.
func (h *harness) wantReleases(gen, n int) {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	got := map[int]bool{}
	for _, r := range h.releases {
		if r.in.Generation != gen {
			continue
		}
		if r.queue != fmt.Sprintf("q-%d-%d", gen, r.in.Request) || len(r.in.RunIDs) != 1 || r.in.RunIDs[0] == "" {
			h.t.Fatalf("release %+v on queue %s; want it on the host's own queue, naming the run", r.in, r.queue)
		}
		got[r.in.Request] = true
	}
	if len(got) != n {
		h.t.Fatalf("generation %d: %d hosts let go of (%+v); want %d", gen, len(got), h.releases, n)
	}
}

func TestBadSpecFailsAtOnceNamingTheField(t *testing.T) {
	for spec, want := range map[string]string{
		`{"scaling": {"workers": 2, "gang_timeout": "1ms"}}`: "scaling.gang_timeout is 1ms; want 1s to 168h",
		`{"scaling": {"workers": 0}}`:                        "scaling.workers is 0; want 1 to 8192 ranks (leave it out, or null, for the default)",
		`{"model": {"hiden": [3]}}`:                          `unknown field "hiden"`,
		`[1, 2]`:                                             "want an object {...}, got a list (line 1, column 1)",
		`null`:                                               "the input is null",
		`{"continued": {"epoch": 9, "epochs": 10}}`:          "continued: the state continue-as-new carries; a start may not supply it",
	} {
		h := newHarness(t)
		_, err := h.start(spec)
		var app *temporal.ApplicationError
		if !errors.As(err, &app) || !app.NonRetryable() || !strings.Contains(err.Error(), want) {
			t.Errorf("spec %s: got %v, want a non-retryable error containing %q", spec, err, want)
		}
		if len(h.inputs()) != 0 {
			t.Errorf("spec %s: %d epochs ran", spec, len(h.inputs()))
		}
	}
}

func TestRankFailureReformsTheGangAndResumes(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, time.Second)
	h.grant(2, 2, 10*time.Second)
	h.epoch = func(in spec.EpochInput) error {
		// A real gang fails together: rank 1 loses its link, rank 0 hears it.
		if in.Epoch == 2 && in.Generation == 1 {
			if in.Rank == 0 {
				time.Sleep(50 * time.Millisecond)
				return errors.New("collective: rank 1 failed")
			}
			return errors.New("collective: rank 0 failed: connection lost")
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 4}, "scaling": {"workers": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Epoch != 4 || p.Failures != 1 || p.Generation != 2 {
		t.Fatalf("progress %+v", p)
	}
	if len(p.Incidents) != 1 || p.Incidents[0].Kind != spec.IncidentFailure ||
		p.Incidents[0].Detail != "rank 1 on host-2: collective: rank 0 failed: connection lost" {
		t.Fatalf("incidents %+v; want one line naming the rank, its worker and the activity's own message", p.Incidents)
	}
	// The retried epoch 2 runs on the new gang and resumes from the epoch-2 checkpoint.
	retried := 0
	for _, in := range h.inputs() {
		if in.Generation == 2 && in.Epoch == 2 {
			retried++
			if in.Restore == nil || in.Restore.Epoch != 2 || !in.Resume {
				t.Fatalf("retried epoch input %+v", in)
			}
		}
	}
	if retried != 2 {
		t.Fatalf("epoch 2 was retried by %d ranks of the new gang, want 2", retried)
	}
	// The failed gang's hosts were let go of at once, and the new gang's at the end.
	h.wantReleases(1, 2)
	h.wantReleases(2, 2)
}

func TestFailureRollsBackToTheLatestCheckpoint(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, 0)
	h.grant(2, 1, 0)
	// Checkpoints every 2 epochs; epoch 3 fails. The new gang restores the
	// epoch-2 checkpoint, so epoch 2 is trained again, then 3.
	failed := false
	h.epoch = func(in spec.EpochInput) error {
		if in.Epoch == 3 && !failed {
			failed = true
			return errors.New("worker lost")
		}
		return nil
	}
	h.restoredEpoch = func(in spec.EpochInput) int {
		if in.Generation == 2 && in.Restore != nil {
			return in.Restore.Epoch
		}
		return in.Epoch
	}
	p, err := h.start(`{"hyper": {"epochs": 5}, "checkpoint": {"every_epochs": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	var trained []int
	for _, m := range p.Metrics {
		trained = append(trained, m.Epoch)
	}
	if fmt.Sprint(trained) != "[0 1 2 2 3 4]" || p.Epoch != 5 {
		t.Fatalf("epochs trained %v, progress epoch %d", trained, p.Epoch)
	}
}

func TestLostLeaseFailsTheEpoch(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, time.Second)
	h.grant(2, 2, 10*time.Second)
	// Generation 1's slot 1 lease times out (its worker died) while epoch 0 trains.
	var once sync.Once
	h.hold = func(ctx context.Context, in spec.HoldSlotInput) error {
		if in.Generation == 1 && in.Request == 1 {
			dead := false
			once.Do(func() { dead = true })
			if dead {
				time.Sleep(50 * time.Millisecond)
				return temporal.NewTimeoutError(0, errors.New("heartbeat timeout"))
			}
		}
		<-ctx.Done()
		return ctx.Err()
	}
	h.epoch = func(in spec.EpochInput) error {
		if in.Generation == 1 {
			time.Sleep(200 * time.Millisecond) // training while the lease expires
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 2}, "scaling": {"workers": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.Failures != 1 || p.Generation != 2 || p.Epoch != 2 || !strings.Contains(p.Incidents[0].Detail, "lost the slot of rank 1") {
		t.Fatalf("progress %+v", p)
	}
}

func TestFailureBudgetExhaustedFailsTheRun(t *testing.T) {
	h := newHarness(t)
	for gen := 1; gen <= 3; gen++ {
		h.grant(gen, 1, time.Duration(gen)*10*time.Second)
	}
	h.epoch = func(in spec.EpochInput) error { return errors.New("worker lost") }
	p, err := h.start(`{"hyper": {"epochs": 2}, "failure": {"max_failures": 1}}`)
	if err == nil || !strings.Contains(err.Error(), "2 failures exceed failure.max_failures 1") {
		t.Fatalf("got %v", err)
	}
	_ = p
}

func TestUserErrorFailsFast(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, time.Second)
	h.epoch = func(in spec.EpochInput) error {
		return temporal.NewNonRetryableApplicationError("training diverged: loss is NaN", spec.ErrUser, nil)
	}
	_, err := h.start(`{"scaling": {"workers": 2}}`)
	if err == nil || !strings.Contains(err.Error(), "diverged") {
		t.Fatalf("got %v", err)
	}
	for _, in := range h.inputs() {
		if in.Generation != 1 || in.Epoch != 0 {
			t.Fatalf("epoch %d ran on generation %d: a user error must not be retried", in.Epoch, in.Generation)
		}
	}
}

func TestPreemptionsHaveTheirOwnBudget(t *testing.T) {
	h := newHarness(t)
	for gen := 1; gen <= 4; gen++ {
		h.grant(gen, 1, time.Duration(gen)*10*time.Second)
	}
	preempted := 0
	h.epoch = func(in spec.EpochInput) error {
		if preempted < 3 {
			preempted++
			return temporal.NewApplicationError("worker is shutting down", spec.ErrPreempted)
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 1}, "failure": {"max_failures": 1}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.Preemptions != 3 || p.Failures != 0 || p.State != spec.StateCompleted {
		t.Fatalf("progress %+v", p)
	}
}

// A SIGTERMed worker's gang stops at one step and commits a mid-epoch
// checkpoint on its way out; only the ranks' errors carry it. The next gang
// must resume from it, and it is a preemption, not a failure.
func TestPreemptedGangResumesFromTheCheckpointItLeftWith(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, 0)
	h.grant(2, 2, 0)
	left := spec.CheckpointRef{URL: "file:///ckpt", Run: "r", ID: "ckpt-e000000-s000000037", Epoch: 0, Step: 37}
	h.epoch = func(in spec.EpochInput) error {
		if in.Generation == 1 {
			return temporal.NewApplicationError(fmt.Sprintf("rank %d: worker host-1 is shutting down; checkpointed at epoch 0 step 37", in.Rank), spec.ErrPreempted, left)
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 2}, "scaling": {"workers": 2}, "failure": {"max_failures": 0}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Preemptions != 1 || p.Failures != 0 || p.Generation != 2 {
		t.Fatalf("progress %+v", p)
	}
	for _, in := range h.inputs() {
		if in.Generation == 2 && in.Epoch == 0 && (in.Restore == nil || *in.Restore != left) {
			t.Fatalf("the new gang restores from %+v, want the checkpoint the preempted gang left with %+v", in.Restore, left)
		}
	}
	if len(p.Metrics) != 2 || p.Metrics[0].Epoch != 0 {
		t.Fatalf("metrics %+v: the interrupted epoch must be recorded once, by the gang that finished it", p.Metrics)
	}
}

func TestStopFinishesTheEpochCheckpointsAndCompletes(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, time.Second)
	h.epoch = func(in spec.EpochInput) error {
		if in.Epoch == 1 {
			h.env.SignalWorkflow(spec.SignalStop, nil)
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 10}, "checkpoint": {"every_epochs": 5}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateStopped || p.Epoch != 2 || h.saves != 1 || p.Latest == nil || p.Latest.ID != "ckpt-on-stop" {
		t.Fatalf("progress %+v, %d saves", p, h.saves)
	}
}

// The stop update does what the signal does, and answers once the run has
// ended, with the checkpoint it stopped at.
func TestStopUpdateAnswersWithTheFinalCheckpoint(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, time.Second)
	var answer spec.StopResult
	var answerErr error
	answered := false
	h.epoch = func(in spec.EpochInput) error {
		if in.Epoch == 1 {
			h.env.UpdateWorkflow(spec.UpdateStop, "stop-1", &testsuite.TestUpdateCallback{
				OnReject: func(err error) { answerErr = err },
				OnAccept: func() {},
				OnComplete: func(v any, err error) {
					answered, answerErr = true, err
					if r, ok := v.(spec.StopResult); ok {
						answer = r
					}
				},
			})
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 10}, "checkpoint": {"every_epochs": 5}}`)
	if err != nil {
		t.Fatal(err)
	}
	if answerErr != nil || !answered {
		t.Fatalf("the update was not answered: %v", answerErr)
	}
	if p.State != spec.StateStopped || answer.State != spec.StateStopped || answer.Epoch != 2 || answer.Latest == nil || answer.Latest.ID != "ckpt-on-stop" {
		t.Fatalf("progress %+v, update answer %+v", p, answer)
	}
}

// With scaling.min_workers, a run that gets only some of its slots goes on
// with them (keeping the global batch, checkpointing every epoch), and grows
// back to the requested size at an epoch boundary once slots are free.
func TestElasticGangShrinksAndGrowsBack(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, 0) // one of two slots at first
	h.grant(2, 2, 0) // the probe for the missing slot gets it
	h.epoch = func(spec.EpochInput) error {
		time.Sleep(100 * time.Millisecond) // an epoch lasts long enough for the probe's grant to arrive
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 4, "batch_size": 64}, "scaling": {"workers": 2, "min_workers": 1, "gang_timeout": "1s"}, "checkpoint": {"every_epochs": 3}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Epoch != 4 || p.Failures != 0 || p.Workers != 2 {
		t.Fatalf("progress %+v", p)
	}
	worlds := map[int]int{}
	for _, in := range h.inputs() {
		worlds[in.Epoch] = len(in.Peers)
		switch len(in.Peers) {
		case 1:
			if in.BatchSize != 128 || !in.Checkpoint || in.Generation != 1 {
				t.Fatalf("a degraded rank's input: batch %d, checkpoint %v, generation %d; want 128 (the global batch), true, 1", in.BatchSize, in.Checkpoint, in.Generation)
			}
		case 2:
			if in.BatchSize != 64 || in.Generation != 2 || (in.Epoch == 2 && !in.Resume) {
				t.Fatalf("a grown gang's input: batch %d, generation %d, resume %v", in.BatchSize, in.Generation, in.Resume)
			}
		}
	}
	if worlds[0] != 1 || worlds[1] != 1 || worlds[2] != 2 || worlds[3] != 2 {
		t.Fatalf("ranks per epoch %v; want 1, 1, then 2 from epoch 2", worlds)
	}
	var resized []string
	for _, inc := range p.Incidents {
		if inc.Kind == spec.IncidentResized {
			resized = append(resized, inc.Detail)
		}
	}
	if len(resized) != 2 || !strings.Contains(resized[1], "grew from 1 to 2 ranks") {
		t.Fatalf("resize incidents %q", resized)
	}
}

// A grant for a request the probe never made (a forged or mistaken signal
// of the probe's generation) does not count toward the probe: the gang
// grows only with the slots it asked for.
func TestElasticProbeCountsOnlyTheRequestsItMade(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, 0) // one of two slots at first
	h.grant(2, 1, 0) // the probe (generation 2, request 1) never gets its slot
	h.epoch = func(in spec.EpochInput) error {
		if in.Epoch == 0 {
			h.env.SignalWorkflow(spec.SignalSlotGranted, spec.SlotGranted{Generation: 2, Request: 7,
				Placement: spec.Placement{Worker: "forged", HostQueue: "q-forged", Collective: "10.9.9.9:7070"}})
		}
		time.Sleep(100 * time.Millisecond)
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 3, "batch_size": 64}, "scaling": {"workers": 2, "min_workers": 1, "gang_timeout": "1s"}, "checkpoint": {"every_epochs": 3}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Epoch != 3 {
		t.Fatalf("progress %+v", p)
	}
	for _, in := range h.inputs() {
		if len(in.Peers) != 1 {
			t.Fatalf("epoch %d ran with %d ranks; the probe never held its slot, so the gang stays at 1", in.Epoch, len(in.Peers))
		}
	}
}

// A reset run receives again the signals its base run received: grants of
// holds of the same generation and request, and restore reports, that name
// the base run. It takes none of them for its own: its gang is made of the
// slots its own holds were granted, and it is charged no failure.
func TestAResetRunTakesNotItsBaseRunsGrants(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, 0)
	h.lost = func(in spec.HoldSlotInput, asked int) error {
		if in.RunID == "" || in.RunID == "the-base-run" {
			t.Errorf("hold asked for by run %q", in.RunID)
		}
		if asked == 0 { // the base run's grant of this generation and request arrives first
			h.env.SignalWorkflow(spec.SignalSlotGranted, spec.SlotGranted{Generation: in.Generation, Request: in.Request, RunID: "the-base-run",
				Placement: spec.Placement{Worker: "base-run-host", HostQueue: "q-base", Collective: "10.9.9.9:7070", Slots: []int{0}}})
		}
		return nil
	}
	h.epoch = func(in spec.EpochInput) error {
		if in.Epoch == 0 && in.Rank == 0 {
			h.env.SignalWorkflow(spec.SignalGangRestored, spec.GangRestored{Generation: 1, RunID: "the-base-run",
				Report: spec.RestoreReport{From: spec.CheckpointRef{Run: "r", ID: "ckpt-of-the-base-run"}}})
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 2}, "scaling": {"workers": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 1 || p.Failures != 0 {
		t.Fatalf("progress %+v", p)
	}
	for _, in := range h.inputs() {
		for _, peer := range in.Peers {
			if peer == "10.9.9.9:7070" {
				t.Fatalf("epoch %d ran on a slot granted to the base run: %+v", in.Epoch, in.Peers)
			}
		}
	}
	for _, inc := range p.Incidents {
		if strings.Contains(inc.Detail, "ckpt-of-the-base-run") {
			t.Fatalf("the base run's restore report was recorded: %+v", inc)
		}
	}
}

// Without min_workers a partial gang is never taken.
func TestPartialGangIsNotTakenWithoutMinWorkers(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, 0)
	h.grant(2, 2, 0)
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 2, "gang_timeout": "1s"}}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range h.inputs() {
		if len(in.Peers) != 2 {
			t.Fatalf("an epoch ran with %d ranks", len(in.Peers))
		}
	}
	if p.Generation != 2 {
		t.Fatalf("progress %+v", p)
	}
	// The partial gang's one host was let go of while the run backed off.
	h.wantReleases(1, 1)
}

func TestGangTimeoutBacksOffAndRetries(t *testing.T) {
	// The back-off is at most the gang timeout (1s here) plus jitter: held
	// slots keep the test clock at real time.
	h := newHarness(t)
	h.grant(1, 1, time.Second) // only one of two slots in generation 1
	h.grant(2, 2, 5*time.Minute)
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 2, "gang_timeout": "1s"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.Generation != 2 || p.Failures != 0 || len(p.Incidents) != 1 || p.Incidents[0].Kind != spec.IncidentGangTimeout {
		t.Fatalf("progress %+v", p)
	}
	if p.Waiting != "" {
		t.Fatalf("a run whose gang formed still says it waits: %q", p.Waiting)
	}
}

// Anyone who may signal the namespace's workflows can send a slot grant
// that does not decode: the SDK drops it, and the gang goes on forming as
// if it never came (here its timeout still fires and the run retries),
// rather than waiting inside the selector for the next good grant.
func TestACorruptGrantNeitherWedgesNorJoinsTheGang(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 1, time.Second) // one of two slots in generation 1: the gang times out
	h.grant(2, 2, 0)
	h.env.RegisterDelayedCallback(func() {
		h.env.SignalWorkflow(spec.SignalSlotGranted, "not a grant")
		h.env.SignalWorkflow(spec.SignalSlotGranted, map[string]any{"generation": "one", "request": []int{1}})
	}, 100*time.Millisecond)
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 2, "gang_timeout": "1s"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 2 || len(p.Incidents) != 1 || p.Incidents[0].Kind != spec.IncidentGangTimeout {
		t.Fatalf("progress %+v; want completed by generation 2 after one gang timeout", p)
	}
}

func TestContinueAsNewCarriesTheState(t *testing.T) {
	h := newHarness(t)
	h.env.SetContinueAsNewSuggested(true) // as the server says once a history grows large
	h.grant(1, 1, time.Second)
	h.env.ExecuteWorkflow(spec.WorkflowTraining, json.RawMessage(`{"name": "long", "hyper": {"epochs": 5}}`))
	err := h.env.GetWorkflowError()
	var can *workflow.ContinueAsNewError
	if !errors.As(err, &can) {
		t.Fatalf("got %v, want continue-as-new", err)
	}
	var next json.RawMessage
	if err := converterDecode(can, &next); err != nil {
		t.Fatal(err)
	}
	s, p, kept, err := decodeInput(next, true)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "long" || p == nil || p.Epoch != 1 || len(p.Metrics) != 1 || p.Latest == nil || p.Run != "long" {
		t.Fatalf("carried spec %+v, state %+v", s, p)
	}
	// The gang crosses with the run: its hold was not cancelled, and the
	// next run learns what to take over.
	if kept == nil || kept.Generation != 1 || len(kept.Hosts) != 1 || kept.Hosts[0] != (keptHost{holdID{1, 0}, "q-1-0"}) || p.Gang != nil {
		t.Fatalf("kept gang %+v, placements %+v; want generation 1's one host, on its queue, and no placements carried", kept, p.Gang)
	}
	// A gang that does not add up is formed anew, not taken over.
	var fields map[string]json.RawMessage
	json.Unmarshal(next, &fields)
	fields[continuedGangKey] = json.RawMessage(`{"generation": 1, "hosts": []}`)
	bad, _ := json.Marshal(fields)
	if _, p, kept, err := decodeInput(bad, true); err != nil || kept != nil || p.Gang != nil || p.World != 0 {
		t.Fatalf("a kept gang with no holds: kept %+v, gang %+v, err %v; want none kept", kept, p.Gang, err)
	}
	// A start may not claim a gang.
	if _, _, _, err := decodeInput(bad, false); err == nil {
		t.Fatal("a start carrying a gang was accepted")
	}
}

// fakePublicKey stands for the key of a hold: what matters is that it reaches the ranks.
func fakePublicKey(generation, request int) []byte {
	return []byte(fmt.Sprintf("key-of-generation-%d-request-%d", generation, request))
}

// TestHostsAreTheUnitOfScheduling: with scaling.workers_per_host a gang is
// a set of hosts: one HoldSlot per host for all its slots, one RunEpoch per
// host and epoch, and each input names only the hosts its ranks talk to,
// so Temporal's traffic and payloads grow with hosts, not ranks.
func TestHostsAreTheUnitOfScheduling(t *testing.T) {
	for _, c := range []struct{ ranks, perHost int }{{16, 8}, {4096, 8}} {
		if c.ranks > 1024 && raceEnabled {
			t.Logf("%d ranks: skipped under the race detector (the workflow task would pass the SDK's deadlock detector)", c.ranks)
			continue
		}
		h := newHarness(t)
		hosts := c.ranks / c.perHost
		h.grant(1, hosts, time.Second)
		p, err := h.start(fmt.Sprintf(`{"name": "hosts", "hyper": {"epochs": 2}, "scaling": {"workers": %d, "workers_per_host": %d}}`, c.ranks, c.perHost))
		if err != nil {
			t.Fatal(err)
		}
		if p.State != spec.StateCompleted || p.Epoch != 2 {
			t.Fatalf("%d ranks: state %s after %d epochs; want completed after 2", c.ranks, p.State, p.Epoch)
		}
		if len(h.holds) != hosts || len(h.runs) != 2*hosts {
			t.Fatalf("%d ranks: %d HoldSlot and %d RunEpoch calls; want %d and %d", c.ranks, len(h.holds), len(h.runs), hosts, 2*hosts)
		}
		for _, in := range h.holds {
			if in.Slots != c.perHost {
				t.Fatalf("a hold asked for %d slots; want %d", in.Slots, c.perHost)
			}
		}
		biggest := 0
		for _, in := range h.runs {
			b, _ := json.Marshal(in)
			biggest = max(biggest, len(b))
			// Rank 0's host, the host, its neighbours, and the two hosts at
			// each distance of a skip link of the host ring (2, 4, ...).
			most := 4
			if in.GatherLinks {
				most += 2 * (bits.Len(uint(hosts-1)) - 1)
			}
			if len(in.Hosts) > most || in.World != c.ranks || in.Rank%c.perHost != 0 || in.GatherLinks != (hosts >= 3) {
				t.Fatalf("host input: world %d, first rank %d, %d placements, gather links %v; want %d, a multiple of %d, at most %d, %v", in.World, in.Rank, len(in.Hosts), in.GatherLinks, c.ranks, c.perHost, most, hosts >= 3)
			}
		}
		if biggest > 8<<10 {
			t.Errorf("%d ranks: the largest RunEpoch input is %d bytes; want it not to grow with the gang (under 8 KiB)", c.ranks, biggest)
		}
		// Every rank, expanded, knows rank 0 and its ring neighbours, and where it sits.
		seen := map[int]bool{}
		for _, in := range h.runs[:hosts] {
			ins, places, err := in.RankInputs()
			if err != nil {
				t.Fatal(err)
			}
			for l, r := range ins {
				left, right := (r.Rank+c.ranks-1)%c.ranks, (r.Rank+1)%c.ranks
				if r.Peers[0] == "" || r.Peers[left] == "" || r.Peers[right] == "" || len(r.Peers) != c.ranks {
					t.Fatalf("rank %d does not know rank 0 or its neighbours %d and %d", r.Rank, left, right)
				}
				for d := 2; d < hosts; d *= 2 { // the host ring's skip links
					for _, h := range []int{(r.Rank/c.perHost + d) % hosts, (r.Rank/c.perHost - d + hosts) % hosts} {
						if r.Peers[h*c.perHost] == "" {
							t.Fatalf("rank %d does not know the host %d away (rank %d)", r.Rank, d, h*c.perHost)
						}
					}
				}
				want := spec.LocalPlace{LocalRank: l, LocalWorld: c.perHost, GroupRank: r.Rank / c.perHost, GroupWorld: hosts}
				if places[l] != want || r.Slot != l {
					t.Fatalf("rank %d: place %+v slot %d; want %+v slot %d", r.Rank, places[l], r.Slot, want, l)
				}
				seen[r.Rank] = true
			}
		}
		if len(seen) != c.ranks {
			t.Fatalf("the first epoch ran %d distinct ranks; want %d", len(seen), c.ranks)
		}
		b, _ := json.Marshal(p)
		t.Logf("%d ranks on %d hosts: largest RunEpoch input %d bytes, progress %d bytes", c.ranks, hosts, biggest, len(b))
	}
}

// TestHoldRefusedForWantOfSlotsIsAskedForAgain: a worker that took a host's
// hold with too few slots free refuses it (ErrNoSlot); the workflow asks for
// that host again at once instead of giving up on the gang.
func TestHoldRefusedForWantOfSlotsIsAskedForAgain(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, time.Second)
	refused := 0
	h.noSlot = func(in spec.HoldSlotInput, asked int) bool {
		if in.Request == 1 && asked < 3 {
			refused++
			return true
		}
		return false
	}
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 8, "workers_per_host": 4}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 1 || refused != 3 || len(h.holds) != 5 {
		t.Fatalf("state %s after %d gangs, %d refusals, %d holds; want completed with the first gang, 3 refusals, 5 holds", p.State, p.Generation, refused, len(h.holds))
	}
}

// TestHoldLostBeforeItsGrantIsAskedForAgain: a worker that took a hold and
// lost it before its grant (it could not signal, it stopped) costs the gang
// nothing: the hold is asked for again; one the request itself dooms is not.
func TestHoldLostBeforeItsGrantIsAskedForAgain(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 4, time.Second)
	h.lost = func(in spec.HoldSlotInput, asked int) error {
		if in.Request != 2 {
			return nil
		}
		switch asked {
		case 0, 1:
			return errors.New("telling workflow about slot 0: connection reset")
		case 2:
			// The hold lost second sends its grant late: only now, after
			// the host was asked for a third time and before that hold's
			// own grant. It is not the new hold's grant, and is passed over.
			h.env.SignalWorkflow(spec.SignalSlotGranted, spec.SlotGranted{Generation: 1, Request: 2, Attempt: 1,
				Placement: spec.Placement{Worker: "stale", HostQueue: "q-stale", PublicKey: []byte("stale")}})
			time.Sleep(100 * time.Millisecond)
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 4}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 1 || len(h.holds) != 6 {
		t.Fatalf("state %s after %d gangs and %d holds; want completed with the first gang and 6 holds", p.State, p.Generation, len(h.holds))
	}
	for _, in := range h.inputs() {
		for _, pl := range in.Hosts {
			if pl.Worker == "stale" {
				t.Fatalf("the late grant of a lost hold made it into the gang: %+v", pl)
			}
		}
	}
	// The gang's hosts are the ones let go of at the end: host 2's is the
	// third hold's, not the stale grant's.
	h.wantReleases(1, 4)
	for _, r := range h.releases {
		if r.queue == "q-stale" {
			t.Fatal("the late grant of a lost hold made it into the gang: the run let go of its host")
		}
	}
}

// TestHoldTakenByAStoppedWorkerIsHedged: a hold given to a stopped worker's
// open poll is neither granted nor ended until its heartbeat times out. The
// gang asks for one more host after a quarter of that timeout, forms with
// the host that grants it, and cancels the swallowed hold; the hosts it let
// go of at the end are the gang's.
func TestHoldTakenByAStoppedWorkerIsHedged(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 3, time.Second)
	h.swallowed = func(in spec.HoldSlotInput) bool { return in.Generation == 1 && in.Request == 1 }
	var cancelled []string
	h.env.SetOnActivityCanceledListener(func(info *activity.Info) {
		h.mu.Lock()
		cancelled = append(cancelled, info.ActivityID)
		h.mu.Unlock()
	})
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 2}, "failure": {"heartbeat_timeout": "2s"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 1 || len(h.holds) != 3 {
		t.Fatalf("state %s after %d gangs and %d holds; want completed with the first gang and 3 holds (2 asked, 1 hedged)", p.State, p.Generation, len(h.holds))
	}
	if hedge := h.holds[2]; hedge.Request != 2 || hedge.Attempt != 0 {
		t.Fatalf("the hedged hold asked for request %d attempt %d; want request 2 attempt 0", hedge.Request, hedge.Attempt)
	}
	var queues []string
	h.mu.Lock()
	for _, in := range h.runs {
		queues = append(queues, in.Hosts[in.Host].HostQueue)
	}
	h.mu.Unlock()
	slices.Sort(queues)
	if want := []string{"q-1-0", "q-1-2"}; fmt.Sprint(queues) != fmt.Sprint(want) {
		t.Fatalf("ranks ran on hosts %v; want %v (the hedged host in place of the swallowed one)", queues, want)
	}
	h.mu.Lock()
	if len(h.swallowedIDs) != 1 || !slices.Contains(cancelled, h.swallowedIDs[0]) {
		t.Fatalf("holds cancelled %v, swallowed %v; want the swallowed one cancelled", cancelled, h.swallowedIDs)
	}
	h.mu.Unlock()
	if h.released(holdID{1, 1}) {
		t.Fatal("the run let go of the swallowed hold's host, which never granted it")
	}
	if !h.released(holdID{1, 0}) || !h.released(holdID{1, 2}) {
		t.Fatalf("releases %+v; want the gang's hosts, requests 0 and 2, let go of", h.releases)
	}
}

// TestAGangWaitingForCapacityDoesNotHedge: a hold no worker has started is
// waiting in the queue for a free slot, and a hedge would only add to the
// backlog the autoscaler reads as demand: the gang asks once which holds
// started, and asks for nothing more.
func TestAGangWaitingForCapacityDoesNotHedge(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 3, time.Second)
	h.queued = func(in spec.HoldSlotInput) bool { return in.Request == 1 }
	h.lost = func(in spec.HoldSlotInput, asked int) error {
		if in.Request == 1 {
			time.Sleep(1500 * time.Millisecond) // a slot frees up only now
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 1}, "scaling": {"workers": 2}, "failure": {"heartbeat_timeout": "2s"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 1 || len(h.holds) != 2 || h.startedReads != 1 {
		t.Fatalf("state %s after %d gangs, %d holds, %d reads of the started holds; want completed with the first gang, 2 holds, 1 read", p.State, p.Generation, len(h.holds), h.startedReads)
	}
}

// TestHoldsGrantedInTimeAreNotHedged: a gang whose holds are granted before
// hedgeAfter asks for no more, even when it then waits for a slot it lacks.
func TestHoldsGrantedInTimeAreNotHedged(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 4, time.Second)
	p, err := h.start(`{"hyper": {"epochs": 2}, "scaling": {"workers": 4}, "failure": {"heartbeat_timeout": "1s"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || len(h.holds) != 4 || h.startedReads != 0 {
		t.Fatalf("state %s after %d holds, %d reads of the started holds; want completed with 4 holds, no read", p.State, len(h.holds), h.startedReads)
	}
}

// Rank 0 reports a new gang's restore as soon as the gang agreed on it: a
// gang that breaks before its first epoch ends still leaves its restore in
// the run's progress, and a gang that lasts is recorded once, not twice
// (its first epoch's result reports the restore again).
func TestGangRestoreIsRecordedBeforeItsFirstEpochEnds(t *testing.T) {
	h := newHarness(t)
	for gen := 1; gen <= 3; gen++ {
		h.grant(gen, 2, time.Second)
	}
	report := func(gen int) spec.RestoreReport {
		return spec.RestoreReport{Peer: &spec.PeerRestore{Rank: 1, Epoch: 1, Step: 3 + gen, Bytes: 1000}}
	}
	signalled := make(chan struct{}) // generation 2's rank 0 has reported its restore
	h.epoch = func(in spec.EpochInput) error {
		if in.Epoch == 1 && in.Generation == 1 {
			return errors.New("collective: rank 1 failed")
		}
		if in.Generation >= 2 && in.Epoch == 1 && in.Rank == 0 {
			h.env.SignalWorkflow(spec.SignalGangRestored, spec.GangRestored{Generation: in.Generation, Epoch: 1, Report: report(in.Generation)})
			if in.Generation == 2 {
				close(signalled)
				time.Sleep(50 * time.Millisecond) // the signal is in before the failure
				return errors.New("collective: rank 1 failed")
			}
		}
		if in.Generation == 2 {
			// Rank 1 breaks the gang only once rank 0 has reported: were it
			// first, the run could cancel rank 0 before its epoch began.
			select {
			case <-signalled:
				time.Sleep(50 * time.Millisecond)
			case <-time.After(5 * time.Second):
			}
			return errors.New("collective: rank 0 failed: connection lost")
		}
		return nil
	}
	h.restoreReport = func(in spec.EpochInput) *spec.RestoreReport {
		if in.Generation == 3 && in.Epoch == 1 {
			r := report(3)
			return &r
		}
		return nil
	}
	p, err := h.start(`{"hyper": {"epochs": 3}, "scaling": {"workers": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 3 {
		t.Fatalf("progress %+v", p)
	}
	restored := map[int]int{}
	for _, inc := range p.Incidents {
		if inc.Kind == spec.IncidentRestored {
			restored[inc.Generation]++
			if inc.Restore == nil || inc.Restore.Peer == nil || inc.Restore.Peer.Step != 3+inc.Generation || inc.Epoch != 1 {
				t.Fatalf("restored incident %+v (report %+v)", inc, inc.Restore)
			}
		}
	}
	if restored[2] != 1 || restored[3] != 1 || len(restored) != 2 {
		t.Fatalf("restores recorded per generation: %v; want generation 2 (broken before its first epoch ended) and 3, once each", restored)
	}
}

// A gang gathers small all-reduces only when every host's worker says it
// can: one worker of an earlier release (whose grant does not say so) and
// every rank of the gang runs the ring only, since ranks must agree.
func TestSmallAllReduceOnlyWhenEveryHostCan(t *testing.T) {
	for _, old := range []bool{false, true} {
		h := newHarness(t)
		h.grant(1, 3, time.Second)
		if old {
			h.earlierRelease = func(in spec.HoldSlotInput) bool { return in.Request == 1 }
		}
		p, err := h.start(`{"name": "small", "hyper": {"epochs": 2}, "scaling": {"workers": 3}}`)
		if err != nil {
			t.Fatal(err)
		}
		if p.State != spec.StateCompleted {
			t.Fatalf("state %s", p.State)
		}
		want := smallAllReduce
		if old {
			want = 0
		}
		ins := h.inputs()
		if len(ins) != 6 {
			t.Fatalf("%d rank inputs; want 6", len(ins))
		}
		for _, in := range ins {
			if in.SmallAllReduceBytes != want {
				t.Fatalf("a worker of an earlier release in the gang: %v; rank %d was told to gather up to %d bytes; want %d", old, in.Rank, in.SmallAllReduceBytes, want)
			}
			if in.GatherLinks != !old {
				t.Fatalf("a worker of an earlier release in the gang: %v; rank %d was told to gather over links: %v", old, in.Rank, in.GatherLinks)
			}
		}
	}
}

// A gang gathers over skip links only where every host's worker can, its
// ring has 3 members or more, and it is on more than one machine; a
// hierarchical gang's ring is of hosts, a flat one's of ranks.
func TestRingLinksWhereTheyPay(t *testing.T) {
	gang := func(hosts, perHost int, addr func(i int) string) []spec.Placement {
		ps := make([]spec.Placement, hosts)
		for i := range ps {
			ps[i] = spec.Placement{Rank: i * perHost, Collective: addr(i), SmallAllReduce: true, GatherLinks: true}
			if perHost > 1 {
				ps[i].Slots = make([]int, perHost)
			}
		}
		return ps
	}
	spread := func(i int) string { return fmt.Sprintf("10.0.0.%d:7070", i) }
	oneMachine := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", 7000+i) }
	flat := spec.Training{Scaling: spec.Scaling{WorkersPerHost: 1}}
	hier := spec.Training{Scaling: spec.Scaling{WorkersPerHost: 4}}
	ringOf4 := spec.Training{Scaling: spec.Scaling{WorkersPerHost: 4, AllReduce: spec.AllReduceRing}}
	earlier := gang(4, 1, spread)
	earlier[2].GatherLinks = false
	noSmall := gang(4, 1, spread)
	noSmall[1].SmallAllReduce = false
	v6 := gang(3, 1, func(i int) string { return fmt.Sprintf("[fd00::%d]:7070", i) })
	for _, c := range []struct {
		name string
		s    spec.Training
		ps   []spec.Placement
		want spec.RingLinks
	}{
		{"3 ranks on 3 machines", flat, gang(3, 1, spread), spec.RankSkipLinks},
		{"3 ranks on IPv6 machines", flat, v6, spec.RankSkipLinks},
		{"2 ranks on 2 machines", flat, gang(2, 1, spread), spec.RingOnly},
		{"4 ranks on one machine", flat, gang(4, 1, oneMachine), spec.RingOnly},
		{"a worker of an earlier release", flat, earlier, spec.RingOnly},
		{"a worker that does not gather", flat, noSmall, spec.RingOnly},
		{"3 hosts of 4, hierarchical", hier, gang(3, 4, spread), spec.HostSkipLinks},
		{"2 hosts of 4, hierarchical", hier, gang(2, 4, spread), spec.RingOnly},
		{"2 hosts of 4 on one ring", ringOf4, gang(2, 4, spread), spec.RankSkipLinks},
	} {
		if got := ringLinks(c.s, c.ps, smallAllReduceBytes(c.ps)); got != c.want {
			t.Errorf("%s: %v; want %v", c.name, got, c.want)
		}
	}
}

// A gang reduces through host windows only where every placement's worker
// can, each holds one rank, and all are on one machine.
func TestHostWindowsWhereEveryRankIsOnOneMachine(t *testing.T) {
	gang := func(n, perHost int, addr func(i int) string) []spec.Placement {
		ps := make([]spec.Placement, n)
		for i := range ps {
			ps[i] = spec.Placement{Rank: i * perHost, Collective: addr(i), HostWindows: true}
			if perHost > 1 {
				ps[i].Slots = make([]int, perHost)
			}
		}
		return ps
	}
	oneMachine := func(i int) string { return fmt.Sprintf("127.0.0.1:%d", 7000+i) }
	spread := func(i int) string { return fmt.Sprintf("10.0.0.%d:7070", i) }
	flat := spec.Training{Scaling: spec.Scaling{WorkersPerHost: 1}}
	hier := spec.Training{Scaling: spec.Scaling{WorkersPerHost: 4}}
	earlier := gang(3, 1, oneMachine)
	earlier[1].HostWindows = false
	lastElsewhere := gang(3, 1, oneMachine)
	lastElsewhere[2].Collective = "127.0.0.2:7002"
	unparsed := gang(2, 1, oneMachine)
	unparsed[0].Collective = "127.0.0.1"
	for _, c := range []struct {
		name string
		s    spec.Training
		ps   []spec.Placement
		want bool
	}{
		{"4 ranks on one machine", flat, gang(4, 1, oneMachine), true},
		{"2 ranks on one machine", flat, gang(2, 1, oneMachine), true},
		{"1 rank", flat, gang(1, 1, oneMachine), false},
		{"3 ranks on 3 machines", flat, gang(3, 1, spread), false},
		{"the last rank on another address", flat, lastElsewhere, false},
		{"a worker of an earlier release", flat, earlier, false},
		{"an address without a port", flat, unparsed, false},
		{"2 hosts of 4, hierarchical, one machine", hier, gang(2, 4, oneMachine), false},
	} {
		if got := hostWindows(c.s, c.ps); got != c.want {
			t.Errorf("%s: %v; want %v", c.name, got, c.want)
		}
	}
}

// A signal that does not decode, sent while a continued run waits for its
// gang's hosts to hand their holds over, is passed over: the handover's
// timeout still fires, and the run forms a gang anew and completes.
func TestACorruptGrantDuringHandoverDoesNotWedgeTheRun(t *testing.T) {
	first := newHarness(t)
	first.env.SetContinueAsNewSuggested(true)
	first.grant(1, 1, time.Second)
	first.env.ExecuteWorkflow(spec.WorkflowTraining, json.RawMessage(`{"name": "handed", "hyper": {"epochs": 3}, "scaling": {"gang_timeout": "1s"}}`))
	var can *workflow.ContinueAsNewError
	if err := first.env.GetWorkflowError(); !errors.As(err, &can) {
		t.Fatalf("got %v, want continue-as-new", err)
	}
	var next json.RawMessage
	if err := converterDecode(can, &next); err != nil {
		t.Fatal(err)
	}
	if _, _, kept, err := decodeInput(next, true); err != nil || kept == nil {
		t.Fatalf("kept gang %+v, %v; want one to take over", kept, err)
	}

	h := newHarness(t)
	h.env.SetContinuedExecutionRunID("the-run-before")
	h.grant(2, 1, 0) // generation 1's host never hands over; generation 2 forms
	h.env.RegisterDelayedCallback(func() {
		h.env.SignalWorkflow(spec.SignalSlotGranted, "not a grant")
		h.env.SignalWorkflow(spec.SignalSlotGranted, map[string]any{"generation": "one", "request": []int{0}})
	}, 100*time.Millisecond)
	h.env.ExecuteWorkflow(spec.WorkflowTraining, next)
	if !h.env.IsWorkflowCompleted() {
		t.Fatal("the continued run did not complete")
	}
	var p *spec.Progress
	if err := h.env.GetWorkflowResult(&p); err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Generation != 2 || p.Epoch != 3 {
		t.Fatalf("progress %+v; want completed by generation 2 after the handover timed out", p)
	}
	handedOver := false
	for _, in := range h.holds {
		handedOver = handedOver || in.Handover != nil && in.Generation == 1
	}
	if !handedOver {
		t.Fatal("the continued run never asked generation 1's host to hand over")
	}
}

// A run whose gang restores past the epochs it has counted (a PBT segment
// cloned from a donor whose program had finished), and whose programs then
// say their training is over, completes there: it does not ask the finished
// programs for another epoch and wait on them.
func TestARunRestoredWhereItsProgramHadFinishedCompletes(t *testing.T) {
	h := newHarness(t)
	h.grant(1, 2, time.Second)
	h.restoredEpoch = func(spec.EpochInput) int { return 3 }
	h.finished = func(_ spec.EpochInput, epoch int) bool { return epoch == 3 }
	p, err := h.start(`{"name": "clone", "hyper": {"epochs": 100000}, "scaling": {"workers": 2}}`)
	if err != nil {
		t.Fatal(err)
	}
	if p.State != spec.StateCompleted || p.Epoch != 3 || p.Epochs != 3 || p.Failures != 0 {
		t.Fatalf("progress %+v", p)
	}
	if n := len(h.inputs()); n != 2 {
		t.Fatalf("%d RunEpoch calls; want one per rank", n)
	}
}
