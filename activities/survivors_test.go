package activities

import (
	"bytes"
	"context"
	"errors"
	"reflect"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
	"github.com/durabletrain/durabletrain/trainer"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/testsuite"
)

// crashing is a trainer whose rank dies, as far as its gang can tell,
// right after step `step` of epoch `epoch`: its call fails, its replica
// closes its connections, and (not a Snapshotter) it keeps nothing, as a
// killed process keeps nothing.
type crashing struct {
	trainer.Trainer
	epoch, step int
}

func (c crashing) TrainEpoch(ctx context.Context, epoch int, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	progress := opts.Progress
	opts.Progress = func(p trainer.Progress) {
		if progress != nil {
			progress(p)
		}
		if p.Epoch == c.epoch && p.Step == c.step {
			cancel(errors.New("rank crashed"))
		}
	}
	return c.Trainer.TrainEpoch(ctx, epoch, opts)
}

func crashAfter(epoch, step int) *trainer.Backends {
	b := trainer.NewBackends()
	native, _ := trainer.DefaultBackends.Lookup(spec.TrainerNative)
	b.Register(spec.TrainerNative, trainer.BackendFunc(func(ctx context.Context, r trainer.Rank) (trainer.Trainer, error) {
		tr, err := native.NewRank(ctx, r)
		if err != nil {
			return nil, err
		}
		return crashing{tr, epoch, step}, nil
	}))
	return b
}

func survivorSpec(t *testing.T, peers bool) spec.Training {
	s := spec.Training{
		Model:      spec.Model{Hidden: []int{32}},
		Dataset:    spec.Dataset{URL: testdata.FashionMNISTSmall()},
		Hyper:      spec.Hyper{Epochs: 2, BatchSize: 16},
		Scaling:    spec.Scaling{Workers: 2},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(t.TempDir()) + "?metadata=skip", KeepLast: spec.Int(0)},
		Failure:    spec.Failure{RecoverFromPeers: &peers},
	}.WithDefaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return s
}

// uninterruptedStateHash is the final state's hash of a 2-rank run of
// survivorSpec never interrupted: what a recovered run must end with.
func uninterruptedStateHash(t *testing.T, run string, secret []byte) string {
	s := survivorSpec(t, true)
	agents, peers := newAgents(t, 2)
	in := spec.EpochInput{Run: run, Generation: 1, Peers: peers, Secret: secret, Spec: s}
	trainEpochs(t, agents, &in, 2)
	return finalStateHash(t, s, run)
}

// finalStateHash is the hash of the run's checkpoint at the end of training.
func finalStateHash(t *testing.T, s spec.Training, run string) string {
	store, _ := checkpoint.Open(t.Context(), s.Checkpoint.URL, nil)
	defer store.Close()
	c, err := store.Verify(t.Context(), run, checkpoint.ID(s.Hyper.Epochs, 0))
	if err != nil {
		t.Fatal(err)
	}
	return c.Manifest.Objects[0].Hash()
}

