package checkpoint

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// ErrNoCheckpoint is returned when a run has no checkpoint that verifies.
var ErrNoCheckpoint = errors.New("no verified checkpoint")

// CorruptError says a checkpoint's manifest or one of its objects does not
// verify. Readers return it (wrapped) in place of io.EOF.
type CorruptError struct {
	Run, ID string
	Reason  string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("checkpoint %s/%s is corrupt: %s", e.Run, e.ID, e.Reason)
}

// Checkpoint is a verified checkpoint, ready to be read.
type Checkpoint struct {
	Manifest Manifest
	// Skipped lists the newer checkpoints LatestVerified passed over, newest first.
	Skipped []Skip
	s       *Store
	read    *atomic.Int64 // BytesRead
}

// BytesRead is what this checkpoint has read from storage so far: its
// manifest and every range read of its objects (read-ahead included). For
// one that LatestVerified or RestoreLatest returned, it also counts the
// newer checkpoints they read and passed over, and LatestVerified's
// verification: what finding and loading the state cost in all.
func (c *Checkpoint) BytesRead() int64 {
	if c.read == nil {
		return 0
	}
	return c.read.Load()
}

// Skip says why a checkpoint was not used.
type Skip struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// Ref is what travels through Temporal instead of the state itself.
type Ref struct {
	URL string `json:"url"`
	Run string `json:"run"`
	ID  string `json:"id"`
}

// Ref points at this checkpoint.
func (c *Checkpoint) Ref() Ref { return Ref{URL: c.s.url, Run: c.Manifest.Run, ID: c.Manifest.ID} }

