package activities

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"
	"go.temporal.io/sdk/activity"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Recovery from survivors' memory (failure.recover_from_peers). When a gang
// breaks (a rank killed, stopped or cut off), every other rank's state is
// still the state after the last step the whole gang completed: a step
// changes the weights only after its all-reduce succeeded. Each surviving
// rank whose backend can copy its state (trainer.Snapshotter) keeps that
// copy on its worker, keyed by the run's workflow execution. The next gang agrees in
// one all-reduce on the newest state any of its ranks holds; if that is at
// least as new as the run's latest checkpoint, its holder broadcasts it
// over the gang's collective with its digest (stateDigest), every rank checks and
// restores it, and nothing is read from storage. Otherwise, or if any rank
// cannot restore it, the whole gang restores from storage as before.

// stateDigest is what a survivor's state is checked with after the
// broadcast: its XXH3-128 checksum in the first 16 bytes of the payload's
// 32-byte digest slot, the rest zero. It guards against damage on the way;
// a rank of the gang could send any state with a matching digest of any
// kind. BLAKE3 before 0.6 took about a third of a second a GB on each side
// of a recovery; XXH3-128 takes about a hundredth (checkpoint/hashlist.go).
// A gang mixing the two releases finds the digests differ and restores
// from storage.
func stateDigest(state []byte) [32]byte {
	var d [32]byte
	c := xxh3.Hash128(state).Bytes()
	copy(d[:], c[:])
	return d
}

// survivorTTL is how long a worker keeps a survivor's state for a gang that
// may never come; maxSurvivors how many runs' states at most (the oldest go first).
const (
	survivorTTL  = 10 * time.Minute
	maxSurvivors = 16
)

// survivor is one rank's position, and its state, kept after its gang broke.
type survivor struct {
	cursor trainer.Cursor
	state  []byte // encodeState's; nil where the run or the backend does not recover from peers
	// payload, if set, is the broadcast buffer state lies in (packState): the
	// donor sends it as kept, without another copy.
	payload []float32
	kept    time.Time
}

// survivorTable holds, per run execution (survivorKey), the newest
// survivor's state on this worker (the ranks of one gang hold the same
// state at the same step).
type survivorTable struct {
	mu sync.Mutex
	m  map[string]*survivor
}

// keep records s for the workflow unless a newer one is kept already.
func (t *survivorTable) keep(workflowID string, s *survivor) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire()
	if t.m == nil {
		t.m = map[string]*survivor{}
	}
	if old := t.m[workflowID]; old == nil || cursorBefore(old.cursor, s.cursor) || old.cursor == s.cursor && old.state == nil {
		t.m[workflowID] = s
	}
	for len(t.m) > maxSurvivors {
		oldest := ""
		for id, s := range t.m {
			if oldest == "" || s.kept.Before(t.m[oldest].kept) {
				oldest = id
			}
		}
		delete(t.m, oldest)
	}
}

// take removes and returns the workflow's survivor, if any.
func (t *survivorTable) take(workflowID string) *survivor {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.expire()
	s := t.m[workflowID]
	delete(t.m, workflowID)
	return s
}

func (t *survivorTable) expire() {
	for id, s := range t.m {
		if time.Since(s.kept) > survivorTTL {
			delete(t.m, id)
		}
	}
}

func cursorBefore(a, b trainer.Cursor) bool {
	return a.Epoch < b.Epoch || a.Epoch == b.Epoch && a.Step < b.Step
}

// keepSurvivor keeps a failed rank's position, and a copy of its state
// for the next gang, when its failure leaves the state whole: not a user
// error (a diverged loss, a bad config) and not a worker that is going
// away. The position alone tells the next gang how many steps it trains
// again when it restores from storage.
func (a *Agent) keepSurvivor(ctx context.Context, rep *replica, err error) {
	if rep == nil || rep.tr == nil || errors.Is(err, trainer.ErrUser) {
		return
	}
	s := &survivor{cursor: rep.tr.Cursor(), kept: time.Now()}
	if snap, ok := rep.tr.(trainer.Snapshotter); ok && rep.peerRecovery {
		st, serr := snap.Snapshot(ctx)
		if serr != nil {
			a.Log.Warn("could not keep the survivor's state", zap.Error(serr))
		} else {
			s.payload, s.state = packState(st)
			a.Log.Info("kept this rank's state for the next gang", zap.Int("epoch", s.cursor.Epoch), zap.Int("step", s.cursor.Step), zap.Int("bytes", len(s.state)))
		}
	}
	a.survivors.keep(survivorKey(ctx), s)
}

