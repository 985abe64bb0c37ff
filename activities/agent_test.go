package activities

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
	"go.temporal.io/sdk/worker"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

func newAgents(t *testing.T, n int) ([]*Agent, []string) {
	agents := make([]*Agent, n)
	peers := make([]string, n)
	for i := range n {
		ln, err := collective.Listen("127.0.0.1:0", nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		agents[i] = &Agent{Identity: fmt.Sprintf("worker-%d", i), HostQueue: fmt.Sprintf("q-%d", i), Listener: ln, Slots: []Slot{{Index: 0}},
			Policy: testPolicy(), signalled: func(string, any) error { return nil }}
		a := agents[i]
		t.Cleanup(func() { a.Close() })
		peers[i] = ln.Addr()
	}
	return agents, peers
}

// Close removes the agent's scratch root and what its ranks left there,
// and nothing else; again, it does nothing.
func TestCloseRemovesTheScratchRoot(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	a := &Agent{Identity: "w", Slots: []Slot{{Index: 0}}}
	a.init()
	if filepath.Dir(a.scratch) != os.TempDir() || !strings.HasPrefix(filepath.Base(a.scratch), scratchPrefix) {
		t.Fatalf("scratch root %q; want %s<pid>-… in %s", a.scratch, scratchPrefix, os.TempDir())
	}
	left := filepath.Join(a.scratch, "run-g1-r0-1", "restored")
	if err := os.MkdirAll(left, 0o755); err != nil {
		t.Fatal(err)
	}
	beside := filepath.Join(os.TempDir(), "not-the-agents")
	if err := os.Mkdir(beside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a.scratch); !os.IsNotExist(err) {
		t.Fatalf("the scratch root is still there after Close: %v", err)
	}
	if _, err := os.Stat(beside); err != nil {
		t.Fatalf("Close removed more than its scratch root: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if err := (&Agent{}).Close(); err != nil {
		t.Fatalf("Close of an agent never used: %v", err)
	}
}

// runEpochOnAll runs RunEpoch for every rank at once, each in its own activity environment.
func runEpochOnAll(t *testing.T, agents []*Agent, in spec.EpochInput) ([]spec.EpochResult, []error) {
	return runEpochOnAllWith(t, agents, in, nil)
}

// runEpochOnAllWith is runEpochOnAll with each rank's environment set up
// by setup (if not nil) before its epoch starts.
func runEpochOnAllWith(t *testing.T, agents []*Agent, in spec.EpochInput, setup func(rank int, env *testsuite.TestActivityEnvironment)) ([]spec.EpochResult, []error) {
	var suite testsuite.WorkflowTestSuite
	results := make([]spec.EpochResult, len(agents))
	errs := make([]error, len(agents))
	var wg sync.WaitGroup
	for rank, a := range agents {
		wg.Go(func() {
			env := suite.NewTestActivityEnvironment()
			env.RegisterActivity(a.RunEpoch)
			if setup != nil {
				setup(rank, env)
			}
			rin := in
			rin.Rank = rank
			v, err := env.ExecuteActivity(a.RunEpoch, rin)
			if err == nil {
				err = v.Get(&results[rank])
			}
			errs[rank] = err
		})
	}
	wg.Wait()
	return results, errs
}

// trainEpochs runs in's epochs from 0 to epochs-1 on every rank, each
// told the last one's checkpoint, and returns the last epoch's results.
func trainEpochs(t *testing.T, agents []*Agent, in *spec.EpochInput, epochs int) []spec.EpochResult {
	t.Helper()
	var res []spec.EpochResult
	for epoch := range epochs {
		in.Epoch = epoch
		var errs []error
		res, errs = runEpochOnAll(t, agents, *in)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		in.Restore = res[0].Checkpoint
	}
	return res
}

// twoRankInput is the first epoch of a small native run of two ranks,
// checkpointing to a temporary folder.
func twoRankInput(t *testing.T, run string, peers []string) spec.EpochInput {
	s := spec.Training{
		Model:      spec.Model{Hidden: []int{32}},
		Dataset:    spec.Dataset{URL: testdata.FashionMNISTSmall()},
		Hyper:      spec.Hyper{Epochs: 3},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(t.TempDir()) + "?metadata=skip"},
	}.WithDefaults()
	return spec.EpochInput{Run: run, Generation: 1, Peers: peers, Secret: []byte("0123456789abcdef0123456789abcdef"), Spec: s}
}

func TestTwoRanksTrainStayWarmAndRestoreInANewGang(t *testing.T) {
	agents, peers := newAgents(t, 2)
	in := twoRankInput(t, "act-test", peers)

	res, errs := runEpochOnAll(t, agents, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// Every rank reports the checkpoint rank 0 committed: the workflow learns it from whichever answers.
	if res[0].Checkpoint == nil || res[0].Checkpoint.Epoch != 1 || res[1].Checkpoint == nil || *res[1].Checkpoint != *res[0].Checkpoint {
		t.Fatalf("epoch 0: rank 0 checkpoint %+v, rank 1 checkpoint %+v", res[0].Checkpoint, res[1].Checkpoint)
	}
	if m0, m1 := res[0].Metrics, res[1].Metrics; m0.TestAccuracy != m1.TestAccuracy || m0.TestLoss != m1.TestLoss || m0.TrainLoss != m1.TrainLoss || m0.Steps != m1.Steps {
		t.Fatalf("ranks report different results of the same gang: %+v vs %+v", m0, m1)
	}
	// Epoch 1 on the same gang: warm replicas, no restore.
	in.Epoch, in.Restore = 1, res[0].Checkpoint
	res, errs = runEpochOnAll(t, agents, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if res[0].Metrics.Epoch != 1 || res[0].Restored != nil {
		t.Fatalf("epoch 1 on a warm gang: %+v", res[0])
	}
	warmAccuracy := res[0].Metrics.TestAccuracy
	// A new gang (generation 2): cold replicas restore the epoch-2 checkpoint and train epoch 2.
	in.Generation, in.Epoch, in.Restore = 2, 2, res[0].Checkpoint
	res, errs = runEpochOnAll(t, agents, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if res[0].Metrics.Epoch != 2 || res[0].Restored == nil || res[0].Restored.From.Epoch != 2 {
		t.Fatalf("epoch 2 on a new gang: %+v", res[0])
	}
	if res[0].Metrics.TestAccuracy < warmAccuracy-0.05 {
		t.Fatalf("accuracy fell from %.3f to %.3f after restoring: the restore lost the training", warmAccuracy, res[0].Metrics.TestAccuracy)
	}
}

func TestMissingDataIsAUserError(t *testing.T) {
	agents, peers := newAgents(t, 1)
	s := spec.Training{Dataset: spec.Dataset{URL: "file:///nonexistent/fashion"}, Checkpoint: spec.Checkpoint{URL: "mem://"}}.WithDefaults()
	_, errs := runEpochOnAll(t, agents, spec.EpochInput{Run: "r", Generation: 1, Peers: peers[:1], Secret: []byte("0123456789abcdef"), Spec: s})
	var app *temporal.ApplicationError
	if !errors.As(errs[0], &app) || app.Type() != spec.ErrUser || !app.NonRetryable() {
		t.Fatalf("got %v, want a non-retryable user error", errs[0])
	}
}

// A data set larger than the worker allows (-max-dataset-memory) fails the
// run as the user's error, naming the file and the limit, and the worker
// that refused it loads it once the limit allows.
func TestADataSetPastTheWorkersLimitIsAUserError(t *testing.T) {
	agents, peers := newAgents(t, 1)
	agents[0].Policy.MaxDatasetMemory = 1 << 20
	s := spec.Training{Model: spec.Model{Hidden: []int{16}}, Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()}, Hyper: spec.Hyper{Epochs: 1},
		Checkpoint: spec.Checkpoint{URL: "mem://"}}.WithDefaults()
	in := spec.EpochInput{Run: "r", Generation: 1, Peers: peers[:1], Secret: []byte("0123456789abcdef"), Spec: s}
	_, errs := runEpochOnAll(t, agents, in)
	var app *temporal.ApplicationError
	if !errors.As(errs[0], &app) || app.Type() != spec.ErrUser || !app.NonRetryable() ||
		!strings.Contains(errs[0].Error(), "train-images-idx3-ubyte.gz") || !strings.Contains(errs[0].Error(), "allows 1 MiB for a data set") {
		t.Fatalf("got %v, want a non-retryable user error naming the images and the limit", errs[0])
	}
	agents[0].Policy.MaxDatasetMemory = 0
	in.Generation = 2
	if _, errs := runEpochOnAll(t, agents, in); errs[0] != nil {
		t.Fatalf("the default limit: %v", errs[0])
	}
}

// testPolicy lets the tests' agents use the temporary directories and the committed data set.
func testPolicy() policy.Policy {
	data := testdata.FashionMNISTSmallDir()
	return policy.Policy{StorageRoots: []string{bloburl.FromPath(filepath.Clean(os.TempDir())) + "/", bloburl.FromPath(filepath.Dir(data)) + "/", "mem://"}}
}

// keep_best ranks checkpoints by a metric the run must report: a score the
// first epoch did not report fails the run as the user's error, naming
// what it did report.
func TestKeepBestByAMetricNeverReportedIsAUserError(t *testing.T) {
	agents, peers := newAgents(t, 1)
	s := spec.Training{Model: spec.Model{Hidden: []int{16}}, Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()}, Hyper: spec.Hyper{Epochs: 1},
		Checkpoint: spec.Checkpoint{URL: "mem://", KeepBest: 1, Score: "f1"}}.WithDefaults()
	_, errs := runEpochOnAll(t, agents, spec.EpochInput{Run: "r", Generation: 1, Peers: peers[:1], Secret: []byte("0123456789abcdef"), Spec: s})
	var app *temporal.ApplicationError
	if !errors.As(errs[0], &app) || app.Type() != spec.ErrUser || !app.NonRetryable() ||
		!strings.Contains(errs[0].Error(), `checkpoint.score is "f1", but the run's epoch 0 reported only test_accuracy, test_loss, train_loss`) {
		t.Fatalf("got %v, want a non-retryable user error naming checkpoint.score", errs[0])
	}
}

// A gang that restores a checkpoint at the run's end trains nothing more:
// the last epoch's result was lost after its checkpoint committed (the
// workflow asks for that epoch again), or the run resumes from a finished
// run's checkpoint (resume_from). The result is the checkpoint's own last
// epoch, and with resume_from, a copy of it in the run's own name.
func TestRestoringAtTheRunsEndTrainsNothing(t *testing.T) {
	agents, peers := newAgents(t, 1)
	s := spec.Training{Model: spec.Model{Hidden: []int{16}}, Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()}, Hyper: spec.Hyper{Epochs: 1},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(t.TempDir()) + "?metadata=skip"}}.WithDefaults()
	in := spec.EpochInput{Run: "done", Generation: 1, Peers: peers[:1], Secret: []byte("0123456789abcdef"), Spec: s}
	res, errs := runEpochOnAll(t, agents, in)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	first := res[0]
	// The same epoch asked again of a new gang, its result having been lost.
	in.Generation, in.Restore = 2, first.Checkpoint
	res, errs = runEpochOnAll(t, agents, in)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if r := res[0]; r.Metrics.Epoch != 0 || r.Metrics.TestAccuracy != first.Metrics.TestAccuracy || r.Metrics.Steps != 0 || r.Restored == nil || *r.Checkpoint != *first.Checkpoint {
		t.Fatalf("asked again after its end: %+v (first %+v)", r, first)
	}
	// Another run resumes from the finished one.
	in = spec.EpochInput{Run: "after", Generation: 3, Peers: peers[:1], Secret: []byte("0123456789abcdef"), Spec: s} // a gang of its own
	in.Spec.ResumeFrom = "done"
	res, errs = runEpochOnAll(t, agents, in)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if r := res[0]; r.Metrics.Epoch != 0 || r.Metrics.TestAccuracy != first.Metrics.TestAccuracy || r.Restored == nil || r.Restored.From.Run != "done" ||
		r.Checkpoint == nil || r.Checkpoint.Run != "after" || r.Checkpoint.Epoch != 1 {
		t.Fatalf("resumed from a finished run: %+v", r)
	}
}

// A rank whose gang never forms (its peer died before it joined) ends with
// an error when its activity is cancelled, never a panic: the replica it
// was building is closed with no group in it.
func TestARankWhosePeerNeverJoinsEndsWithAnError(t *testing.T) {
	agents, peers := newAgents(t, 2)
	in := twoRankInput(t, "lonely", peers)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	var suite testsuite.WorkflowTestSuite
	env := suite.NewTestActivityEnvironment()
	env.SetWorkerOptions(worker.Options{BackgroundActivityContext: ctx})
	env.RegisterActivity(agents[0].RunEpoch)
	_, err := env.ExecuteActivity(agents[0].RunEpoch, in)
	var panicked *temporal.PanicError
	if err == nil || errors.As(err, &panicked) {
		t.Fatalf("rank 0 alone, cancelled while joining: %v; want an error, not a panic", err)
	}
}