// IDs lists the checkpoint folders of a run, committed or not, oldest first.
// A listing that trips over an object a concurrent writer renamed or
// removed under it (a local directory's temporary files) is made again.
func (s *Store) IDs(ctx context.Context, run string) ([]string, error) {
	if err := checkRun(run); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		ids, err := s.ids(ctx, run)
		if err == nil || gcerrors.Code(err) != gcerrors.NotFound || attempt == 5 {
			return ids, err
		}
		select {
		case <-time.After(time.Duration(attempt) * 20 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *Store) ids(ctx context.Context, run string) ([]string, error) {
	var ids []string
	it := s.bucket.List(&blob.ListOptions{Prefix: run + "/", Delimiter: "/"})
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("checkpoint: listing %s: %w", run, err)
		}
		id := strings.TrimSuffix(strings.TrimPrefix(obj.Key, run+"/"), "/")
		if obj.IsDir && idPattern.MatchString(id) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// MaxManifestBytes bounds what a worker reads of a manifest (about 100,000
// objects): a huge one is damage or an attack, never loaded.
const MaxManifestBytes = 16 << 20

// readManifest reads and checks a manifest without touching the objects,
// adding the bytes it read to read (if not nil), whether or not it checks.
func (s *Store) readManifest(ctx context.Context, run, id string, read *atomic.Int64) (Manifest, error) {
	m, data, err := s.manifest(ctx, run, id)
	if read != nil {
		read.Add(int64(len(data)))
	}
	return m, err
}

// errUncommitted says a checkpoint folder has no manifest: a write that
// never committed (or one being written).
var errUncommitted = errors.New("no manifest: the checkpoint was never committed")

// damaged says whether err is about the checkpoint itself (it was never
// committed, or it does not verify), with the reason, rather than about
// the store, which failed to answer (a 503, a reset connection, a stall,
// a refused credential): the store's failures say nothing of a checkpoint,
// so no checkpoint is passed over or deleted for one.
func damaged(err error) (reason string, ok bool) {
	var corrupt *CorruptError
	switch {
	case errors.As(err, &corrupt):
		return corrupt.Reason, true
	case errors.Is(err, errUncommitted):
		return errUncommitted.Error(), true
	}
	return "", false
}

// manifest reads and checks a manifest: an error is errUncommitted, a
// *CorruptError, or the store's.
func (s *Store) manifest(ctx context.Context, run, id string) (m Manifest, data []byte, err error) {
	r, err := s.bucket.NewReader(ctx, prefix(run, id)+ManifestName, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return m, nil, errUncommitted
		}
		return m, nil, fmt.Errorf("checkpoint %s/%s: reading the manifest: %w", run, id, err)
	}
	defer r.Close()
	bad := func(format string, args ...any) error {
		return &CorruptError{Run: run, ID: id, Reason: fmt.Sprintf(format, args...)}
	}
	if r.Size() > MaxManifestBytes {
		return m, nil, bad("manifest of %d bytes; a manifest is at most %d", r.Size(), MaxManifestBytes)
	}
	data, err = io.ReadAll(io.LimitReader(r, MaxManifestBytes+1))
	if err != nil {
		return m, data, fmt.Errorf("checkpoint %s/%s: reading the manifest: %w", run, id, err)
	}
	if len(data) > MaxManifestBytes {
		return m, data, bad("manifest of more than %d bytes", MaxManifestBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return m, data, bad("manifest is not valid JSON: %v", err)
	}
	switch {
	case !knownFormat(m.Format):
		return m, data, bad("manifest format %d; this version reads formats 1 to %d", m.Format, FormatVersion)
	case m.Checksum != m.checksum():
		return m, data, bad("manifest checksum mismatch: the manifest was altered or damaged")
	case s.checkSignature(m) != nil:
		return m, data, bad("%v", s.checkSignature(m))
	case m.Run != run || m.ID != id:
		return m, data, bad("manifest names %s/%s but lies at %s/%s", m.Run, m.ID, run, id)
	case len(m.Objects) == 0:
		return m, data, bad("manifest lists no objects")
	}
	algo, _ := algoOf(m.Format)
	for _, o := range m.Objects {
		if !o.hashIs(algo) {
			return m, data, bad("object %s has no %s hash, which a format %d manifest gives every object", o.Name, algo, m.Format)
		}
		if o.lacksMAC(algo, s.key) {
			return m, data, bad("object %s has no MAC, which a format %d manifest signed with the pool key gives every object", o.Name, m.Format)
		}
	}
	return m, data, nil
}

func knownFormat(f int) bool {
	_, ok := algoOf(f)
	return ok && f <= FormatVersion
}

// Verify checks a checkpoint's manifest, then the size and hash of every object.
func (s *Store) Verify(ctx context.Context, run, id string) (*Checkpoint, error) {
	return s.verify(ctx, run, id, new(atomic.Int64))
}

// verify is Verify, counting what it reads in read.
func (s *Store) verify(ctx context.Context, run, id string, read *atomic.Int64) (*Checkpoint, error) {
	m, err := s.readManifest(ctx, run, id, read)
	if err != nil {
		return nil, err
	}
	c := &Checkpoint{Manifest: m, s: s, read: read}
	for _, o := range m.Objects {
		r, err := c.Open(ctx, o.Name)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, r)
		r.Close()
		if err != nil {
			return nil, err
		}
	}
	return c, nil
}

// LatestVerified returns the newest checkpoint of run that verifies, logging
// each newer one it skips and why (also in Checkpoint.Skipped). With none, the
// error wraps ErrNoCheckpoint and lists the reasons.
func (s *Store) LatestVerified(ctx context.Context, run string) (*Checkpoint, error) {
	ids, err := s.IDs(ctx, run)
	if err != nil {
		return nil, err
	}
	var skipped []Skip
	read := new(atomic.Int64) // by every checkpoint tried
	for _, id := range slices.Backward(ids) {
		c, err := s.verify(ctx, run, id, read)
		if err == nil {
			c.Skipped = skipped
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		reason, ok := damaged(err)
		if !ok {
			return nil, fmt.Errorf("checkpoint: run %s in %s: %w", run, s.url, err)
		}
		s.log.Warn("checkpoint skipped", zap.String("run", run), zap.String("id", id), zap.String("reason", reason))
		skipped = append(skipped, Skip{ID: id, Reason: reason})
	}
	if len(skipped) == 0 {
		return nil, fmt.Errorf("checkpoint: run %s in %s: %w (it has none)", run, s.url, ErrNoCheckpoint)
	}
	return nil, fmt.Errorf("checkpoint: run %s in %s: %w among %d: %v", run, s.url, ErrNoCheckpoint, len(skipped), skipped)
}

// RestoreLatest hands the newest committed checkpoint of run to load, which
// reads it through Checkpoint.Open (verifying as it streams) and must keep
// nothing unless it returns nil, as trainer.Trainer.Restore promises. If load
// fails with a *CorruptError, the checkpoint is skipped (logged, and listed in
// Skipped) and the next older one is tried; any other error is returned as is.
// One read of the data instead of LatestVerified's two.
func (s *Store) RestoreLatest(ctx context.Context, run string, load func(*Checkpoint) error) (*Checkpoint, error) {
	ids, err := s.IDs(ctx, run)
	if err != nil {
		return nil, err
	}
	var skipped []Skip
	skip := func(id, reason string) {
		s.log.Warn("checkpoint skipped", zap.String("run", run), zap.String("id", id), zap.String("reason", reason))
		skipped = append(skipped, Skip{ID: id, Reason: reason})
	}
	read := new(atomic.Int64) // by every checkpoint tried
	for _, id := range slices.Backward(ids) {
		m, err := s.readManifest(ctx, run, id, read)
		if err == nil {
			c := &Checkpoint{Manifest: m, s: s, read: read}
			if err = load(c); err == nil {
				c.Skipped = skipped
				return c, nil
			}
		}
		reason, ok := damaged(err)
		if !ok {
			return nil, err
		}
		skip(id, reason)
	}
	if len(skipped) == 0 {
		return nil, fmt.Errorf("checkpoint: run %s in %s: %w (it has none)", run, s.url, ErrNoCheckpoint)
	}
	return nil, fmt.Errorf("checkpoint: run %s in %s: %w among %d: %v", run, s.url, ErrNoCheckpoint, len(skipped), skipped)
}

// Get verifies and returns the checkpoint a Ref points at.
func (s *Store) Get(ctx context.Context, ref Ref) (*Checkpoint, error) {
	if err := checkRun(ref.Run); err != nil {
		return nil, err
	}
	c, err := s.Verify(ctx, ref.Run, ref.ID)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s/%s: %w", ref.Run, ref.ID, err)
	}
	return c, nil
}

// Open reads one object, verifying it as it goes: reading to the end returns
// an error instead of io.EOF if its size or hash differs from the manifest.
// Blocks are read ahead by concurrent range reads (readStreams), each
// verified as it arrives, and handed out in order.
func (c *Checkpoint) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	i := slices.IndexFunc(c.Manifest.Objects, func(o Object) bool { return o.Name == name })
	if i < 0 {
		return nil, fmt.Errorf("checkpoint %s/%s has no object %q", c.Manifest.Run, c.Manifest.ID, name)
	}
	o := c.Manifest.Objects[i]
	key := prefix(c.Manifest.Run, c.Manifest.ID) + name
	attrs, err := c.s.bucket.Attributes(ctx, key)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return nil, c.corrupt("object %s is missing", name)
		}
		return nil, fmt.Errorf("opening object %s: %w", name, err)
	}
	if attrs.Size != o.Size {
		return nil, c.corrupt("object %s has %d bytes; the manifest says %d", name, attrs.Size, o.Size)
	}
	return newVerifyingReader(ctx, key, o, c)
}