// survivorKey names the run execution a survivor belongs to: its workflow
// ID and run ID. A workflow ID is reused by a later run of the same name,
// whose gang must never take this one's weights; after a continue-as-new
// the run ID changes too, and a gang there restores from storage.
func survivorKey(ctx context.Context) string {
	e := activity.GetInfo(ctx).WorkflowExecution
	return e.ID + "/" + e.RunID
}

// peerVote is what each rank tells the gang of what it kept: 1 and the
// state's cursor and size (in two exact float32 halves) if it holds a
// usable state; 1 and the cursor if it survived at all.
const peerVote = 8

// restoreFromPeers restores the gang from the newest state a survivor
// among its ranks holds, if that is at least as new as the run's latest
// checkpoint. Every rank calls it (it communicates); ok is the same on
// every rank: false means restore from storage. at is the newest position
// any survivor among the ranks had reached, if any survived.
func (a *Agent) restoreFromPeers(ctx context.Context, rep *replica, in spec.EpochInput) (_ *spec.RestoreReport, ok bool, at *spec.Position, err error) {
	if in.Restore == nil && !in.Resume {
		return nil, false, nil, nil // a fresh run, or one resumed from another run's checkpoint
	}
	mine := a.survivors.take(survivorKey(ctx))
	defer func() {
		// The new gang broke before it agreed (a rank killed while it
		// restores): what this rank kept is still the newest state, for
		// the gang after.
		if err != nil && mine != nil {
			a.survivors.keep(survivorKey(ctx), mine)
		}
	}()
	usable := mine != nil && mine.state != nil && rep.peerRecovery && mine.cursor.Epoch < in.Spec.Hyper.Epochs &&
		(in.Restore == nil || !cursorBefore(mine.cursor, trainer.Cursor{Epoch: in.Restore.Epoch, Step: in.Restore.Step})) &&
		mine.cursor.Epoch < 1<<24 && mine.cursor.Step < 1<<24 && len(mine.state) < 1<<47
	world := len(in.Peers)
	votes := make([]float32, peerVote*world)
	v := votes[peerVote*in.Rank:]
	if usable {
		v[0], v[1], v[2] = 1, float32(mine.cursor.Epoch), float32(mine.cursor.Step)
		v[3], v[4] = float32(len(mine.state)>>24), float32(len(mine.state)&(1<<24-1))
	}
	if mine != nil && mine.cursor.Epoch < 1<<24 && mine.cursor.Step < 1<<24 {
		v[5], v[6], v[7] = 1, float32(mine.cursor.Epoch), float32(mine.cursor.Step)
	}
	if err := rep.group.AllReduce(ctx, votes); err != nil {
		return nil, false, nil, fmt.Errorf("asking the gang for a survivor's state: %w", err)
	}
	donor := -1
	var best trainer.Cursor
	for r := range world {
		v := votes[peerVote*r:]
		c := trainer.Cursor{Epoch: int(v[1]), Step: int(v[2])}
		if v[0] == 1 && (donor < 0 || cursorBefore(best, c)) {
			donor, best = r, c
		}
		if s := (spec.Position{Epoch: int(v[6]), Step: int(v[7])}); v[5] == 1 && (at == nil || cursorBefore(trainer.Cursor(*at), trainer.Cursor(s))) {
			at = &s
		}
	}
	if donor < 0 {
		return nil, false, at, nil
	}
	v = votes[peerVote*donor:]
	size := int64(v[3])<<24 | int64(v[4])
	start := time.Now()
	var payload []float32 // the digest, then the state
	kept := in.Rank == donor && len(mine.payload) == payloadLen(size)
	if kept {
		payload = mine.payload
	} else {
		payload = make([]float32, payloadLen(size))
	}
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&payload[0])), 4*len(payload))
	if in.Rank == donor {
		sum := stateDigest(mine.state)
		copy(raw, sum[:])
		if !kept {
			copy(raw[32:], mine.state)
		}
	}
	if err := rep.group.Broadcast(ctx, payload, donor); err != nil {
		return nil, false, at, fmt.Errorf("receiving the survivor's state from rank %d: %w", donor, err)
	}
	state := raw[32 : 32+size]
	if sum := stateDigest(state); !slices.Equal(sum[:], raw[:32]) {
		err = fmt.Errorf("the state rank %d sent does not match its digest", donor)
	} else if st, derr := decodeState(state); derr != nil {
		err = derr
	} else {
		err = rep.tr.Restore(ctx, st)
	}
	done := []float32{1}
	if err != nil {
		done[0] = 0
		a.Log.Warn("could not restore the survivor's state; the gang restores from storage", zap.Int("rank", in.Rank), zap.Int("donor", donor), zap.Error(err))
		err = nil
	}
	if aerr := rep.group.AllReduce(ctx, done); aerr != nil {
		return nil, false, at, fmt.Errorf("agreeing on the survivor's state: %w", aerr)
	}
	if int(done[0]) != world {
		return nil, false, at, nil
	}
	rep.metrics.checkpoint("peer-restore", size, time.Since(start))
	a.Log.Info("restored from a survivor's memory, nothing read from storage", zap.String("run", in.Run), zap.Int("rank", in.Rank),
		zap.Int("donor", donor), zap.Int("epoch", best.Epoch), zap.Int("step", best.Step), zap.Int64("bytes", size), zap.Duration("took", time.Since(start)))
	return &spec.RestoreReport{Peer: &spec.PeerRestore{Rank: donor, Epoch: best.Epoch, Step: best.Step, Bytes: size}, SurvivorsAt: at}, true, at, nil
}

