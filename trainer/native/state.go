package native

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"runtime"
	"slices"
	"sync"
	"unsafe"
	"weak"

	"github.com/durabletrain/durabletrain/trainer"
)

// StateObject is the one object the native backend saves its state in.
const StateObject = "native-state.bin"

// stateMagic opens a native state; the last byte is the format version.
var stateMagic = [8]byte{'D', 'T', 'N', 'A', 'T', 'I', 'V', 1}

// Save writes magic, the config as JSON, the cursor, the optimizer's step
// count, then the parameters and each optimizer buffer as little-endian
// float32 vectors with their lengths. The same state always gives the same bytes.
func (t *Trainer) Save(ctx context.Context, to trainer.StateWriter) error {
	w, err := to.Create(ctx, StateObject)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	head, vectors := t.stateLayout()
	bw.Write(head)
	for _, v := range vectors {
		bw.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(v))))
		bw.Write(floatBytes(v))
	}
	return errors.Join(bw.Flush(), w.Close())
}

// Snapshot copies the state, the same bytes Save writes: the time it takes
// is what a checkpoint written in the background costs training. A large
// state is copied by several goroutines at once (parallelCopy): training
// waits for the copy either way, and one core does not reach the memory's
// bandwidth.
func (t *Trainer) Snapshot(context.Context) (trainer.MemState, error) {
	head, vectors := t.stateLayout()
	size := len(head)
	for _, v := range vectors {
		size += 8 + 4*len(v)
	}
	b := t.snapshots.take(size)[:size]
	off := copy(b, head)
	var copies []byteCopy
	for _, v := range vectors {
		binary.LittleEndian.PutUint64(b[off:], uint64(len(v)))
		off += 8
		src := floatBytes(v)
		copies = append(copies, byteCopy{dst: b[off : off+len(src)], src: src})
		off += len(src)
	}
	parallelCopy(copies, min(runtime.GOMAXPROCS(0), maxSnapshotCopiers))
	m := trainer.MemState{StateObject: b}
	t.snapshots.lent(m, b)
	return m, nil
}

// byteCopy is one copy of src into dst, which has its length.
type byteCopy struct{ dst, src []byte }

// maxSnapshotCopiers bounds the goroutines of one snapshot's copy. On a
// 2-core Intel VM two copied 1 GiB in about half the time of one (73-94 ms
// against 139-188; BENCHMARKS.md); a host's ranks snapshot at the same step,
// so more would mostly contend for the same memory.
const maxSnapshotCopiers = 4

// parallelCopyMin is the least a copier is given: below it, starting a
// goroutine costs more than it saves.
const parallelCopyMin = 16 << 20

// parallelCopy does copies with up to k goroutines (the caller's among
// them), each taking an equal share of the bytes.
func parallelCopy(copies []byteCopy, k int) {
	total := 0
	for _, c := range copies {
		total += len(c.src)
	}
	k = max(1, min(k, total/parallelCopyMin))
	if k == 1 {
		for _, c := range copies {
			copy(c.dst, c.src)
		}
		return
	}
	// Share i is bytes [i*total/k, (i+1)*total/k) of the copies laid end to end.
	share := func(i int) {
		lo, hi := i*total/k, (i+1)*total/k
		at := 0 // where the current copy starts, end to end
		for _, c := range copies {
			n := len(c.src)
			if a, z := max(lo, at), min(hi, at+n); a < z {
				copy(c.dst[a-at:z-at], c.src[a-at:z-at])
			}
			at += n
		}
	}
	var wg sync.WaitGroup
	for i := 1; i < k; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			share(i)
		}()
	}
	share(0)
	wg.Wait()
}

// Recycle takes back a snapshot's memory for the next Snapshot to copy into.
func (t *Trainer) Recycle(m trainer.MemState) { t.snapshots.give(m, m[StateObject]) }

// snapshotMemory is the memory of the snapshots a trainer has lent out
// and of the one handed back: the next snapshot copies into that one when
// it is large enough. It keeps one spare: a background checkpoint hands
// its snapshot back before the next is taken (checkpoint.async waits for
// the previous save first).
type snapshotMemory struct {
	mu    sync.Mutex
	spare []byte
	// out is the latest snapshots lent out and not handed back. A snapshot
	// is its map and its memory: a later snapshot may reuse the memory,
	// never the map, so a snapshot handed back twice is told from the one
	// that reuses its memory. Both weakly: a snapshot its caller keeps, or
	// drops without handing it back, is the caller's to keep or the
	// collector's to free.
	out  [lentKept]lentSnapshot
	next int
}

type lentSnapshot struct {
	state uintptr // the MemState map's address; with data, not alone: it may be reused once the map is freed
	data  weak.Pointer[byte]
}

// lentKept is how many of the latest snapshots lent out can be handed back.
const lentKept = 4

// take is an empty buffer of at least size bytes' capacity: the spare, or a new one.
func (s *snapshotMemory) take(size int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b := s.spare; cap(b) >= size {
		s.spare = nil
		return b[:0]
	}
	return make([]byte, 0, size)
}