func (c *Checkpoint) corrupt(format string, args ...any) error {
	return &CorruptError{Run: c.Manifest.Run, ID: c.Manifest.ID, Reason: fmt.Sprintf(format, args...)}
}

// verifyingReader streams an object while checking it against its manifest
// entry. Read-ahead goroutines (streams) fetch its blocks with range reads,
// block i by stream i mod streams, each into a small ring of its own
// buffers, so that a disk or a store serves several requests at once; each
// block hashes on a free core from the moment it arrives, while the reader
// takes its bytes, and its buffer is free once both are done. Reading to the end
// returns a *CorruptError instead of io.EOF if the size or the hash list
// root differs from the manifest.
type verifyingReader struct {
	key     string
	obj     Object
	c       *Checkpoint
	streams []readStream
	cancel  context.CancelFunc
	stop    chan struct{}
	reading sync.WaitGroup
	hashes  *hashList
	blocks  int // blocks handed out (each hashing since it arrived)
	total   int // blocks of the object: at least one (an empty object is one empty block)
	cur     readChunk
	off     int
	n       int64
	err     error
	closed  bool
	stopped bool // the read-ahead has ended (stopReadAhead)
}

// readStream is one read-ahead goroutine's queue and buffers.
type readStream struct {
	filled chan readChunk
	free   chan []byte
}

type readChunk struct {
	buf []byte
	err error // io.EOF with the object's last block
	// handedOut frees buf once the reader is done with it; the hash
	// started when the block arrived frees it too (readAhead).
	handedOut func()
}

// streamBuffers per read-ahead stream: the block being read, one being
// handed out and hashed, one waiting (or still hashing).
const streamBuffers = 3

