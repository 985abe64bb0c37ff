package checkpoint

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	neturl "net/url"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/blobwatch"
)

// ManifestName is the object that commits a checkpoint.
const ManifestName = "MANIFEST.json"

// FormatVersion is the manifest format this package writes: 3, whose
// objects are checksummed with XXH3-128 and, on a store with a key,
// authenticated block by block with GMAC (hashlist.go says why). It reads
// formats 1 (SHA-256) and 2 (BLAKE3) as well.
const FormatVersion = 3

// Store is a bucket of checkpoints, shared by any number of runs.
type Store struct {
	bucket *blobwatch.Bucket // every call watched for stalls
	url    string
	log    *zap.Logger
	key    []byte // signs and verifies manifests (Sign)
	// readStreams is how many range reads of one object run at once; 0:
	// readStreamsFor the store's URL and the checkpoint's format.
	readStreams int
	// directIO: objects on a local disk bypass the page cache (fileio.go);
	// a file:// URL's direct_io=off turns it off.
	directIO bool
}

// readStreamsFor is how many range reads of one object a store keeps in
// flight (BENCHMARKS.md, checkpoints). On an object store, four: each GET
// waits a round trip. From a MinIO on the same machine, four in flight
// restored at 0.94-1.08 GB/s against one's 0.81-0.92 (2026-11-24). On a
// local disk, four as well for format 3, whose checksum leaves the cores
// free: on a 2-core VM (2026-11-27) one stream of 8 MiB direct reads
// loaded 1.6-1.9 GB/s, four 2.9-3.3, dd's 4 MiB reads 2.6-4.1. With a
// cryptographic hash (formats 1 and 2) the hashing took both cores, and
// two or three streams were slower than one, which is kept for them. In
// memory (mem://), one: there is nothing to wait for.
func readStreamsFor(url string, algo hashAlgo) int {
	u, err := neturl.Parse(url)
	switch {
	case err == nil && u.Scheme == "mem":
		return 1
	case err == nil && u.Scheme == "file" && algo != hashXXH3:
		return 1
	}
	return 4
}

// Sign makes the store sign every manifest it commits with key (HMAC-SHA256
// over the manifest's checksum, which covers every object's hash) and treat
// every manifest not signed with that key as corrupt: whoever can write the
// bucket but lacks the key cannot make a checkpoint this store will load.
// Checkpoints written before the store signed are refused too. In format 3
// every block is also tagged with GMAC under the key (hashlist.go), which
// Go refuses to run under GODEBUG=fips140=only: there, saves and loads on
// a store with a key fail, saying so.
func (s *Store) Sign(key []byte) { s.key = key }

// KeyID names a signing key in manifests without revealing it.
func KeyID(key []byte) string {
	sum := sha256.Sum256(append([]byte("durabletrain checkpoint key id\x00"), key...))
	return hex.EncodeToString(sum[:8])
}

func signature(key []byte, checksum string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("durabletrain manifest v1\x00"))
	m.Write([]byte(checksum))
	return hex.EncodeToString(m.Sum(nil))
}

// checkSignature verifies a manifest against the store's key, if it has one.
func (s *Store) checkSignature(m Manifest) error {
	switch {
	case s.key == nil:
		return nil
	case m.Signature == "":
		return errors.New("manifest is not signed, and this worker loads only checkpoints signed with its pool key")
	case m.KeyID != KeyID(s.key):
		return fmt.Errorf("manifest is signed with another key (id %s; this worker's pool key is %s)", m.KeyID, KeyID(s.key))
	case !hmac.Equal([]byte(m.Signature), []byte(signature(s.key, m.Checksum))):
		return errors.New("manifest signature mismatch: forged, or altered after it was signed")
	}
	return nil
}

// Open opens the checkpoint store at url. A nil logger logs nothing.
func Open(ctx context.Context, url string, log *zap.Logger) (*Store, error) {
	if log == nil {
		log = zap.NewNop()
	}
	// The rule specs are checked by: a Go caller, or a URL read back from a
	// run's progress, gets the same refusal (a '#' would otherwise open the
	// folder before it, a relative path the worker's own directory).
	if err := bloburl.Check("storage URL", url); err != nil {
		return nil, fmt.Errorf("checkpoint: opening storage: %w", err)
	}
	bucketURL, directIO, err := directIOOf(url)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: opening storage %q: %w", url, err)
	}
	b, err := blob.OpenBucket(ctx, withFileDefaults(bucketURL))
	if err != nil {
		return nil, fmt.Errorf("checkpoint: opening storage %q: %w (want a gocloud.dev/blob URL such as file:///var/lib/durabletrain/checkpoints?create_dir=1, s3://bucket?prefix=runs/ (gocloud ignores a path), gs://bucket or mem://)", url, err)
	}
	return &Store{bucket: blobwatch.Wrap(b, url, blobwatch.StallTimeout(ctx)), url: url, log: log, directIO: directIO}, nil
}