// lent records m, whose memory is b, as out with the caller.
func (s *snapshotMemory) lent(m trainer.MemState, b []byte) {
	if cap(b) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.out[s.next] = lentSnapshot{stateAddr(m), weak.Make(unsafe.SliceData(b[:1]))}
	s.next = (s.next + 1) % lentKept
}

// give takes b, the memory of m, back as the spare (the larger of the two,
// if there is one already), if m is one of the latest snapshots lent out.
func (s *snapshotMemory) give(m trainer.MemState, b []byte) {
	if cap(b) == 0 {
		return
	}
	key := lentSnapshot{stateAddr(m), weak.Make(unsafe.SliceData(b[:1]))}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, l := range s.out {
		if l == key {
			s.out[i] = lentSnapshot{}
			if cap(b) > cap(s.spare) {
				s.spare = b
			}
			return
		}
	}
	// Not ours, not among the latest, or handed back already.
}

// stateAddr is the address of m's map, which stays where it is while m lives.
func stateAddr(m trainer.MemState) uintptr { return uintptr(reflect.ValueOf(m).UnsafePointer()) }

// stateLayout is the state's header (through the vector count) and its vectors.
func (t *Trainer) stateLayout() ([]byte, [][]float32) {
	cfg, _ := json.Marshal(t.cfg)
	head := append([]byte(nil), stateMagic[:]...)
	head = binary.LittleEndian.AppendUint32(head, uint32(len(cfg)))
	head = append(head, cfg...)
	for _, v := range []int64{int64(t.cursor.Epoch), int64(t.cursor.Step), t.opt.steps()} {
		head = binary.LittleEndian.AppendUint64(head, uint64(v))
	}
	vectors := append([][]float32{t.model.params}, t.opt.buffers()...)
	head = binary.LittleEndian.AppendUint32(head, uint32(len(vectors)))
	return head, vectors
}

// Restore reads a state saved by Save. The architecture and optimizer must be
// this trainer's; other hyperparameters (learning rate, batch size) are taken
// from this trainer's config, so a run can resume with a changed schedule.
// Nothing changes unless the whole state reads and checks out.
func (t *Trainer) Restore(ctx context.Context, from trainer.StateReader) error {
	r, err := from.Open(ctx, StateObject)
	if err != nil {
		return fmt.Errorf("native trainer: opening %s: %w", StateObject, err)
	}
	defer r.Close()
	fail := func(format string, args ...any) error {
		return fmt.Errorf("native trainer: %s is not a usable state: %s", StateObject, fmt.Sprintf(format, args...))
	}
	br := bufio.NewReaderSize(r, 1<<20)
	var magic [8]byte
	if _, err := io.ReadFull(br, magic[:]); err != nil || magic != stateMagic {
		return fail("bad magic or format version %q", magic[:])
	}
	var n uint32
	if err := binary.Read(br, binary.LittleEndian, &n); err != nil || n > 1<<16 {
		return fail("bad config length")
	}
	raw := make([]byte, n)
	if _, err := io.ReadFull(br, raw); err != nil {
		return fail("truncated config")
	}
	var saved Config
	if err := json.Unmarshal(raw, &saved); err != nil {
		return fail("config: %v", err)
	}
	if !slices.Equal(saved.Hidden, t.cfg.Hidden) || saved.Optimizer != t.cfg.Optimizer {
		return fmt.Errorf("native trainer: the checkpoint holds model.hidden=%v with optimizer %q, but this run has model.hidden=%v with %q; resume with the same model and optimizer",
			saved.Hidden, saved.Optimizer, t.cfg.Hidden, t.cfg.Optimizer)
	}
	var counters [3]int64
	if err := binary.Read(br, binary.LittleEndian, &counters); err != nil {
		return fail("truncated cursor")
	}
	var count uint32
	if err := binary.Read(br, binary.LittleEndian, &count); err != nil {
		return fail("truncated vector count")
	}
	opt := newOptimizer(t.cfg, len(t.model.params))
	want := append([][]float32{make([]float32, len(t.model.params))}, opt.buffers()...)
	if int(count) != len(want) {
		return fail("%d vectors, want %d", count, len(want))
	}
	for i, v := range want {
		var l uint64
		if err := binary.Read(br, binary.LittleEndian, &l); err != nil || l != uint64(len(v)) {
			return fail("vector %d has length %d, want %d", i, l, len(v))
		}
		if _, err := io.ReadFull(br, floatBytes(v)); err != nil {
			return fmt.Errorf("native trainer: %s: vector %d: %w", StateObject, i, err)
		}
	}
	// Read to the end: a verifying reader reports corruption there, in place of io.EOF.
	if extra, err := br.Read(make([]byte, 1)); extra != 0 {
		return fail("data after the last vector")
	} else if err != io.EOF {
		return fmt.Errorf("native trainer: reading %s: %w", StateObject, err)
	}
	if counters[0] < 0 || counters[1] < 0 || counters[2] < 0 {
		return fail("negative cursor %v", counters)
	}
	copy(t.model.params, want[0])
	opt.setSteps(counters[2])
	t.opt = opt
	t.cursor = trainer.Cursor{Epoch: int(counters[0]), Step: int(counters[1])}
	return nil
}

// floatBytes views a float32 slice as its little-endian bytes (no copy).
func floatBytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}