func newVerifyingReader(ctx context.Context, key string, o Object, c *Checkpoint) (_ *verifyingReader, err error) {
	algo, _ := algoOf(c.Manifest.Format)
	check := blockCheck{algo: algo}
	if algo == hashXXH3 && c.s.key != nil {
		// The manifest's signature and every object's MAC were checked
		// when it was read (Store.manifest): the key authenticates each block.
		// The nonce is well formed (hashIs): an error here is this
		// process's (GODEBUG=fips140=only refuses GCM with nonces of our
		// choosing), not the checkpoint's, so it is not a CorruptError.
		check.mac, err = objectMAC(c.s.key, o.MACNonce)
		if err != nil {
			return nil, fmt.Errorf("checkpoint %s/%s: checking object %s's MAC: %w", c.Manifest.Run, c.Manifest.ID, o.Name, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	total := max(1, int((o.Size+BlockSize-1)/BlockSize))
	v := &verifyingReader{key: key, obj: o, c: c, hashes: newHashList(check), cancel: cancel,
		stop: make(chan struct{}), total: total, streams: make([]readStream, min(cmp.Or(c.s.readStreams, readStreamsFor(c.s.url, algo)), total))}
	size := int(min(o.Size, BlockSize))
	for k := range v.streams {
		st := readStream{filled: make(chan readChunk, streamBuffers), free: make(chan []byte, streamBuffers)}
		for range streamBuffers {
			if c.s.directIO {
				st.free <- alignedBuffer(size)[:size]
			} else {
				st.free <- make([]byte, size)
			}
		}
		v.streams[k] = st
		v.reading.Add(1)
		go v.readAhead(ctx, k)
	}
	return v, nil
}

// readAhead reads blocks k, k+streams, ... of the object, each with its own
// range read, so that chunk i is block i of the hash list. The object's last
// block, or a short one, carries io.EOF; a failed read carries its error.
func (v *verifyingReader) readAhead(ctx context.Context, k int) {
	defer v.reading.Done()
	st := v.streams[k]
	for i := k; i < v.total; i += len(v.streams) {
		var buf []byte
		select {
		case buf = <-st.free:
		case <-v.stop:
			return
		}
		off := int64(i) * BlockSize
		want := int(min(BlockSize, v.obj.Size-off))
		n, err := v.readBlock(ctx, off, buf[:want])
		if err == nil && i == v.total-1 {
			err = io.EOF
		}
		// The block hashes from the moment it arrives, while the reader
		// takes its bytes, not after: with the hash waiting for the
		// reader, loads ran at about 2 GB/s on a 2-core VM whose disk read
		// 2.6 (BENCHMARKS.md). Its buffer is free once both are done.
		chunk := readChunk{buf: buf[:n], err: err}
		if n > 0 || v.obj.Size == 0 {
			b, free := buf, st.free
			var both atomic.Int32
			both.Store(2)
			release := func() {
				if both.Add(-1) == 0 {
					free <- b[:cap(b)]
				}
			}
			v.hashes.hashAsync(i, b[:n], release)
			chunk.handedOut = release
		} else {
			chunk.handedOut = func() { st.free <- buf[:cap(buf)] }
		}
		select {
		case st.filled <- chunk:
		case <-v.stop:
			return
		}
		if err != nil {
			return
		}
	}
}

// readBlock fills buf from offset off; a short read (the object shrank)
// returns io.EOF with what it got. On a local disk it reads the block
// directly (O_DIRECT: buf's capacity is aligned, and so is the length it
// asks for) unless the page cache holds all of it already.
func (v *verifyingReader) readBlock(ctx context.Context, off int64, buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, nil
	}
	want, ask := len(buf), len(buf)
	var opts *blob.ReaderOptions
	var direct *os.File
	if v.c.s.directIO {
		ask = roundUp(want, directAlign) // a whole last block: reading past the end is a short read
		opts = &blob.ReaderOptions{BeforeRead: func(as func(any) bool) error {
			var f *os.File
			if as(&f) && canDirect(f) && !cached(f, off, int64(want)) && setDirect(f, true) == nil {
				direct = f
			}
			return nil
		}}
	}
	r, err := v.c.s.bucket.NewRangeReader(ctx, v.key, off, int64(ask), opts)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return 0, io.EOF // removed since it was opened: short, hence corrupt
		}
		return 0, err
	}
	defer r.Close()
	buf = buf[:ask]
	n, err := io.ReadAtLeast(r, buf, want)
	if err != nil && direct != nil && isDirectRefused(err) {
		// The file system took O_DIRECT and then refused the read: the rest through the cache.
		if err = setDirect(direct, false); err == nil {
			var m int
			m, err = io.ReadAtLeast(r, buf[n:], want-n)
			n += m
		}
	}
	n = min(n, want)
	if v.c.read != nil {
		v.c.read.Add(int64(n))
	}
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = io.EOF
	}
	return n, err
}

