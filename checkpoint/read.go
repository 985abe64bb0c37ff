package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
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
	return s.LatestVerifiedBefore(ctx, run, 0)
}

// LatestVerifiedBefore is LatestVerified among the checkpoints of an epoch
// below epoch (0: every one); the newer ones are passed over unread but
// for their manifests, and are not reported as skipped.
func (s *Store) LatestVerifiedBefore(ctx context.Context, run string, epoch int) (*Checkpoint, error) {
	ids, err := s.IDs(ctx, run)
	if err != nil {
		return nil, err
	}
	var skipped []Skip
	read := new(atomic.Int64) // by every checkpoint tried
	passed := 0
	for _, id := range slices.Backward(ids) {
		if epoch > 0 {
			if m, err := s.readManifest(ctx, run, id, read); err == nil && m.Epoch >= epoch {
				passed++
				continue
			}
		}
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
	if len(skipped) == 0 && passed > 0 {
		return nil, fmt.Errorf("checkpoint: run %s in %s: %w before epoch %d (its %d are of that epoch or later)", run, s.url, ErrNoCheckpoint, epoch, passed)
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

func isNotFound(err error) bool { return gcerrors.Code(err) == gcerrors.NotFound }
