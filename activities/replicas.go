package activities

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.temporal.io/sdk/activity"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

type replicaKey struct {
	workflowID string
	generation int
	rank       int
}

func keyOf(ctx context.Context, generation, rank int) replicaKey {
	return replicaKey{activity.GetInfo(ctx).WorkflowExecution.ID, generation, rank}
}

// gangMember is a rank's membership in its gang's collective: a Group of
// the flat ring, or its view of a Host when the gang reduces hierarchically.
type gangMember interface {
	trainer.Reducer
	Close() error
}

// replica is one rank's warm state: its gang membership, its trainer, its store.
type replica struct {
	slot    int    // the slot index it runs on
	scratch string // the rank's own directory, removed with the replica
	group   gangMember
	metrics *rankMetrics
	events  *epochEvents // rank 0's TensorBoard events of the epoch in progress
	tr      trainer.Trainer
	store   *checkpoint.Store
	// storeURL is the spec's checkpoint URL: what checkpoint references
	// carry (the store's own URL has the worker's query parameters added,
	// which stay on the worker).
	storeURL string
	// restoredMetrics are the metrics of the checkpoint the replica was
	// restored from (its manifest's): the last epoch's, at the run's end.
	restoredMetrics map[string]float64
	// pending is rank 0's checkpoint being written in the background (background.go).
	pending *backgroundSave
	// peerRecovery: the run recovers from survivors' memory (survivors.go) and this backend can.
	peerRecovery bool
}

func (r *replica) close() {
	r.pending.close() // before the store it writes to
	if r.group != nil {
		r.group.Close()
	}
	if r.tr != nil {
		r.tr.Close()
	}
	if r.store != nil {
		r.store.Close()
	}
	if r.scratch != "" {
		os.RemoveAll(r.scratch)
	}
}

// replicaTable holds the warm replicas of the ranks this worker runs.
type replicaTable struct {
	mu sync.Mutex
	m  map[replicaKey]*replica
}

func (t *replicaTable) get(k replicaKey) *replica {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[k]
}

// put keeps rep under k, closing the replica it replaces.
func (t *replicaTable) put(k replicaKey, rep *replica) {
	t.mu.Lock()
	old := t.m[k]
	if t.m == nil {
		t.m = map[replicaKey]*replica{}
	}
	t.m[k] = rep
	t.mu.Unlock()
	if old != nil {
		old.close()
	}
}

func (t *replicaTable) drop(k replicaKey) {
	t.mu.Lock()
	rep := t.m[k]
	delete(t.m, k)
	t.mu.Unlock()
	if rep != nil {
		rep.close()
	}
}

// dropOn drops the workflow's replicas that ran on a released slot.
func (t *replicaTable) dropOn(workflowID string, slot int) {
	t.mu.Lock()
	var drop []*replica
	for k, rep := range t.m {
		if k.workflowID == workflowID && rep.slot == slot {
			drop = append(drop, rep)
			delete(t.m, k)
		}
	}
	t.mu.Unlock()
	for _, rep := range drop {
		rep.close()
	}
}