func (v *verifyingReader) Read(p []byte) (int, error) {
	if v.closed {
		return 0, fmt.Errorf("reading object %s: %w", v.obj.Name, os.ErrClosed)
	}
	if err := v.advance(); err != nil {
		return 0, err
	}
	n := copy(p, v.cur.buf[v.off:])
	v.off += n
	v.n += int64(n)
	return n, nil
}

// WriteTo writes the object to w block by block, straight from the buffer
// each block was read into, so that io.Copy pays no copy into a buffer of
// its own (dd's reads to /dev/null pay none either). At the end it returns
// nil, or a *CorruptError if the size or the hash list root differs from
// the manifest: as with Read, w has been given the bytes by then, and a
// caller must keep what it wrote until WriteTo has returned nil.
func (v *verifyingReader) WriteTo(w io.Writer) (int64, error) {
	if v.closed {
		return 0, fmt.Errorf("reading object %s: %w", v.obj.Name, os.ErrClosed)
	}
	var written int64
	for {
		if err := v.advance(); err == io.EOF {
			return written, nil
		} else if err != nil {
			return written, err
		}
		n, err := w.Write(v.cur.buf[v.off:])
		v.off += n
		v.n += int64(n)
		written += int64(n)
		if err == nil && v.off < len(v.cur.buf) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return written, err
		}
	}
}

// advance makes the current block one with bytes left to hand out: it hands
// a block that has been read out to a hasher (which frees its buffer) and
// takes the next from its stream. At the object's end it returns io.EOF, or
// the *CorruptError that the size or the hash list root calls for.
func (v *verifyingReader) advance() error {
	for v.err == nil && v.off == len(v.cur.buf) {
		if v.cur.buf != nil {
			if len(v.cur.buf) > 0 || v.obj.Size == 0 {
				v.blocks++ // hashing since it arrived (readAhead)
			}
			v.cur.handedOut()
			v.cur.buf = nil
		}
		if v.cur.err != nil {
			v.err = v.finish(v.cur.err)
			break
		}
		v.cur, v.off = <-v.streams[v.blocks%len(v.streams)].filled, 0
		if v.cur.buf == nil {
			v.cur.buf = []byte{} // handed out (and hashed) even when empty
		}
	}
	return v.err
}

// finish checks the whole object once storage has reported its end (or an
// error). The other streams may still be reading blocks past that end (an
// object that shrank or vanished ends early on one stream only): they stop
// before the root is taken, so that no block starts hashing while it is.
func (v *verifyingReader) finish(readErr error) error {
	v.stopReadAhead()
	got := v.hashes.root(v.blocks)
	switch {
	case readErr != io.EOF:
		return fmt.Errorf("reading object %s: %w", v.obj.Name, readErr)
	case v.n != v.obj.Size:
		return v.c.corrupt("object %s ended after %d bytes; the manifest says %d", v.obj.Name, v.n, v.obj.Size)
	case got != v.obj.Hash():
		return v.c.corrupt("object %s has %s hash list root %s; the manifest says %s", v.obj.Name, v.hashes.check.algo, got, v.obj.Hash())
	case v.hashes.check.mac != nil && v.hashes.macRoot(v.blocks) != v.obj.MAC:
		return v.c.corrupt("object %s fails its GMAC under the pool key: forged, or damaged", v.obj.Name)
	}
	return io.EOF
}

func (v *verifyingReader) Close() error {
	if !v.closed {
		v.closed = true
		v.stopReadAhead()
		v.hashes.wait()
	}
	return nil
}

// stopReadAhead ends the read-ahead goroutines and waits for them: none
// starts a hash after it returns.
func (v *verifyingReader) stopReadAhead() {
	if !v.stopped {
		v.stopped = true
		close(v.stop)
		v.cancel() // a range read in flight ends now
		v.reading.Wait()
	}
}

func isNotFound(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }
