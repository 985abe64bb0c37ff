package checkpoint

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	neturl "net/url"
	"regexp"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/internal/blobopen"
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
	b, err := blobopen.Open(ctx, withFileDefaults(bucketURL))
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