// DirectIOParam is the file:// URL parameter that says whether objects
// bypass the page cache: on (the default, where the file system allows it)
// or off.
const DirectIOParam = "direct_io"

// directIOOf takes the direct_io parameter out of a file:// URL (fileblob
// would refuse it) and reads it.
func directIOOf(raw string) (string, bool, error) {
	u, err := neturl.Parse(raw)
	if err != nil || u.Scheme != "file" {
		return raw, false, nil
	}
	q := u.Query()
	if !q.Has(DirectIOParam) {
		return raw, true, nil
	}
	v := q.Get(DirectIOParam)
	if v != "on" && v != "off" {
		return "", false, fmt.Errorf("?%s=%q; want on (the default: objects bypass the page cache where the file system allows it) or off", DirectIOParam, v)
	}
	q.Del(DirectIOParam)
	u.RawQuery = q.Encode()
	return u.String(), v == "on", nil
}

// withFileDefaults sets two fileblob options a file:// URL does not set:
//   - no_tmp_dir: each object's temporary file is written next to it rather
//     than in $TMPDIR: a rename across filesystems (a checkpoint volume and
//     the container's /tmp) fails, and one within a directory is atomic;
//   - metadata=skip: no sidecar file of attributes per object, whose MD5
//     fileblob would compute over every byte in the writing goroutine (a
//     third of a save's time here, BENCHMARKS.md). Checkpoints are verified by
//     their manifest's hashes, not by MD5; fileblob still lists, reads and
//     deletes objects written with a sidecar.
func withFileDefaults(raw string) string {
	u, err := neturl.Parse(raw)
	if err != nil || u.Scheme != "file" {
		return raw
	}
	q := u.Query()
	if q.Get("no_tmp_dir") == "" {
		q.Set("no_tmp_dir", "1")
	}
	if !q.Has("metadata") {
		q.Set("metadata", "skip")
	}
	u.RawQuery = q.Encode()
	return u.String()
}

// StallError says a call to the store moved nothing for the stall timeout
// (a hung or unreachable store): the store's failure, never a checkpoint's.
type StallError = blobwatch.StallError

// DefaultStallTimeout is how long a call to a store may move nothing before
// it fails, unless Open's context (blobwatch.WithStallTimeout) or
// SetStallTimeout says otherwise.
const DefaultStallTimeout = blobwatch.DefaultStallTimeout

// SetStallTimeout sets how long a call to the store may move nothing before
// it fails with a *StallError; 0 or less: DefaultStallTimeout.
func (s *Store) SetStallTimeout(d time.Duration) { s.bucket.SetStallTimeout(d) }

// URL is the storage URL the store was opened with.
func (s *Store) URL() string { return s.url }

// Close releases the bucket.
func (s *Store) Close() error { return s.bucket.Close() }

