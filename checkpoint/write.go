package checkpoint

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/durabletrain/durabletrain/internal/blobwatch"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// Writer writes the objects of one checkpoint; Commit makes it exist.
type Writer struct {
	s           *Store
	run, id     string
	epoch, step int
	mu          sync.Mutex
	objects     map[string]*Object
	open        int
	failed      error
	shards      int // ranks whose parts AdoptShards took
	format      int // the manifest format it commits: FormatVersion, or a clone's source's
}

// Begin starts the checkpoint of run at cursor (epoch, step). A checkpoint
// already committed at the same cursor is uncommitted first (its manifest
// deleted), so a half-overwritten checkpoint can never verify.
func (s *Store) Begin(ctx context.Context, run string, epoch, step int) (*Writer, error) {
	if err := checkRun(run); err != nil {
		return nil, err
	}
	if epoch < 0 || step < 0 || epoch > 999999 || step > 999999999 {
		return nil, fmt.Errorf("checkpoint: cursor epoch %d step %d out of range", epoch, step)
	}
	id := ID(epoch, step)
	if err := s.bucket.Delete(ctx, prefix(run, id)+ManifestName); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return nil, fmt.Errorf("checkpoint: uncommitting the old %s/%s: %w", run, id, err)
	}
	return &Writer{s: s, run: run, id: id, epoch: epoch, step: step, objects: map[string]*Object{}, format: FormatVersion}, nil
}

// Create starts one object; its size and SHA-256 are taken as it is written,
// and on local disk it is fsynced before it is closed.
func (w *Writer) Create(ctx context.Context, name string) (io.WriteCloser, error) {
	if !ValidObjectName(name) {
		shown := name
		if len(shown) > 120 {
			shown = fmt.Sprintf("%s… (%d bytes)", shown[:120], len(name))
		}
		return nil, fmt.Errorf("checkpoint: object name %q; want slash-separated parts of letters, digits and ._=+@- (no \"..\"), at most %d bytes each and %d in all, not %s",
			shown, maxObjectNamePart, MaxObjectName, ManifestName)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, dup := w.objects[name]; dup {
		return nil, fmt.Errorf("checkpoint: object %q written twice", name)
	}
	sw, err := w.s.newSyncedWriter(ctx, prefix(w.run, w.id)+name, true)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: creating %s: %w", name, err)
	}
	buffers := writeBuffers
	if !sw.blocks {
		buffers-- // no block is on its way to a local file: the caller's bytes went to storage already
	}
	obj := &Object{Name: name}
	check := blockCheck{algo: w.algo()}
	if check.algo == hashXXH3 && w.s.key != nil {
		obj.MACNonce = newMACNonce()
		if check.mac, err = objectMAC(w.s.key, obj.MACNonce); err != nil {
			sw.Close(err)
			return nil, fmt.Errorf("checkpoint: creating %s: %w", name, err)
		}
	}
	ow := &objectWriter{w: w, obj: obj, hashes: newHashList(check), sw: sw, free: make(chan []byte, buffers)}
	ow.block = ow.nextBuffer()
	w.objects[name] = ow.obj
	w.open++
	return ow, nil
}

// syncedWriter is a blob writer that, on local disk, fsyncs the data before
// the close that publishes it (fileblob writes a temporary file and renames it).
// An object's writer (blocks) writes whole blocks at their offsets instead,
// with O_DIRECT where the file system takes it (fileio.go).
type syncedWriter struct {
	bw     *blobwatch.Writer
	file   *os.File
	cancel context.CancelFunc

	blocks bool        // writeBlock writes straight to file; Write is not used
	direct atomic.Bool // file is open with O_DIRECT
	size   int64       // the object's size, for Close: a direct write pads the last block
	mu     sync.Mutex
	failed error // the first block that could not be written
}

// newSyncedWriter starts the object key. With blocks, a local file is
// written by writeBlock, directly where the file system allows it.
func (s *Store) newSyncedWriter(ctx context.Context, key string, blocks bool) (*syncedWriter, error) {
	ctx, cancel := context.WithCancel(ctx)
	sw := &syncedWriter{cancel: cancel}
	bw, err := s.bucket.NewWriter(ctx, key, &blob.WriterOptions{
		ContentType: "application/octet-stream", // no content sniffing: writes go straight through
		BeforeWrite: func(as func(any) bool) error {
			as(&sw.file) // only file:// has one
			return nil
		},
	})
	if err != nil {
		cancel()
		return nil, err
	}
	sw.bw = bw
	if blocks && sw.file != nil {
		sw.blocks = true
		if s.directIO && canDirect(sw.file) && setDirect(sw.file, true) == nil {
			sw.direct.Store(true)
		}
	}
	return sw, nil
}

// Write writes p through the blob writer: objects of stores without a
// local file, and a checkpoint's small files (manifest, shard lists).
func (sw *syncedWriter) Write(p []byte) (int, error) { return sw.bw.Write(p) }

// writeBlock writes b at off, from any goroutine. A direct write of a last
// block that does not fill the alignment is padded with zeros (b's capacity
// is a whole aligned block), and Close cuts the file to its size. A file
// system that refuses a direct write gets this one and the rest through the
// page cache.
func (sw *syncedWriter) writeBlock(b []byte, off int64) {
	if len(b) == 0 {
		return
	}
	err := sw.writeDirect(b, off)
	if errors.Is(err, errNotDirect) {
		if _, err = sw.file.WriteAt(b, off); err == nil {
			startWriteback(sw.file, off, int64(len(b)))
		}
	}
	if err != nil {
		sw.mu.Lock()
		sw.failed = cmp.Or(sw.failed, err)
		sw.mu.Unlock()
	}
}

