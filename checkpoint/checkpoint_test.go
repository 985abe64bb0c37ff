package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/internal/race"
	"github.com/durabletrain/durabletrain/spec"
)

// stores runs a test on a fresh mem:// store and a fresh file:// store.
func stores(t *testing.T, f func(t *testing.T, s *Store, url string)) {
	for _, kind := range []string{"mem", "file"} {
		t.Run(kind, func(t *testing.T) {
			url := "mem://"
			if kind == "file" {
				url = bloburl.FromPath(t.TempDir()) + "?metadata=skip"
			}
			s, err := Open(context.Background(), url, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			f(t, s, url)
		})
	}
}

func put(t *testing.T, s *Store, run string, epoch int, objects map[string][]byte, metrics map[string]float64) Manifest {
	t.Helper()
	ctx := context.Background()
	w, err := s.Begin(ctx, run, epoch, 0)
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range objects {
		ow, err := w.Create(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		ow.Write(data)
		if err := ow.Close(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := w.Commit(ctx, Info{WorldSize: 2, Metrics: metrics, Meta: map[string]string{"backend": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func readObject(t *testing.T, c *Checkpoint, name string) []byte {
	t.Helper()
	r, err := c.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readByWriteTo reads an object with io.Copy, which takes the reader's
// WriteTo: the blocks are written to the buffer from where they were read.
func readByWriteTo(c *Checkpoint, name string) ([]byte, int64, error) {
	r, err := c.Open(context.Background(), name)
	if err != nil {
		return nil, 0, err
	}
	defer r.Close()
	if _, ok := r.(io.WriterTo); !ok {
		return nil, 0, fmt.Errorf("the reader of %s is a %T, which has no WriteTo", name, r)
	}
	var b bytes.Buffer
	n, err := io.Copy(&b, r)
	return b.Bytes(), n, err
}

// readInPieces reads an object with Reads of the given lengths in turn
// (the last repeated to the end), each into a buffer of its own that
// starts skew bytes past an aligned address, with bytes past its end that
// no Read may touch. It returns what it read and the error that ended it
// (nil for io.EOF).
func readInPieces(t *testing.T, c *Checkpoint, name string, lengths []int, skew int) ([]byte, error) {
	t.Helper()
	r, err := c.Open(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var got []byte
	for k := 0; ; k++ {
		n := lengths[min(k, len(lengths)-1)]
		mem := alignedBuffer(skew + n + 64)
		p, past := mem[skew:skew+n], mem[skew+n:]
		for i := range past {
			past[i] = 0xEE
		}
		m, err := r.Read(p)
		if !bytes.Equal(past, bytes.Repeat([]byte{0xEE}, len(past))) {
			t.Fatalf("a Read of %d bytes changed the bytes after the caller's buffer", n)
		}
		got = append(got, p[:m]...)
		if err == io.EOF {
			return got, nil
		} else if err != nil {
			return got, err
		}
	}
}

// A writer that fails stops the copy with its own error, and a writer that
// takes less than it is given, without an error, stops it with io.ErrShortWrite.
func TestWriteToStopsWhereTheWriterFails(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(ctx, bloburl.FromPath(t.TempDir())+"?metadata=skip", nil)
	defer s.Close()
	put(t, s, "r", 1, map[string][]byte{"o": bytes.Repeat([]byte{5}, 2*BlockSize+3)}, nil)
	c, err := s.LatestVerified(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	full := errors.New("disk full")
	for _, tc := range []struct {
		w    io.Writer
		want error
	}{
		{&limitedWriter{left: BlockSize + 10, err: full}, full},
		{&limitedWriter{left: BlockSize + 10}, io.ErrShortWrite},
	} {
		r, _ := c.Open(ctx, "o")
		n, err := r.(io.WriterTo).WriteTo(tc.w)
		r.Close()
		if !errors.Is(err, tc.want) || n != BlockSize+10 {
			t.Errorf("WriteTo into a writer that takes %d bytes: %d written, %v; want %d and %v", BlockSize+10, n, err, BlockSize+10, tc.want)
		}
	}
}

// limitedWriter takes left bytes, then fails with err (or takes nothing more, when err is nil).
type limitedWriter struct {
	left int
	err  error
}

func (w *limitedWriter) Write(p []byte) (int, error) {
	n := min(len(p), w.left)
	w.left -= n
	if n < len(p) {
		return n, w.err
	}
	return n, nil
}

func TestRoundTrip(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, url string) {
		ctx := context.Background()
		big := bytes.Repeat([]byte("weights!"), 300_000)
		put(t, s, "run-1", 1, map[string][]byte{"state.bin": []byte("epoch one")}, nil)
		want := put(t, s, "run-1", 2, map[string][]byte{"state.bin": big, "dir/extra.pt": []byte("x")}, map[string]float64{"test_accuracy": 0.8})
		c, err := s.LatestVerified(ctx, "run-1")
		if err != nil {
			t.Fatal(err)
		}
		m := c.Manifest
		if m.ID != ID(2, 0) || m.Epoch != 2 || m.WorldSize != 2 || m.Metrics["test_accuracy"] != 0.8 || m.Meta["backend"] != "test" || m.Created.IsZero() {
			t.Fatalf("manifest %+v", m)
		}
		if len(m.Objects) != 2 || m.Objects[0].Name != "dir/extra.pt" || m.Objects[1].Size != int64(len(big)) || m.Checksum != want.Checksum {
			t.Fatalf("objects %+v", m.Objects)
		}
		if !bytes.Equal(readObject(t, c, "state.bin"), big) {
			t.Fatal("state.bin read back differently")
		}
		if len(c.Skipped) != 0 {
			t.Fatalf("skipped %v", c.Skipped)
		}
		ref := c.Ref()
		got, err := s.Get(ctx, ref)
		if err != nil || got.Manifest.ID != m.ID || ref.URL != url {
			t.Fatalf("Get(%+v): %v", ref, err)
		}
	})
}

// corruptions are the ways a checkpoint's storage can go wrong.
var corruptions = []struct {
	name   string
	apply  func(t *testing.T, dir string) // dir is <root>/<run>/<id>
	reason string
}{
	{"object truncated", func(t *testing.T, dir string) { truncate(t, dir+"/state.bin", 10) }, "has 10 bytes; the manifest says"},
	{"object byte flipped", func(t *testing.T, dir string) { flip(t, dir+"/state.bin", 5) }, "XXH3-128"},
	{"object grown", func(t *testing.T, dir string) { appendTo(t, dir+"/state.bin", []byte("!")) }, "the manifest says"},
	{"object missing", func(t *testing.T, dir string) { os.Remove(dir + "/state.bin") }, "missing"},
	{"manifest missing (half-written)", func(t *testing.T, dir string) { os.Remove(dir + "/" + ManifestName) }, "never committed"},
	{"manifest truncated", func(t *testing.T, dir string) { truncate(t, dir+"/"+ManifestName, 40) }, "not valid JSON"},
	{"manifest edited", func(t *testing.T, dir string) {
		replaceIn(t, dir+"/"+ManifestName, `"world_size": 2`, `"world_size": 3`)
	}, "checksum mismatch"},
	{"manifest of another checkpoint", func(t *testing.T, dir string) {
		other, _ := os.ReadFile(filepath.Join(filepath.Dir(dir), ID(1, 0), ManifestName))
		os.WriteFile(dir+"/"+ManifestName, other, 0o644)
	}, "lies at"},
	{"manifest huge", func(t *testing.T, dir string) {
		// A sparse file: the reader must refuse it by its size, not read it.
		f, _ := os.OpenFile(dir+"/"+ManifestName, os.O_WRONLY, 0)
		f.Truncate(8 << 30)
		f.Close()
	}, "a manifest is at most"},
}

func TestCorruptCheckpointsAreSkippedWithTheReason(t *testing.T) {
	for _, c := range corruptions {
		t.Run(c.name, func(t *testing.T) {
			root := t.TempDir()
			core, logs := observer.New(zap.WarnLevel)
			s, err := Open(context.Background(), bloburl.FromPath(root)+"?metadata=skip", zap.New(core))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			put(t, s, "r", 1, map[string][]byte{"state.bin": []byte("the good old state")}, nil)
			put(t, s, "r", 2, map[string][]byte{"state.bin": []byte("the newest state, about to be damaged")}, nil)
			c.apply(t, filepath.Join(root, "r", ID(2, 0)))
			got, err := s.LatestVerified(context.Background(), "r")
			if err != nil {
				t.Fatal(err)
			}
			if got.Manifest.ID != ID(1, 0) || string(readObject(t, got, "state.bin")) != "the good old state" {
				t.Fatalf("got %s, want the older checkpoint", got.Manifest.ID)
			}
			if len(got.Skipped) != 1 || got.Skipped[0].ID != ID(2, 0) || !strings.Contains(got.Skipped[0].Reason, c.reason) {
				t.Fatalf("skipped %+v, want %s with a reason containing %q", got.Skipped, ID(2, 0), c.reason)
			}
			if logs.FilterMessage("checkpoint skipped").Len() != 1 {
				t.Fatal("the skip was not logged")
			}
		})
	}
}

func TestCorruptionAfterVerificationIsCaughtWhileReading(t *testing.T) {
	root := t.TempDir()
	s, _ := Open(context.Background(), bloburl.FromPath(root)+"?metadata=skip", nil)
	defer s.Close()
	put(t, s, "r", 1, map[string][]byte{"state.bin": bytes.Repeat([]byte{7}, 1<<16)}, nil)
	c, err := s.LatestVerified(context.Background(), "r")
	if err != nil {
		t.Fatal(err)
	}
	flip(t, filepath.Join(root, "r", ID(1, 0), "state.bin"), 1000)
	r, _ := c.Open(context.Background(), "state.bin")
	defer r.Close()
	if _, err := io.ReadAll(r); err == nil || !strings.Contains(err.Error(), "XXH3-128") {
		t.Fatalf("reading a checkpoint corrupted after verification: %v", err)
	}
}

func TestNoVerifiedCheckpoint(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, _ string) {
		ctx := context.Background()
		if _, err := s.LatestVerified(ctx, "empty"); !errors.Is(err, ErrNoCheckpoint) {
			t.Fatalf("got %v, want ErrNoCheckpoint", err)
		}
		// A write that never committed is not a checkpoint.
		w, _ := s.Begin(ctx, "crashed", 1, 0)
		ow, _ := w.Create(ctx, "state.bin")
		ow.Write([]byte("partial"))
		ow.Close()
		_, err := s.LatestVerified(ctx, "crashed")
		if !errors.Is(err, ErrNoCheckpoint) || !strings.Contains(err.Error(), "never committed") {
			t.Fatalf("got %v, want ErrNoCheckpoint naming the uncommitted write", err)
		}
	})
}

// A checkpoint whose manifest would be past what a restore reads is not
// committed: committed, it would be one the run counts on and can never load.
func TestCommitRefusesAManifestNoRestoreWouldRead(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(ctx, "mem://", nil)
	w, _ := s.Begin(ctx, "many", 1, 0)
	ow, err := w.Create(ctx, "state")
	if err != nil {
		t.Fatal(err)
	}
	ow.Write([]byte{1})
	ow.Close()
	// Past MaxManifestBytes by its metadata: tens of thousands of objects
	// would take it there too, in minutes under the race detector.
	_, err = w.Commit(ctx, Info{Meta: map[string]string{"notes": strings.Repeat("n", MaxManifestBytes)}})
	if err == nil || !strings.Contains(err.Error(), "a restore reads at most 16777216") {
		t.Fatalf("got %v; want the commit refused", err)
	}
	if _, err := s.LatestVerified(ctx, "many"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("after the refused commit: %v; want no checkpoint", err)
	}
}

func TestCommitRefusesIncompleteWrites(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(ctx, "mem://", nil)
	w, _ := s.Begin(ctx, "r", 1, 0)
	if _, err := w.Commit(ctx, Info{}); err == nil {
		t.Error("committed a checkpoint with no objects")
	}
	ow, _ := w.Create(ctx, "a")
	if _, err := w.Commit(ctx, Info{}); err == nil || !strings.Contains(err.Error(), "still open") {
		t.Errorf("committed with an object still open: %v", err)
	}
	ow.Close()
	if _, err := w.Create(ctx, "a"); err == nil {
		t.Error("created the same object twice")
	}
}

func TestRecommitAtTheSameCursorUncommitsFirst(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(ctx, "mem://", nil)
	put(t, s, "r", 1, map[string][]byte{"state.bin": []byte("first")}, nil)
	w, _ := s.Begin(ctx, "r", 1, 0) // a retry of the same epoch, crashing mid-write
	ow, _ := w.Create(ctx, "state.bin")
	ow.Write([]byte("seco"))
	ow.Close()
	if _, err := s.LatestVerified(ctx, "r"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("a half-rewritten checkpoint verified: %v", err)
	}
}

func TestRetention(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, _ string) {
		ctx := context.Background()
		acc := []float64{0.70, 0.90, 0.75, 0.80, 0.60, 0.65} // epochs 1..6
		for i, a := range acc {
			put(t, s, "r", i+1, map[string][]byte{"state.bin": []byte(fmt.Sprint("epoch ", i+1))}, map[string]float64{"test_accuracy": a})
		}
		// A write that crashed long ago, before epoch 3's commit: garbage.
		w, _ := s.Begin(ctx, "r", 2, 500)
		ow, _ := w.Create(ctx, "state.bin")
		ow.Close()
		deleted, err := s.Prune(ctx, "r", Retention{KeepLast: 2, KeepBest: 2, Score: "test_accuracy", Mode: "max"})
		if err != nil {
			t.Fatal(err)
		}
		ids, _ := s.IDs(ctx, "r")
		want := []string{ID(2, 0), ID(4, 0), ID(5, 0), ID(6, 0)} // best two (0.90, 0.80) and last two
		if !slices.Equal(ids, want) {
			t.Fatalf("kept %v, want %v (deleted %v)", ids, want, deleted)
		}
		if !slices.Equal(deleted, []string{ID(1, 0), ID(2, 500), ID(3, 0)}) {
			t.Fatalf("deleted %v", deleted)
		}
	})
}

func TestRetentionNeverDeletesTheLatestVerified(t *testing.T) {
	root := t.TempDir()
	s, _ := Open(context.Background(), bloburl.FromPath(root)+"?metadata=skip", nil)
	defer s.Close()
	for e := 1; e <= 3; e++ {
		put(t, s, "r", e, map[string][]byte{"state.bin": []byte(fmt.Sprint("epoch ", e))}, nil)
	}
	flip(t, filepath.Join(root, "r", ID(3, 0), "state.bin"), 0) // the newest is corrupt
	deleted, err := s.Prune(context.Background(), "r", Retention{KeepLast: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(deleted, []string{ID(1, 0)}) {
		t.Fatalf("deleted %v, want only epoch 1: epoch 2 is the latest that verifies", deleted)
	}
	c, err := s.LatestVerified(context.Background(), "r")
	if err != nil || c.Manifest.ID != ID(2, 0) {
		t.Fatalf("after pruning, the latest verified is %v (%v)", c, err)
	}
}

func TestRunsShareABucketWithoutInterfering(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, _ string) {
		ctx := context.Background()
		for e := 1; e <= 3; e++ {
			put(t, s, "a", e, map[string][]byte{"state.bin": []byte("run a")}, nil)
			put(t, s, "ab", e+10, map[string][]byte{"state.bin": []byte("run ab")}, nil)
		}
		if _, err := s.Prune(ctx, "a", Retention{KeepLast: 1}); err != nil {
			t.Fatal(err)
		}
		if ids, _ := s.IDs(ctx, "ab"); len(ids) != 3 {
			t.Fatalf("pruning run a changed run ab: %v", ids)
		}
		a, err := s.LatestVerified(ctx, "a")
		if err != nil || string(readObject(t, a, "state.bin")) != "run a" || a.Manifest.Epoch != 3 {
			t.Fatalf("run a's latest: %+v %v", a, err)
		}
		ab, _ := s.LatestVerified(ctx, "ab")
		if ab.Manifest.Epoch != 13 {
			t.Fatalf("run ab's latest is epoch %d", ab.Manifest.Epoch)
		}
	})
}

func TestBadNamesAreRefused(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(ctx, "mem://", nil)
	for _, run := range []string{"", "../etc", "a/b", ".hidden", strings.Repeat("x", 201)} {
		if _, err := s.Begin(ctx, run, 1, 0); err == nil || !strings.Contains(err.Error(), "run name") {
			t.Errorf("run %q: %v", run, err)
		}
	}
	w, _ := s.Begin(ctx, "r", 1, 0)
	for _, name := range []string{"", "/abs", "a/../b", ManifestName, "sp ace", "a//b"} {
		if _, err := w.Create(ctx, name); err == nil {
			t.Errorf("object name %q was accepted", name)
		}
	}
	if err := (Retention{KeepBest: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "checkpoint.score") {
		t.Errorf("keep_best without score: %v", err)
	}
	if _, err := Open(ctx, "nosuch://x", nil); err == nil || !strings.Contains(err.Error(), "s3://") {
		t.Errorf("unknown scheme: %v", err)
	}
	// A bare '#' would open the folder before it: refused, saying %23.
	hashDir := t.TempDir()
	if _, err := Open(ctx, bloburl.FromPath(hashDir)+"/runs#2?create_dir=1", nil); err == nil || !strings.Contains(err.Error(), "%23") {
		t.Errorf("a URL with '#': %v", err)
	}
	if entries, _ := os.ReadDir(hashDir); len(entries) != 0 {
		t.Errorf("refusing a URL with '#' wrote %d entries into the folder before it", len(entries))
	}
	// The rest of the rule specs are checked by holds for Go callers too:
	// a relative path (it would land in the worker's own directory),
	// credentials in the URL, a folder in an S3 URL's path.
	t.Chdir(hashDir) // where file://runs would land
	for _, c := range []struct{ url, want string }{
		{"file://runs?create_dir=1", `"runs" reads as a host`},
		{bloburl.FromPath(hashDir) + "/../x", "a clean absolute path"},
		{"s3://user:secret@bucket", "no user or password"},
		{"s3://bucket/runs", "?prefix=runs/"},
	} {
		if _, err := Open(ctx, c.url, nil); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "storage URL") {
			t.Errorf("%s: %v; want the storage URL refused, saying %q", c.url, err, c.want)
		}
	}
	if entries, _ := os.ReadDir(hashDir); len(entries) != 0 {
		t.Errorf("refused URLs left %d entries in the working directory", len(entries))
	}
	// A '#' in a folder's name is written %23, as spec.CheckURL's error says.
	dir := t.TempDir()
	url := bloburl.FromPath(dir) + "/runs%232?create_dir=1"
	if err := spec.CheckURL("checkpoint.url", url); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(ctx, url, nil)
	if err != nil {
		t.Fatalf("a path with %%23: %v", err)
	}
	defer s2.Close()
	put(t, s2, "r", 1, map[string][]byte{"o": []byte("x")}, nil)
	if _, err := os.Stat(filepath.Join(dir, "runs#2", "r")); err != nil {
		t.Errorf("the store of %s is not in the folder runs#2: %v", url, err)
	}
}

func truncate(t *testing.T, path string, n int64) {
	if err := os.Truncate(path, n); err != nil {
		t.Fatal(err)
	}
}

func flip(t *testing.T, path string, at int) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[at] ^= 0xff
	os.WriteFile(path, b, 0o644)
}

func appendTo(t *testing.T, path string, extra []byte) {
	b, _ := os.ReadFile(path)
	os.WriteFile(path, append(b, extra...), 0o644)
}

func replaceIn(t *testing.T, path, old, new string) {
	b, _ := os.ReadFile(path)
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("%s does not contain %q", path, old)
	}
	os.WriteFile(path, bytes.ReplaceAll(b, []byte(old), []byte(new)), 0o644)
}

func TestLocalDiskObjectsAreFsynced(t *testing.T) {
	ctx := context.Background()
	for url, wantFile := range map[string]bool{bloburl.FromPath(t.TempDir()) + "?metadata=skip": true, "mem://": false} {
		s, _ := Open(ctx, url, nil)
		sw, err := s.newSyncedWriter(ctx, "k", false)
		if err != nil {
			t.Fatal(err)
		}
		sw.Write([]byte("x"))
		if got := sw.file != nil; got != wantFile {
			t.Errorf("%s: has a file to fsync: %v, want %v", url, got, wantFile)
		}
		if err := sw.Close(nil); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
}

func TestObjectsOfEveryBlockShapeRoundTripAndDetectCorruption(t *testing.T) {
	streamCounts := []int{1, 2, 4}
	if race.Enabled {
		// The race detector shadows every byte moved (about 80 s for this
		// test on a 2-core VM): one stream and four are the concurrency it
		// is there for.
		streamCounts = []int{1, 4}
	}
	for _, streams := range streamCounts {
		t.Run(fmt.Sprint(streams, "-streams"), func(t *testing.T) { everyBlockShape(t, streams) })
	}
}

// everyBlockShape writes objects of every shape of last block, then reads
// them back with streams range reads in flight, intact and with one byte flipped.
func everyBlockShape(t *testing.T, streams int) {
	ctx := context.Background()
	for _, size := range []int{0, 1, BlockSize - 1, BlockSize, BlockSize + 1, 3*BlockSize + 17} {
		root := t.TempDir()
		s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
		s.readStreams = streams
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i*7 + i/4096)
		}
		put(t, s, "r", 1, map[string][]byte{"o": data}, nil)
		c, err := s.LatestVerified(ctx, "r")
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		if got := readObject(t, c, "o"); !bytes.Equal(got, data) {
			t.Fatalf("size %d: read back %d different bytes", size, len(got))
		}
		if got, n, err := readByWriteTo(c, "o"); err != nil || n != int64(size) || !bytes.Equal(got, data) {
			t.Fatalf("size %d: io.Copy (WriteTo) gave %d bytes (%d counted), equal %v, error %v", size, len(got), n, bytes.Equal(got, data), err)
		}
		if size == 0 {
			s.Close()
			continue
		}
		flips := []int{size - 1, size / 2, 0}
		if race.Enabled {
			flips = flips[1:2]
		}
		for _, at := range flips {
			flip(t, filepath.Join(root, "r", ID(1, 0), "o"), at)
			r, _ := c.Open(ctx, "o")
			_, err := io.ReadAll(r)
			r.Close()
			var corrupt *CorruptError
			if !errors.As(err, &corrupt) {
				t.Fatalf("size %d, byte %d flipped: read returned %v, want a CorruptError", size, at, err)
			}
			if _, _, err := readByWriteTo(c, "o"); !errors.As(err, &corrupt) {
				t.Fatalf("size %d, byte %d flipped: io.Copy (WriteTo) returned %v, want a CorruptError", size, at, err)
			}
			flip(t, filepath.Join(root, "r", ID(1, 0), "o"), at) // restore
		}
		s.Close()
	}
}

// Objects are written next to their final path, never through $TMPDIR: a
// rename from the container's /tmp to a checkpoint volume fails (EXDEV).
func TestFileStoreWritesNoTemporaryFilesElsewhere(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := context.Background()
	s, err := Open(ctx, bloburl.FromPath(t.TempDir())+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.Begin(ctx, "run", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	o, err := w.Create(ctx, "state.bin")
	if err != nil {
		t.Fatal(err)
	}
	o.Write([]byte("weights"))
	// While the object is open its temporary file exists: not in $TMPDIR.
	if entries, _ := os.ReadDir(tmp); len(entries) != 0 {
		t.Fatalf("%d temporary files in $TMPDIR (%s)", len(entries), entries[0].Name())
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(ctx, Info{WorldSize: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LatestVerified(ctx, "run"); err != nil {
		t.Fatal(err)
	}
}

// TestFileStoreWritesNoAttributeSidecars: a plain file:// store writes each
// object alone (no fileblob ".attrs" sidecar, whose MD5 would cost a pass
// over every byte), and still reads, verifies and prunes checkpoints that a
// store with sidecars (metadata= in the URL, fileblob's own default) wrote.
func TestFileStoreWritesNoAttributeSidecars(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	sidecars := func() (n int) {
		filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && strings.HasSuffix(path, ".attrs") {
				n++
			}
			return nil
		})
		return n
	}
	old, err := Open(ctx, bloburl.FromPath(dir)+"?metadata=", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	put(t, old, "r", 1, map[string][]byte{"state.bin": []byte("epoch 1")}, nil)
	put(t, old, "r", 2, map[string][]byte{"state.bin": []byte("epoch 2")}, nil)
	before := sidecars()
	if before == 0 {
		t.Fatal("the store with metadata= wrote no sidecars: the test shows nothing")
	}
	s, err := Open(ctx, bloburl.FromPath(dir), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put(t, s, "r", 3, map[string][]byte{"state.bin": []byte("epoch 3")}, nil)
	if n := sidecars(); n != before {
		t.Fatalf("%d sidecars after a save through file://, want the %d written before", n, before)
	}
	c, err := s.LatestVerified(ctx, "r")
	if err != nil || c.Manifest.Epoch != 3 || string(readObject(t, c, "state.bin")) != "epoch 3" {
		t.Fatalf("latest verified: %v, %v", c, err)
	}
	if _, err := s.Prune(ctx, "r", Retention{KeepLast: 1}); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.IDs(ctx, "r"); !slices.Equal(ids, []string{ID(3, 0)}) {
		t.Fatalf("kept %v after pruning to the last, want only %s", ids, ID(3, 0))
	}
	if n := sidecars(); n != 0 {
		t.Fatalf("%d sidecars left after their checkpoints were pruned", n)
	}
}

// An object that shrinks or disappears between Open and the reads of its
// blocks ends in a CorruptError, never in its first bytes passed off as whole.
// The object has more blocks than the read-ahead holds (streamBuffers per
// stream), and the reader is still in block 0 when the object changes, so the
// last blocks are read after the change.
func TestObjectChangedWhileBeingReadIsCorrupt(t *testing.T) {
	ctx := context.Background()
	for _, change := range []string{"truncated", "removed"} {
		for _, streams := range []int{1, 2} {
			t.Run(fmt.Sprint(change, "-", streams), func(t *testing.T) {
				root := t.TempDir()
				s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
				defer s.Close()
				s.readStreams = streams
				put(t, s, "r", 1, map[string][]byte{"o": bytes.Repeat([]byte{3}, (2*streamBuffers+1)*BlockSize+9)}, nil)
				c, err := s.LatestVerified(ctx, "r")
				if err != nil {
					t.Fatal(err)
				}
				r, err := c.Open(ctx, "o")
				if err != nil {
					t.Fatal(err)
				}
				defer r.Close()
				buf := make([]byte, 1<<20)
				if _, err := io.ReadFull(r, buf); err != nil { // the first block is in
					t.Fatal(err)
				}
				path := filepath.Join(root, "r", ID(1, 0), "o")
				if change == "truncated" {
					err = os.Truncate(path, 2*BlockSize+5)
				} else {
					err = os.Remove(path)
				}
				if err != nil {
					t.Fatal(err)
				}
				_, err = io.Copy(io.Discard, r)
				var corrupt *CorruptError
				if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), "ended after") {
					t.Fatalf("reading an object %s after Open: %v, want a CorruptError saying where it ended", change, err)
				}
			})
		}
	}
}

// Closing a reader halfway stops its read-ahead: no goroutine outlives it.
func TestClosingAReaderEarlyStopsItsReadAhead(t *testing.T) {
	ctx := context.Background()
	s, _ := Open(ctx, bloburl.FromPath(t.TempDir())+"?metadata=skip", nil)
	defer s.Close()
	s.readStreams = 4
	put(t, s, "r", 1, map[string][]byte{"o": bytes.Repeat([]byte{5}, 9*BlockSize)}, nil)
	c, err := s.LatestVerified(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	for range 20 {
		r, err := c.Open(ctx, "o")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, make([]byte, BlockSize+1)); err != nil {
			t.Fatal(err)
		}
		r.Close()
	}
	r, _ := c.Open(ctx, "o")
	r.Close()
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("a read after Close returned %v, want os.ErrClosed", err)
	}
	// A goroutine that has signalled its WaitGroup may still be returning:
	// give the count a moment to settle.
	after := runtime.NumGoroutine()
	for deadline := time.Now().Add(2 * time.Second); after > before && time.Now().Before(deadline); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	if after > before {
		t.Fatalf("%d goroutines before 20 readers closed halfway, %d after", before, after)
	}
}

// BytesRead counts what finding and loading a checkpoint read from storage:
// manifests and objects, of the one returned and of the newer ones passed
// over, exactly (every byte of each file here is read once per pass).
func TestBytesReadCountsWhatAReadTookFromStorage(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
	defer s.Close()
	objects := map[string][]byte{"a": bytes.Repeat([]byte{1}, BlockSize+5), "b": []byte("small")}
	put(t, s, "r", 1, objects, nil)
	put(t, s, "r", 2, map[string][]byte{"a": objects["a"]}, nil) // damaged: its only object fails
	flip(t, filepath.Join(root, "r", ID(2, 0), "a"), 7)
	size := func(id string, names ...string) int64 {
		var n int64
		for _, name := range names {
			fi, err := os.Stat(filepath.Join(root, "r", id, name))
			if err != nil {
				t.Fatal(err)
			}
			n += fi.Size()
		}
		return n
	}
	damaged, all := size(ID(2, 0), ManifestName, "a"), size(ID(1, 0), ManifestName, "a", "b")
	readAll := func(c *Checkpoint) error {
		for _, name := range []string{"a", "b"} {
			r, err := c.Open(ctx, name)
			if err != nil {
				return err
			}
			_, err = io.Copy(io.Discard, r)
			r.Close()
			if err != nil {
				return err
			}
		}
		return nil
	}
	c, err := s.RestoreLatest(ctx, "r", readAll)
	if err != nil {
		t.Fatal(err)
	}
	if want := damaged + all; c.Manifest.ID != ID(1, 0) || c.BytesRead() != want {
		t.Fatalf("RestoreLatest past a damaged checkpoint: %s, %d bytes read, want %s, %d", c.Manifest.ID, c.BytesRead(), ID(1, 0), want)
	}
	c, err = s.LatestVerified(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := readAll(c); err != nil {
		t.Fatal(err)
	}
	if want := damaged + all + size(ID(1, 0), "a", "b"); c.BytesRead() != want {
		t.Fatalf("LatestVerified, then a load: %d bytes read, want %d (verification and load)", c.BytesRead(), want)
	}
	c, err = s.Committed(ctx, "r", ID(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	r, _ := c.Open(ctx, "b")
	io.Copy(io.Discard, r)
	r.Close()
	if want := size(ID(1, 0), ManifestName, "b"); c.BytesRead() != want {
		t.Fatalf("one object of a committed checkpoint: %d bytes read, want %d", c.BytesRead(), want)
	}
}

// Object names are what every blob store takes as part of a key.
func TestValidObjectName(t *testing.T) {
	for name, want := range map[string]bool{
		"state.bin": true, "shards/3/epoch=3-step=100.ckpt": true, "a+b@c_d-e": true,
		strings.Repeat("p", 200) + "/" + strings.Repeat("q", 200): true,
		strings.Repeat("p", 201):                                  false, // a part past what a file system takes with fileblob's suffix
		strings.Repeat("p/", 256) + "p":                           false, // 513 bytes
		"":                                                        false,
		"optimizer state.pt":                                      false,
		"modèle.bin":                                              false,
		"a..b":                                                    false,
		"../up":                                                   false,
		"/abs":                                                    false,
		"dir/":                                                    false,
		"a//b":                                                    false,
		ManifestName:                                              false,
	} {
		if got := ValidObjectName(name); got != want {
			t.Errorf("ValidObjectName(%.40q…) = %v; want %v", name, got, want)
		}
	}
}