// A rank dies mid-epoch; the gang's other rank keeps its state. The next
// gang, that survivor and a newcomer, restores from the survivor's memory
// at the step the dead rank last completed with it (not from the epoch's
// checkpoint), reads nothing from storage, and ends with weights
// bit-identical to a run that was never interrupted. With
// recover_from_peers off, the same gang restores the checkpoint instead.
func TestNewGangRestoresFromASurvivorsMemory(t *testing.T) {
	const crashEpoch, crashStep = 1, 7
	secret := []byte("0123456789abcdef0123456789abcdef")

	want := uninterruptedStateHash(t, "peers", secret)

	for _, fromPeers := range []bool{true, false} {
		s := survivorSpec(t, fromPeers)
		agents, peers := newAgents(t, 3) // the third replaces the second
		agents[1].Backends = crashAfter(crashEpoch, crashStep)
		gang := []*Agent{agents[0], agents[1]}
		in := spec.EpochInput{Run: "peers", Generation: 1, Peers: peers[:2], Secret: secret, Spec: s}
		res, errs := runEpochOnAll(t, gang, in)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		in.Epoch, in.Restore = 1, res[0].Checkpoint
		if _, errs = runEpochOnAll(t, gang, in); errs[0] == nil || errs[1] == nil {
			t.Fatalf("the gang went on without its crashed rank: %v", errs)
		}
		// The next gang: the survivor's worker and a new one.
		gang = []*Agent{agents[0], agents[2]}
		told := make(chan spec.GangRestored, 4)
		for _, a := range gang {
			a.signalled = func(name string, arg any) error {
				if name == spec.SignalGangRestored {
					told <- arg.(spec.GangRestored)
				}
				return nil
			}
		}
		in.Generation, in.Peers = 2, []string{peers[0], peers[2]}
		res, errs = runEpochOnAll(t, gang, in)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		// Rank 0 told the run where the state came from, once.
		select {
		case g := <-told:
			if g.Generation != 2 || g.Epoch != 1 || !reflect.DeepEqual(&g.Report, res[0].Restored) {
				t.Fatalf("peers %v: the run was told %+v; want generation 2's report, equal to rank 0's result %+v", fromPeers, g, res[0].Restored)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("peers %v: rank 0 never told the run about the gang's restore", fromPeers)
		}
		select {
		case g := <-told:
			t.Fatalf("peers %v: the run was told twice (again: %+v)", fromPeers, g)
		case <-time.After(100 * time.Millisecond):
		}
		for r := range 2 {
			got := res[r].Restored
			switch {
			case got == nil:
				t.Fatalf("peers %v: rank %d restored nothing", fromPeers, r)
			case fromPeers && (got.Peer == nil || got.Peer.Rank != 0 || got.Peer.Epoch != crashEpoch || got.Peer.Step != crashStep || got.From.ID != ""):
				t.Fatalf("rank %d restored %+v (peer %+v); want the survivor's state at epoch %d step %d from rank 0, nothing from storage", r, got, got.Peer, crashEpoch, crashStep)
			case !fromPeers && (got.Peer != nil || got.From.ID != checkpoint.ID(1, 0) || got.Bytes == 0):
				t.Fatalf("recover_from_peers off: rank %d restored %+v (peer %+v); want checkpoint %s", r, got, got.Peer, checkpoint.ID(1, 0))
			case got.SurvivorsAt == nil || *got.SurvivorsAt != (spec.Position{Epoch: crashEpoch, Step: crashStep}):
				t.Fatalf("peers %v: rank %d says the gang before reached %+v; want epoch %d step %d", fromPeers, r, got.SurvivorsAt, crashEpoch, crashStep)
			}
		}
		if got := finalStateHash(t, s, "peers"); got != want {
			t.Fatalf("peers %v: the recovered run ends with state %s; the uninterrupted one with %s", fromPeers, got, want)
		}
	}
}

// The survivors a worker keeps are bounded: by run, by age and in number.
func TestSurvivorTableIsBounded(t *testing.T) {
	var tab survivorTable
	for i := range maxSurvivors + 5 {
		tab.keep(string(rune('a'+i)), &survivor{cursor: trainer.Cursor{Epoch: 1}, state: []byte{1}, kept: time.Now().Add(time.Duration(i) * time.Millisecond)})
	}
	if len(tab.m) != maxSurvivors || tab.take("a") != nil || tab.take(string(rune('a'+maxSurvivors+4))) == nil {
		t.Fatalf("%d survivors kept; want the newest %d", len(tab.m), maxSurvivors)
	}
	// A newer state of the same run replaces an older one, never the reverse.
	tab.keep("run", &survivor{cursor: trainer.Cursor{Epoch: 1, Step: 5}, kept: time.Now()})
	tab.keep("run", &survivor{cursor: trainer.Cursor{Epoch: 1, Step: 3}, state: []byte{1}, kept: time.Now()})
	tab.keep("run", &survivor{cursor: trainer.Cursor{Epoch: 1, Step: 5}, state: []byte{2}, kept: time.Now()})
	if s := tab.take("run"); s == nil || s.cursor.Step != 5 || len(s.state) != 1 || s.state[0] != 2 {
		t.Fatalf("kept %+v; want step 5 with its state", s)
	}
	// Past survivorTTL a state is gone.
	tab.keep("old", &survivor{cursor: trainer.Cursor{Epoch: 1}, kept: time.Now().Add(-survivorTTL - time.Second)})
	if tab.take("old") != nil {
		t.Fatal("a survivor older than survivorTTL was still kept")
	}
}

// A survivor's state survives encoding whole, and a damaged encoding is refused.
func TestSurvivorStateEncoding(t *testing.T) {
	st := trainer.MemState{"a": []byte("alpha"), "b/c": {}, "d": make([]byte, 1000)}
	got, err := decodeState(encodeState(st))
	if err != nil || len(got) != 3 || string(got["a"]) != "alpha" || len(got["d"]) != 1000 {
		t.Fatalf("decoded %v, %v", got, err)
	}
	enc := encodeState(st)
	for _, cut := range []int{1, 3, 7, len(enc) - 1} {
		if _, err := decodeState(enc[:cut]); err == nil {
			t.Fatalf("a state cut at %d bytes decoded", cut)
		}
	}
	// Packed, the state lies in its broadcast buffer, after the digest's
	// 32 bytes, and fills it but for the padding to a whole float32.
	for _, st := range []trainer.MemState{st, {}, {"x": []byte("abc")}} {
		payload, state := packState(st)
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&payload[0])), 4*len(payload))
		if !bytes.Equal(state, encodeState(st)) || len(payload) != payloadLen(int64(len(state))) ||
			len(state) > 0 && unsafe.SliceData(state) != &raw[32] || len(raw)-32-len(state) > 3 {
			t.Fatalf("packed %d bytes into %d float32s, not in place after the digest", len(state), len(payload))
		}
	}
}

// A survivor's state older than the run's latest checkpoint is never
// taken, and one that does not load sends the whole gang to storage: the
// gang restores the checkpoint either way, and still reports how far the
// survivor had got.
func TestUnusableSurvivorLosesToTheCheckpoint(t *testing.T) {
	for name, at := range map[string]trainer.Cursor{"older": {Epoch: 0, Step: 3}, "newer but damaged": {Epoch: 1, Step: 3}} {
		t.Run(name, func(t *testing.T) { testUnusableSurvivor(t, at) })
	}
}

func testUnusableSurvivor(t *testing.T, at trainer.Cursor) {
	s := survivorSpec(t, true)
	agents, peers := newAgents(t, 2)
	in := spec.EpochInput{Run: "older", Generation: 1, Peers: peers, Secret: []byte("0123456789abcdef0123456789abcdef"), Spec: s}
	res, errs := runEpochOnAll(t, agents, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// A survivor's state that is not a native state at all.
	st := trainer.MemState{"native-state.bin": []byte("not a state anyone should load")}
	agents[1].survivors.keep("default-test-workflow-id/default-test-run-id", &survivor{cursor: at, state: encodeState(st), kept: time.Now()})
	in.Generation, in.Epoch, in.Restore = 2, 1, res[0].Checkpoint
	res, errs = runEpochOnAll(t, agents, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		got := res[r].Restored
		if got == nil || got.Peer != nil || got.From.ID != checkpoint.ID(1, 0) || got.SurvivorsAt == nil || *got.SurvivorsAt != (spec.Position{Epoch: at.Epoch, Step: at.Step}) {
			t.Fatalf("rank %d restored %+v; want checkpoint %s, with the survivor's position %+v reported", r, got, checkpoint.ID(1, 0), at)
		}
	}
}

// A gang that breaks while it asks for a survivor's state (a newcomer
// dies before the vote) loses nothing: the survivor puts what it kept
// back, and the gang after restores from it, not from storage.
func TestSurvivorStateOutlivesAGangThatBreaksBeforeTheVote(t *testing.T) {
	const crashEpoch, crashStep = 1, 5
	secret := []byte("0123456789abcdef0123456789abcdef")
	s := survivorSpec(t, true)
	agents, peers := newAgents(t, 4) // 0 survives; 1 crashes; 2 dies before the vote; 3 joins after
	agents[1].Backends = crashAfter(crashEpoch, crashStep)
	failing := trainer.NewBackends()
	failing.Register(spec.TrainerNative, trainer.BackendFunc(func(context.Context, trainer.Rank) (trainer.Trainer, error) {
		return nil, errors.New("this newcomer's process died")
	}))
	agents[2].Backends = failing

	in := spec.EpochInput{Run: "putback", Generation: 1, Peers: peers[:2], Secret: secret, Spec: s}
	res, errs := runEpochOnAll(t, agents[:2], in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	in.Epoch, in.Restore = 1, res[0].Checkpoint
	if _, errs = runEpochOnAll(t, agents[:2], in); errs[0] == nil {
		t.Fatal("the gang went on without its crashed rank")
	}
	key := "default-test-workflow-id/default-test-run-id"
	kept := func() *survivor {
		agents[0].survivors.mu.Lock()
		defer agents[0].survivors.mu.Unlock()
		return agents[0].survivors.m[key]
	}
	if k := kept(); k == nil || k.state == nil || k.cursor != (trainer.Cursor{Epoch: crashEpoch, Step: crashStep}) {
		t.Fatalf("the survivor kept %+v; want its state at epoch %d step %d", k, crashEpoch, crashStep)
	}

	// The second gang breaks: its newcomer never gets as far as the vote.
	in.Generation, in.Peers = 2, []string{peers[0], peers[2]}
	if _, errs = runEpochOnAll(t, []*Agent{agents[0], agents[2]}, in); errs[0] == nil || errs[1] == nil {
		t.Fatalf("the gang whose newcomer died went on: %v", errs)
	}
	if k := kept(); k == nil || k.state == nil || k.cursor != (trainer.Cursor{Epoch: crashEpoch, Step: crashStep}) {
		t.Fatalf("after the broken gang the survivor holds %+v; want what it kept before", k)
	}

	// The third gang restores from the survivor's memory.
	in.Generation, in.Peers = 3, []string{peers[0], peers[3]}
	res, errs = runEpochOnAll(t, []*Agent{agents[0], agents[3]}, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		if got := res[r].Restored; got == nil || got.Peer == nil || got.Peer.Epoch != crashEpoch || got.Peer.Step != crashStep || got.From.ID != "" {
			t.Fatalf("rank %d of the third gang restored %+v; want the survivor's state, nothing from storage", r, got)
		}
	}
}

// stoppingAt is a trainer whose worker is told to stop (SIGTERM) right
// after step `step` of epoch `epoch`: it closes the worker's stop channel.
type stoppingAt struct {
	trainer.Trainer
	epoch, step int
	stop        func()
}

func (s stoppingAt) TrainEpoch(ctx context.Context, epoch int, opts trainer.EpochOptions) (trainer.EpochMetrics, error) {
	progress := opts.Progress
	opts.Progress = func(p trainer.Progress) {
		if progress != nil {
			progress(p)
		}
		if p.Epoch == s.epoch && p.Step == s.step {
			s.stop()
		}
	}
	return s.Trainer.TrainEpoch(ctx, epoch, opts)
}

// A rank's worker is stopping (SIGTERM): the gang leaves together after a
// checkpoint. The rank whose worker stays keeps its state, the one just
// checkpointed, and the next gang (it and a newcomer) restores from its
// memory: nothing read from storage, nothing trained again, and weights
// bit-identical to a run never interrupted.
func TestSurvivorOfAGangThatLeftWithAStoppingWorkerKeepsItsState(t *testing.T) {
	const stopEpoch, stopStep = 1, 5
	secret := []byte("0123456789abcdef0123456789abcdef")
	want := uninterruptedStateHash(t, "leave", secret)

	s := survivorSpec(t, true)
	agents, peers := newAgents(t, 3) // the third replaces the second, whose worker stops
	stop := make(chan struct{})
	var once sync.Once
	native, _ := trainer.DefaultBackends.Lookup(spec.TrainerNative)
	stopping := trainer.NewBackends()
	stopping.Register(spec.TrainerNative, trainer.BackendFunc(func(ctx context.Context, r trainer.Rank) (trainer.Trainer, error) {
		tr, err := native.NewRank(ctx, r)
		if err != nil {
			return nil, err
		}
		return stoppingAt{tr, stopEpoch, stopStep, func() { once.Do(func() { close(stop) }) }}, nil
	}))
	agents[1].Backends = stopping
	gang := agents[:2]
	in := spec.EpochInput{Run: "leave", Generation: 1, Peers: peers[:2], Secret: secret, Spec: s}
	res, errs := runEpochOnAll(t, gang, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	in.Epoch, in.Restore = 1, res[0].Checkpoint
	_, errs = runEpochOnAllWith(t, gang, in, func(rank int, env *testsuite.TestActivityEnvironment) {
		if rank == 1 {
			env.SetWorkerStopChannel(stop)
		}
	})
	var left, stopped *temporal.ApplicationError
	if !errors.As(errs[0], &left) || left.Type() != spec.ErrPreempted || !errors.As(errs[1], &stopped) || stopped.Type() != spec.ErrPreempted {
		t.Fatalf("the gang did not leave with its stopping worker: %v", errs)
	}
	var ref spec.CheckpointRef
	if err := left.Details(&ref); err != nil || ref.ID == "" || ref.Epoch != stopEpoch || ref.Step <= stopStep {
		t.Fatalf("the staying rank left with checkpoint %+v (%v); want one after epoch %d step %d", ref, err, stopEpoch, stopStep)
	}

	in.Generation, in.Peers, in.Restore = 2, []string{peers[0], peers[2]}, &ref
	res, errs = runEpochOnAll(t, []*Agent{agents[0], agents[2]}, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		if got := res[r].Restored; got == nil || got.Peer == nil || got.Peer.Rank != 0 || got.Peer.Epoch != ref.Epoch || got.Peer.Step != ref.Step || got.From.ID != "" {
			t.Fatalf("rank %d of the next gang restored %+v; want the staying rank's state at the leave checkpoint's step (%d, %d), nothing from storage", r, got, ref.Epoch, ref.Step)
		}
	}
	if got := finalStateHash(t, s, "leave"); got != want {
		t.Fatalf("the run ends with state %s after its gang left; the uninterrupted one with %s", got, want)
	}
}

// gatherBytes turns the run's per-rank bound into the collective's
// option: what a rank gathers, at most 64 KiB, 0 when not asked or alone.
func TestGatherBytes(t *testing.T) {
	for _, c := range []struct{ perRank, world, want int }{
		{0, 4, 0}, {-5, 4, 0}, {4096, 1, 0},
		{4096, 2, 4096}, {4096, 4, 3 * 4096}, {4096, 17, 16 * 4096},
		{4096, 100, 99 * (65536 / 99)}, {1 << 40, 3, 2 * 32768},
	} {
		if got := gatherBytes(c.perRank, c.world); got != c.want {
			t.Errorf("gatherBytes(%d, %d) = %d; want %d", c.perRank, c.world, got, c.want)
		}
	}
}

// A gang told to gather small all-reduces trains to the same weights, bit
// for bit, as one that runs the ring for all of them: 3 ranks (where the
// order of additions matters) and 4 KiB buckets, whose last one is small
// enough to gather; gathered around the ring, and over skip links (ranks
// over TCP, told GatherLinks).
func TestSmallAllReduceTrainsTheSameWeights(t *testing.T) {
	hashes := map[string]string{}
	for _, c := range []struct {
		name  string
		small int
		links bool
	}{{"ring", 0, false}, {"gathered", 4096, false}, {"gathered over links", 4096, true}} {
		small := c.small
		s := spec.Training{
			Model:      spec.Model{Hidden: []int{32}},
			Dataset:    spec.Dataset{URL: testdata.FashionMNISTSmall()},
			Hyper:      spec.Hyper{Epochs: 1, BatchSize: 16},
			Scaling:    spec.Scaling{Workers: 3, BucketBytes: 4096},
			Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(t.TempDir()) + "?metadata=skip", KeepLast: spec.Int(0)},
		}.WithDefaults()
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		agents, peers := newAgents(t, 3)
		if c.links {
			for _, a := range agents {
				a.Transport = collective.TransportTCP
			}
		}
		in := spec.EpochInput{Run: "small", Generation: 1, Peers: peers, Secret: []byte("0123456789abcdef0123456789abcdef"), Spec: s, SmallAllReduceBytes: small, GatherLinks: c.links}
		trainEpochs(t, agents, &in, 1)
		hashes[c.name] = finalStateHash(t, s, "small")
	}
	for name, h := range hashes {
		if h != hashes["ring"] {
			t.Errorf("%s: weights %s; the ring's %s", name, h, hashes["ring"])
		}
	}
}