// errNotDirect says a block is to be written through the page cache.
var errNotDirect = errors.New("not direct")

// writeDirect writes b at off with O_DIRECT, padded to the alignment. It
// returns errNotDirect if the file is not direct, or if the file system
// refused the write (which turns direct I/O off for the rest).
func (sw *syncedWriter) writeDirect(b []byte, off int64) error {
	if !sw.direct.Load() || cap(b) < roundUp(len(b), directAlign) {
		return errNotDirect
	}
	padded := b[:roundUp(len(b), directAlign)]
	clear(padded[len(b):])
	_, err := sw.file.WriteAt(padded, off)
	if err == nil || !isDirectRefused(err) {
		return err
	}
	sw.direct.Store(false)
	if err := setDirect(sw.file, false); err != nil {
		return err
	}
	return errNotDirect
}

// err is the first block write that failed.
func (sw *syncedWriter) err() error {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	return sw.failed
}

// Close publishes the object; after a failed write it discards it instead.
func (sw *syncedWriter) Close(failed error) error {
	if sw.blocks {
		failed = cmp.Or(failed, sw.err())
		if failed == nil {
			failed = sw.file.Truncate(sw.size) // the last direct block's padding
		}
	}
	if failed == nil && sw.file != nil {
		failed = sw.file.Sync()
	}
	if failed != nil {
		sw.cancel() // a blob.Writer whose context is cancelled discards the object on Close
	}
	err := sw.bw.Close()
	sw.cancel()
	return errors.Join(failed, err)
}

func (w *Writer) algo() hashAlgo {
	a, _ := algoOf(w.format)
	return a
}

// Commit writes the manifest, after every object is closed: from then on the
// checkpoint exists.
func (w *Writer) Commit(ctx context.Context, info Info) (Manifest, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.failed != nil:
		return Manifest{}, fmt.Errorf("checkpoint: not committing %s/%s: %w", w.run, w.id, w.failed)
	case w.open > 0:
		return Manifest{}, fmt.Errorf("checkpoint: not committing %s/%s: %d objects still open", w.run, w.id, w.open)
	case len(w.objects) == 0:
		return Manifest{}, fmt.Errorf("checkpoint: not committing %s/%s: no objects were written", w.run, w.id)
	}
	m := Manifest{
		Format: w.format, Run: w.run, ID: w.id, Epoch: w.epoch, Step: w.step,
		WorldSize: info.WorldSize, Shards: max(w.shards, info.Shards), Metrics: info.Metrics, Meta: info.Meta,
		Created: time.Now().UTC().Truncate(time.Millisecond),
	}
	for _, o := range w.objects {
		m.Objects = append(m.Objects, *o)
	}
	slices.SortFunc(m.Objects, func(a, b Object) int { return strings.Compare(a.Name, b.Name) })
	if w.s.key != nil {
		m.KeyID = KeyID(w.s.key)
	}
	m.Checksum = m.checksum()
	if w.s.key != nil {
		m.Signature = signature(w.s.key, m.Checksum)
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Manifest{}, err
	}
	if len(data) > MaxManifestBytes {
		// Committed, it would be a checkpoint no restore reads: the run would
		// count on a checkpoint it does not have.
		return Manifest{}, fmt.Errorf("checkpoint: not committing %s/%s: its manifest would be %d bytes for %d objects; a restore reads at most %d (MaxManifestBytes): write fewer objects",
			w.run, w.id, len(data), len(m.Objects), MaxManifestBytes)
	}
	sw, err := w.s.newSyncedWriter(ctx, prefix(w.run, w.id)+ManifestName, false)
	if err == nil {
		_, err = sw.Write(data)
		err = sw.Close(err)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("checkpoint: committing %s/%s: %w", w.run, w.id, err)
	}
	return m, nil
}

// Abort removes the objects the writer wrote, for a checkpoint that will
// not be committed: call it instead of Commit, or after Commit failed (it
// then wrote no manifest). A failed save so leaves nothing behind to hold
// the space the next save needs: on a full disk, the objects of the save
// that failed would fail the next one too. It removes no manifest, and no
// object but the writer's own and those AdoptShards took (their checkpoint
// fails with this one). A cancelled ctx still gets abortTimeout to clean up:
// a save is often failed by its activity's cancellation.
func (w *Writer) Abort(ctx context.Context) error {
	w.mu.Lock()
	keys := make([]string, 0, len(w.objects))
	for name := range w.objects {
		keys = append(keys, prefix(w.run, w.id)+name)
	}
	w.mu.Unlock()
	return w.s.deleteKeys(ctx, keys)
}

// deleteKeys deletes keys, each that exists, for at most abortTimeout,
// whether or not ctx is cancelled.
func (s *Store) deleteKeys(ctx context.Context, keys []string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abortTimeout)
	defer cancel()
	var errs []error
	for _, key := range keys {
		if err := s.bucket.Delete(ctx, key); err != nil && gcerrors.Code(err) != gcerrors.NotFound {
			errs = append(errs, fmt.Errorf("checkpoint: removing %s of a failed save: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

// abortTimeout bounds the cleanup of a failed save.
const abortTimeout = 30 * time.Second