// encodeState packs a trainer's objects: for each, in name order, its
// name's length (uint32), name, data's length (uint64) and data.
func encodeState(st trainer.MemState) []byte {
	_, b := packState(st)
	return b
}

// packState encodes st (encodeState) straight into a broadcast buffer:
// room for the digest (32 bytes), then the state, in float32s. One copy of
// the state's bytes, into memory of its exact size: a survivor of a large
// model keeps it on the failure path, where fresh memory is slow to touch
// (0.4 GB/s on a virtual machine here) and a second copy would double it.
func packState(st trainer.MemState) (payload []float32, state []byte) {
	names := slices.Sorted(maps.Keys(st))
	var size int64
	for _, name := range names {
		size += 4 + int64(len(name)) + 8 + int64(len(st[name]))
	}
	payload = make([]float32, payloadLen(size))
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&payload[0])), 4*len(payload))
	b := raw[32 : 32 : 32+size]
	for _, name := range names {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(name)))
		b = append(b, name...)
		b = binary.LittleEndian.AppendUint64(b, uint64(len(st[name])))
		b = append(b, st[name]...)
	}
	if int64(len(b)) != size { // never: the size is exact, so b is still in payload
		return nil, b
	}
	return payload, b
}

// payloadLen is the float32s of a broadcast of a state of size bytes.
func payloadLen(size int64) int { return int(8 + (size+3)/4) }

func decodeState(b []byte) (trainer.MemState, error) {
	st := trainer.MemState{}
	for len(b) > 0 {
		if len(b) < 4 {
			return nil, errors.New("survivor's state: truncated name length")
		}
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if n > len(b) || len(b)-n < 8 {
			return nil, errors.New("survivor's state: truncated name")
		}
		name := string(b[:n])
		b = b[n:]
		l := binary.LittleEndian.Uint64(b)
		b = b[8:]
		if l > uint64(len(b)) {
			return nil, errors.New("survivor's state: truncated object")
		}
		st[name] = b[:l]
		b = b[l:]
	}
	return st, nil
}