// replica returns the rank's warm replica, or builds one: join the gang, ask
// the spec's backend for the rank's trainer, and restore it (restore.go).
func (a *Agent) replica(ctx context.Context, key replicaKey, in spec.EpochInput, place spec.LocalPlace, beat *heartbeat) (*replica, *spec.RestoreReport, error) {
	if rep := a.replicas.get(key); rep != nil && rep.tr.Cursor().Step == 0 {
		return rep, nil, nil
	}
	backend, err := a.Backends.Lookup(in.Spec.Trainer)
	if err != nil {
		return nil, nil, userError(fmt.Errorf("spec: trainer: %w", err))
	}
	if err := a.Policy.CheckSpec(in.Spec); err != nil {
		return nil, nil, userError(fmt.Errorf("worker %s: %w", a.Identity, err))
	}
	ckptURL, _ := a.Policy.Resolve("checkpoint.url", in.Spec.Checkpoint.URL)
	store, err := checkpoint.Open(a.Policy.StorageContext(ctx), ckptURL, a.Log)
	if err != nil {
		return nil, nil, userError(err)
	}
	if a.PoolKey != nil {
		store.Sign(a.PoolKey)
	}
	// Rank 0 writes the run's checkpoints, so it alone claims the run's
	// name: a gang of thousands claiming at once would be thousands of
	// writers racing the others' listings.
	if in.Owner != "" && in.Rank == 0 {
		if err := store.Claim(ctx, in.Run, in.Owner); err != nil {
			store.Close()
			if errors.Is(err, checkpoint.ErrOwned) {
				return nil, nil, userError(err)
			}
			return nil, nil, err
		}
	}
	rep := &replica{store: store, slot: in.Slot, storeURL: in.Spec.Checkpoint.URL}
	if rep.scratch, err = os.MkdirTemp(a.scratch, fmt.Sprintf("%s-g%d-r%d-", fileSafe(in.Run), in.Generation, in.Rank)); err != nil {
		rep.close()
		return nil, nil, err
	}
	beat.set(map[string]any{"phase": "joining gang"})
	jctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	gang := collective.Gang{Run: gangRun(key.workflowID), Generation: uint64(in.Generation), Peers: in.Peers}
	// Every peer's worker listened before it granted its slot: an address
	// that refuses connections is a worker gone (killed before its rank
	// joined), and one that answers no connection attempt at all is a host
	// cut off, both of which the gang learns now rather than at its hold's
	// heartbeat timeout. Twice the stall timeout leaves room for a lost
	// SYN's retransmission (1 s).
	stall := stallTimeout(in.Spec)
	opts := collective.Options{Secret: in.Secret, StallTimeout: stall, Transport: a.Transport, Logger: a.Log,
		RefusedTimeout: stall / 4, UnreachableTimeout: 2 * stall}
	if in.Secret == nil {
		if err := a.verifyGrants(key.workflowID, in); err != nil {
			rep.close()
			return nil, nil, err
		}
		sk := a.slots.key(in.Slot, key.workflowID)
		if sk == nil {
			rep.close()
			return nil, nil, fmt.Errorf("worker %s: slot %d is not held by workflow %s: its hold ended before the epoch began", a.Identity, in.Slot, key.workflowID)
		}
		gang.PublicKeys, opts.Identity = in.PublicKeys, sk.private
	}
	jctx, span := tracer.Start(jctx, "gang.join", trace.WithAttributes(attribute.String("run", in.Run), attribute.Int("rank", in.Rank),
		attribute.Int("generation", in.Generation), attribute.Int("world", len(in.Peers))))
	if in.Spec.Scaling.Hierarchical() && place.LocalWorld > 1 {
		rep.group, err = a.joinHost(jctx, key, in, place, gang, opts)
	} else {
		opts.GatherBytes = gatherBytes(in.SmallAllReduceBytes, len(in.Peers))
		opts.GatherLinks = in.GatherLinks
		opts.HostWindows = in.HostWindows
		opts.OnFailure = a.stallWatch(ctx, in, place)
		var g *collective.Group
		// Set only on success: a nil *Group in the interface is not a nil
		// interface, and rep.close would close it (a panic, 2026-11-24).
		if g, err = collective.Join(jctx, a.Listener, gang, in.Rank, opts); err == nil {
			rep.group = g
		}
	}
	endSpan(span, err)
	if err != nil {
		rep.close()
		return nil, nil, err
	}
	rep.metrics = newRankMetrics(ctx, in.Run, in.Rank)
	if in.Rank == 0 {
		rep.events = &epochEvents{epoch: -1}
	}
	rep.tr, err = backend.NewRank(ctx, trainer.Rank{Spec: in.Spec, Run: in.Run, Generation: in.Generation, Rank: in.Rank,
		Peers: in.Peers, Local: place, BatchSize: in.BatchSize, Comm: metered(rep.group, rep.metrics), Device: a.device(in.Slot), Scratch: rep.scratch,
		PythonPath: a.PythonPath, Log: a.Log, Environ: a.Policy.Environ(), MemoryLimit: a.Policy.RankMemory(len(a.Slots)), Data: func(ctx context.Context) (*dataset.Set, *dataset.Set, error) {
			beat.set(map[string]any{"phase": "loading data"})
			return a.dataset(ctx, in.Spec.Dataset)
		}})
	if err != nil {
		rep.close()
		return nil, nil, err
	}
	_, snapshots := rep.tr.(trainer.Snapshotter)
	rep.peerRecovery = snapshots && in.Spec.Failure.PeersRecover() && !in.Spec.Checkpoint.Sharded
	beat.set(map[string]any{"phase": "restoring"})
	report, err := a.restore(ctx, rep, in)
	if err != nil {
		rep.close()
		return nil, nil, err
	}
	a.reportRestored(ctx, in, report)
	a.replicas.put(key, rep)
	return rep, report, nil
}