// Manifest describes one committed checkpoint.
type Manifest struct {
	Format    int    `json:"format"`
	Run       string `json:"run"`
	ID        string `json:"id"`
	Epoch     int    `json:"epoch"` // the cursor training resumes at: Step steps of Epoch are done
	Step      int    `json:"step"`
	WorldSize int    `json:"world_size"`
	// Shards: a sharded checkpoint's ranks, each of which wrote its own
	// objects under ShardPrefix(rank); 0: one state for every rank.
	Shards   int                `json:"shards,omitempty"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	Meta     map[string]string  `json:"meta,omitempty"`
	Created  time.Time          `json:"created"`
	Objects  []Object           `json:"objects"`
	Checksum string             `json:"checksum"` // SHA-256 of this manifest encoded with Checksum and Signature empty
	// KeyID and Signature: on a store with a key (Store.Sign), the key's
	// name and the HMAC-SHA256 of Checksum under it.
	KeyID     string `json:"key_id,omitempty"`
	Signature string `json:"signature,omitempty"`
}

// Object is one file of a checkpoint.
type Object struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
	// The hash list root over BlockSize blocks (see BlockSize): SHA256 in a
	// format 1 manifest, BLAKE3 in format 2, XXH3 (the SHA-256 of the
	// blocks' XXH3-128 checksums) in format 3; the others are empty.
	SHA256 string `json:"sha256,omitempty"`
	BLAKE3 string `json:"blake3,omitempty"`
	XXH3   string `json:"xxh3,omitempty"`
	// MAC and MACNonce, in format 3 from a store with a key (Store.Sign):
	// the SHA-256 of the blocks' GMAC tags under the object's own key,
	// which the pool key and MACNonce (random) derive (objectMAC).
	MAC      string `json:"mac,omitempty"`
	MACNonce string `json:"mac_nonce,omitempty"`
}

// Hash is the object's hash list root, whichever its manifest's format uses.
func (o Object) Hash() string { return o.SHA256 + o.BLAKE3 + o.XXH3 }

// setHash records root as the object's hash in algo.
func (o *Object) setHash(algo hashAlgo, root string) {
	o.SHA256, o.BLAKE3, o.XXH3 = "", "", ""
	switch algo {
	case hashBLAKE3:
		o.BLAKE3 = root
	case hashXXH3:
		o.XXH3 = root
	default:
		o.SHA256 = root
	}
}

// hashIs says whether the object carries a hash of algo and no other, and
// a MAC only where algo has one (format 3), whole and with its nonce.
func (o Object) hashIs(algo hashAlgo) bool {
	var mine string
	switch algo {
	case hashBLAKE3:
		mine = o.BLAKE3
	case hashXXH3:
		mine = o.XXH3
	default:
		mine = o.SHA256
	}
	if len(mine) != 64 || len(o.Hash()) != 64 {
		return false
	}
	if o.MAC == "" && o.MACNonce == "" {
		return true
	}
	return algo == hashXXH3 && isHex(o.MAC, 64) && isHex(o.MACNonce, 2*macNonceBytes)
}

// lacksMAC says whether the object, checked with algo, should carry a MAC
// it does not: format 3 read or adopted by a store with a key.
func (o Object) lacksMAC(algo hashAlgo, key []byte) bool {
	return algo == hashXXH3 && key != nil && o.MAC == ""
}

func isHex(s string, n int) bool {
	_, err := hex.DecodeString(s)
	return err == nil && len(s) == n
}

// Info is what the caller states about a checkpoint when committing it.
type Info struct {
	WorldSize int
	Shards    int // set by AdoptShards; a clone states its source's
	Metrics   map[string]float64
	Meta      map[string]string
}

var (
	runNamePattern    = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._=+@-]{0,199}$`)
	objectNamePattern = regexp.MustCompile(`^[A-Za-z0-9._=+@-]+(/[A-Za-z0-9._=+@-]+)*$`)
	idPattern         = regexp.MustCompile(`^ckpt-e(\d{6})-s(\d{9})$`)
)

func checkRun(run string) error {
	if !runNamePattern.MatchString(run) {
		return fmt.Errorf("checkpoint: run name %q; want 1-200 characters of letters, digits and ._=+@- starting with a letter or digit", run)
	}
	return nil
}

// ValidObjectName says whether Writer.Create takes name: slash-separated
// parts of letters, digits and ._=+@-, none longer than maxObjectNamePart
// bytes, without "..", at most MaxObjectName bytes, and not ManifestName.
// The bounds keep every key within what blob stores take: S3's 1,024
// bytes with the run and ID before it, a local file system's 255 bytes a
// part with the temporary suffix fileblob adds while it writes.
func ValidObjectName(name string) bool {
	if len(name) > MaxObjectName || name == ManifestName || strings.Contains(name, "..") || !objectNamePattern.MatchString(name) {
		return false
	}
	for part := range strings.SplitSeq(name, "/") {
		if len(part) > maxObjectNamePart {
			return false
		}
	}
	return true
}

// MaxObjectName bounds an object's name; maxObjectNamePart each part of it.
const (
	MaxObjectName     = 512
	maxObjectNamePart = 200
)

// ID names the checkpoint taken at a cursor; IDs sort in training order.
func ID(epoch, step int) string { return fmt.Sprintf("ckpt-e%06d-s%09d", epoch, step) }

func prefix(run, id string) string { return run + "/" + id + "/" }

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

type objectWriter struct {
	w      *Writer
	obj    *Object
	sw     *syncedWriter
	hashes *hashList
	writes sync.WaitGroup // blocks being written to a local file
	block  []byte         // the block being filled: its bytes after head
	blocks int            // blocks handed to the hashers
	free   chan []byte    // block buffers neither being written nor hashed
	taken  int            // buffers taken from blockPool, at most cap(free)
	err    error

	// The start of the block being filled, written from the caller's
	// bytes (writeInPlace): how long it is, and its hash so far (nil when
	// the block has none).
	headLen int
	head    hash.Hash
	// inPlaceBytes counts the bytes written from the caller's memory.
	inPlaceBytes int64
}

// writeBuffers bounds the memory of one object being written to a local
// file: the block being filled, one per block being hashed, and one more, so
// that a block is always on its way to the disk while others hash. Other
// stores (S3, memory) take the caller's bytes directly and do without the
// last one.
var writeBuffers = runtime.GOMAXPROCS(0) + 2

// Write writes p to storage while earlier blocks hash on other cores, then
// copies p into the block buffers it hashes next. On a local disk it copies
// p into the blocks only, and each full block is written and hashed at the
// same time, on other goroutines; a megabyte or more, where the block being
// filled holds no copied bytes (and, with direct I/O, at an aligned address
// and position), it writes from p itself (writeInPlace).
func (o *objectWriter) Write(p []byte) (int, error) {
	if o.sw.blocks {
		if err := o.sw.err(); err != nil {
			o.err = err
			return 0, err
		}
		written := 0
		for len(p) > 0 {
			k := o.inPlaceRun(p)
			if k > 0 {
				if err := o.writeInPlace(p[:k:k]); err != nil {
					o.err = err
					return written, err
				}
			} else {
				k = min(len(p), BlockSize-o.headLen-len(o.block))
				o.fill(p[:k])
			}
			written += k
			p = p[k:]
		}
		return written, nil
	}
	n, err := o.sw.Write(p)
	o.fill(p[:n])
	if err != nil {
		o.err = err
	}
	return n, err
}

// fill copies p into the blocks, handing each full one on.
func (o *objectWriter) fill(p []byte) {
	o.obj.Size += int64(len(p))
	for rest := p; len(rest) > 0; {
		k := min(len(rest), BlockSize-o.headLen-len(o.block))
		o.block = append(o.block, rest[:k]...)
		rest = rest[k:]
		if o.headLen+len(o.block) == BlockSize {
			o.flushBlock()
		}
	}
}

// flushBlock hands the block being filled to a hasher and, on a local disk,
// to a writer at the same time, and takes a free buffer for the next. The
// buffer is free again once both are done. Writing while hashing keeps the
// disk busy while the hashes wait for a core: with a CPU-bound process on
// every core, writing each block first and then hashing it left the disk
// idle for the hashes (1 GiB saved at 0.73x dd's direct write).
func (o *objectWriter) flushBlock() {
	b, i, head := o.block, o.blocks, o.head
	off := int64(i)*BlockSize + int64(o.headLen)
	if o.sw.blocks {
		var both atomic.Int32
		both.Store(2)
		release := func() {
			if both.Add(-1) == 0 {
				o.free <- b[:0]
			}
		}
		o.writes.Add(1)
		go func() {
			defer o.writes.Done()
			o.sw.writeBlock(b, off)
			release()
		}()
		o.hashes.hashAfter(i, head, b, release)
	} else {
		o.hashes.hash(i, b, func() { o.free <- b[:0] })
	}
	o.blocks++
	o.head, o.headLen = nil, 0
	o.block = o.nextBuffer()
}

// blockPool holds block buffers (aligned, BlockSize long) between objects:
// an object of a few bytes takes one and gives it back, and a checkpoint
// of many objects neither allocates nor clears 8 MiB for each.
var blockPool = sync.Pool{New: func() any { b := alignedBuffer(BlockSize); return &b }}

// nextBuffer is a free block buffer: one handed back by a hasher or a
// writer, else one more from blockPool while the object holds fewer than
// writeBuffers, else the first to come back. An object takes only what its
// blocks in flight need: before, each took writeBuffers (GOMAXPROCS+2, 130
// on a 128-core host: a GiB) at its start, however small.
func (o *objectWriter) nextBuffer() []byte {
	select {
	case b := <-o.free:
		return b
	default:
	}
	if o.taken < cap(o.free) {
		o.taken++
		return (*blockPool.Get().(*[]byte))[:0]
	}
	return <-o.free
}

// releaseBuffers gives the object's buffers back to blockPool, once every
// block is written and hashed (each buffer is then free, or the one being
// filled).
func (o *objectWriter) releaseBuffers() {
	if o.taken == 0 {
		return
	}
	put := func(b []byte) {
		b = b[:0:BlockSize]
		blockPool.Put(&b)
	}
	for range o.taken - 1 {
		put(<-o.free)
	}
	put(o.block)
	o.block, o.taken = nil, 0
}