// hostKey names the local ranks of one host of one gang generation.
type hostKey struct {
	workflowID string
	generation int
	first      int // the host's first rank
}

// hostTable holds the hosts (collective.Host) this worker's local ranks
// reduce through; a host leaves the table when it fails or all its ranks close.
type hostTable struct {
	mu sync.Mutex
	m  map[hostKey]*collective.Host
}

// view is local rank l's view of the host k, from the host its siblings
// joined, or from a new one when there is none yet or the old one failed
// or already gave this rank its view (a rank joining the gang again).
func (t *hostTable) view(k hostKey, l, n, world int) (*collective.Host, *collective.HostRank, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h := t.m[k]; h != nil {
		if v, ok := h.Claim(l); ok {
			return h, v, nil
		}
	}
	h, err := collective.NewHost(k.first, n, world)
	if err != nil {
		return nil, nil, err
	}
	v, _ := h.Claim(l)
	if t.m == nil {
		t.m = map[hostKey]*collective.Host{}
	}
	t.m[k] = h
	go func() {
		<-h.Done()
		t.mu.Lock()
		if t.m[k] == h {
			delete(t.m, k)
		}
		t.mu.Unlock()
	}()
	return h, v, nil
}

// joinHost makes the rank a member of its gang through its host: the ranks
// of the host sum in memory, and the host joins the ring of hosts (named
// by each host's first rank's address and key) once for all of them.
func (a *Agent) joinHost(ctx context.Context, key replicaKey, in spec.EpochInput, place spec.LocalPlace, gang collective.Gang, opts collective.Options) (gangMember, error) {
	n, world := place.LocalWorld, len(in.Peers)
	h, v, err := a.hosts.view(hostKey{key.workflowID, key.generation, in.Rank - place.LocalRank}, place.LocalRank, n, world)
	if err != nil {
		return nil, err
	}
	ring := collective.Gang{Run: gang.Run + "/hosts", Generation: gang.Generation, Peers: make([]string, world/n)}
	if gang.PublicKeys != nil {
		ring.PublicKeys = make([][]byte, world/n)
	}
	for i := range ring.Peers {
		ring.Peers[i] = in.Peers[i*n]
		if ring.PublicKeys != nil {
			ring.PublicKeys[i] = gang.PublicKeys[i*n]
		}
	}
	// The host ring's small all-reduces gather as a flat gang's do, among
	// the hosts (the same sums: the gather sums in the ring's order).
	opts.GatherBytes = gatherBytes(in.SmallAllReduceBytes, len(ring.Peers))
	opts.GatherLinks = in.GatherLinks
	// The host tells the watch its ring's failure with hosts named by
	// their first rank in the gang: this host's rank declared stalled is
	// one of its own ranks, as stallHeard wants. Only the local rank that
	// joins the ring first sets it; every local rank is of the same run.
	opts.OnFailure = a.stallWatch(ctx, in, place)
	if err := h.Join(ctx, a.Listener, ring, opts); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// gangRun names a workflow's gang in the collective's handshake, which
// carries at most 255 bytes: a workflow ID may have up to 1,000. A long ID
// is cut and followed by a digest of the whole, so two IDs that share their
// first bytes still name two gangs.
func gangRun(workflowID string) string {
	const keep = 200
	if len(workflowID) <= keep+17 {
		return workflowID
	}
	sum := sha256.Sum256([]byte(workflowID))
	return workflowID[:keep] + "~" + hex.EncodeToString(sum[:8])
}

// fileSafe is s as a short file name part: letters, digits, ., _ and -.
func fileSafe(s string) string {
	b := []byte(s)
	if len(b) > 64 {
		b = b[:64]
	}
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	return string(b)
}

// maxGatherBytes bounds what one rank gathers in a small all-reduce: past
// it the ring's bytes beat the gather's fewer steps.
const maxGatherBytes = 64 << 10

// gatherBytes is collective.Options.GatherBytes for a gang of world ranks
// whose run asked for all-reduces of at most perRank bytes to gather: what
// a rank receives gathering them, at most maxGatherBytes (0: never).
func gatherBytes(perRank, world int) int {
	if perRank <= 0 || world < 2 {
		return 0
	}
	return min(perRank, maxGatherBytes/(world-1)) * (world - 1)
}