// inPlaceMin is the least a Write hands a local file from its own bytes,
// without copying them into a block buffer: a write of a few KiB is
// better copied, written and hashed while the caller goes on.
const inPlaceMin = 1 << 20

// inPlaceRun is how many of p's first bytes go to the local file from p
// itself (writeInPlace): none while the block being filled holds copied
// bytes (the next bytes go after them, in order), and none for a run under
// inPlaceMin. With direct I/O, p must start at an aligned address and
// position, and the run is cut to whole alignments; with a MAC, to whole
// blocks; the rest is copied.
func (o *objectWriter) inPlaceRun(p []byte) int {
	if !o.sw.blocks || len(o.block) > 0 || len(p) < inPlaceMin {
		return 0
	}
	k := len(p)
	if o.sw.direct.Load() {
		if uintptr(unsafe.Pointer(unsafe.SliceData(p)))%directAlign != 0 || o.obj.Size%directAlign != 0 {
			return 0
		}
		k = k / directAlign * directAlign
	}
	if o.hashes.check.wholeBlocks() {
		// A GMAC takes its block whole: whole blocks only, from a
		// block's start; the rest is copied.
		if o.headLen > 0 {
			return 0
		}
		k = k / BlockSize * BlockSize
	}
	if k < inPlaceMin {
		return 0
	}
	return k
}

// writeInPlace writes p (len == cap: nothing past it is touched) at the
// object's end straight from the caller's memory, without the copy into a
// block buffer (which cost a fifth of a save's CPU time: BENCHMARKS.md),
// and returns once every byte of it is written and hashed: a Writer keeps
// nothing of p. This goroutine writes the pieces in order, one at a time,
// as dd does, while other goroutines hash them: a whole block on its own
// (hashList), a piece of a block into the block's running hash (head),
// which the rest of the block, in place or copied, continues. Writing from
// here, rather than from a goroutine per block as copied blocks are, keeps
// the disk as busy under load: with a CPU-bound process on every core, a
// goroutine per piece saved 256 MiB at 0.93-1.28 GB/s against the copying
// path's 1.22-1.54.
func (o *objectWriter) writeInPlace(p []byte) error {
	var hashing sync.WaitGroup
	for len(p) > 0 {
		i, off := o.blocks, int64(o.blocks)*BlockSize+int64(o.headLen)
		k := min(len(p), BlockSize-o.headLen)
		piece := p[:k:k]
		hashing.Add(1)
		if o.headLen == 0 && k == BlockSize {
			o.hashes.hash(i, piece, hashing.Done)
			o.blocks++
		} else {
			if o.head == nil {
				o.head = o.hashes.check.newHead()
			}
			head, full := o.head, o.headLen+k == BlockSize
			go func() {
				defer hashing.Done()
				head.Write(piece)
				if full {
					o.hashes.set(i, head)
				}
			}()
			o.headLen += k
			if full {
				o.blocks++
				o.head, o.headLen = nil, 0
			}
		}
		o.sw.writeBlock(piece, off)
		o.obj.Size += int64(k)
		o.inPlaceBytes += int64(k)
		p = p[k:]
		if o.sw.err() != nil {
			break // the object is lost: write no more of it
		}
	}
	hashing.Wait()
	return o.sw.err()
}

// settle returns once every block handed on is written and hashed.
func (o *objectWriter) settle() {
	o.writes.Wait()
	o.hashes.wait()
}

func (o *objectWriter) Close() error {
	var err error
	if o.sw.blocks {
		if len(o.block) > 0 || o.headLen > 0 || o.blocks == 0 {
			o.flushBlock()
		}
		o.settle() // every block written
		o.sw.size = o.obj.Size
		err = o.sw.Close(o.err)
	} else {
		err = o.sw.Close(o.err)
		if len(o.block) > 0 || o.blocks == 0 {
			o.flushBlock()
		}
	}
	root := o.hashes.root(o.blocks) // every block hashed: every buffer free
	o.releaseBuffers()
	o.w.mu.Lock()
	defer o.w.mu.Unlock()
	o.w.open--
	o.obj.setHash(o.hashes.check.algo, root)
	o.obj.MAC = o.hashes.macRoot(o.blocks)
	if err != nil {
		err = fmt.Errorf("checkpoint: writing %s: %w", o.obj.Name, err)
		o.w.failed = errors.Join(o.w.failed, err)
	}
	return err
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

// Bytes is the size of the checkpoint's objects together.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, o := range m.Objects {
		n += o.Size
	}
	return n
}

func (m Manifest) checksum() string {
	m.Checksum, m.Signature = "", ""
	data, _ := json.Marshal(m)
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}
