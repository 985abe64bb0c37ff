package checkpoint

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// copyTree copies the fixture folder src into dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), data, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// openFixture copies the checkpoints of testdata/<dir> into a store and
// returns it, its root and the latest verified checkpoint of run dir, which
// must be of the given format and cursor and hold state.bin reading
// "weights written by format <format>".
func openFixture(t *testing.T, dir string, format, epoch, step int) (*Store, string, *Checkpoint) {
	t.Helper()
	root := t.TempDir()
	copyTree(t, filepath.Join("testdata", dir), root)
	s, err := Open(context.Background(), "file://"+root+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := s.LatestVerified(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Manifest.Format != format || c.Manifest.Epoch != epoch || c.Manifest.Step != step {
		t.Fatalf("manifest %+v; want format %d at epoch %d step %d", c.Manifest, format, epoch, step)
	}
	if got, want := string(readObject(t, c, "state.bin")), fmt.Sprintf("weights written by format %d\n", format); got != want {
		t.Fatalf("state.bin reads %q; want %q", got, want)
	}
	return s, root, c
}

// flippedByteIsCaught flips a byte of c's object name and reads it: the
// read must end in a CorruptError naming algo.
func flippedByteIsCaught(t *testing.T, c *Checkpoint, root, name, algo string) {
	t.Helper()
	flip(t, filepath.Join(root, c.Manifest.Run, c.Manifest.ID, name), 5)
	r, _ := c.Open(context.Background(), name)
	_, err := io.ReadAll(r)
	r.Close()
	var corrupt *CorruptError
	if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), algo) {
		t.Fatalf("a flipped byte in a format %d object read as %v; want a CorruptError naming %s", c.Manifest.Format, err, algo)
	}
}

// A checkpoint written by the release before format 2 (testdata/format1,
// SHA-256 hash lists) still verifies and loads, and a damaged byte in it is
// still caught.
func TestFormatOneCheckpointsStillLoad(t *testing.T) {
	s, root, c := openFixture(t, "format1", 1, 3, 7)
	// A clone of it keeps its format: its hashes are checked against the source's.
	m, err := s.Clone(context.Background(), c, "format1-clone")
	if err != nil {
		t.Fatal(err)
	}
	if m.Format != 1 || m.Objects[1].SHA256 != c.Manifest.Objects[1].SHA256 {
		t.Fatalf("clone %+v", m)
	}
	flippedByteIsCaught(t, c, root, "state.bin", "SHA-256")
}

// New checkpoints are format 2, BLAKE3, for objects of every block shape;
// a flipped byte anywhere is caught.
func TestFormatTwoHashesWithBLAKE3(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{1, BlockSize + 1} {
		root := t.TempDir()
		s, _ := Open(ctx, "file://"+root+"?metadata=skip", nil)
		data := bytes.Repeat([]byte{7, 1, 3}, size/3+1)[:size]
		m := put(t, s, "r", 1, map[string][]byte{"o": data}, nil)
		if m.Format != 2 || len(m.Objects[0].BLAKE3) != 64 || m.Objects[0].SHA256 != "" {
			t.Fatalf("size %d: manifest %+v; want format 2 with a BLAKE3 hash only", size, m)
		}
		c, err := s.LatestVerified(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		flip(t, filepath.Join(root, "r", ID(1, 0), "o"), size-1)
		r, _ := c.Open(ctx, "o")
		_, err = io.ReadAll(r)
		r.Close()
		var corrupt *CorruptError
		if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), "BLAKE3") {
			t.Fatalf("size %d: a flipped byte read as %v; want a CorruptError naming BLAKE3", size, err)
		}
		s.Close()
	}
}

// A manifest whose objects carry another format's hash, or none, or both,
// is not a checkpoint even when its own checksum is right: a reader must
// never pick the check it runs from what a damaged manifest says.
func TestManifestWithTheWrongHashIsSkipped(t *testing.T) {
	ctx := context.Background()
	for name, edit := range map[string]func(o *Object){
		"sha256 in format 2": func(o *Object) { o.SHA256, o.BLAKE3 = o.BLAKE3, "" },
		"no hash":            func(o *Object) { o.BLAKE3 = "" },
		"both hashes":        func(o *Object) { o.SHA256 = o.BLAKE3 },
		"short hash":         func(o *Object) { o.BLAKE3 = o.BLAKE3[:10] },
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			s, _ := Open(ctx, "file://"+root+"?metadata=skip", nil)
			defer s.Close()
			put(t, s, "r", 1, map[string][]byte{"o": []byte("old")}, nil)
			m := put(t, s, "r", 2, map[string][]byte{"o": []byte("new")}, nil)
			edit(&m.Objects[0])
			m.Checksum = m.checksum()
			data, _ := json.Marshal(m)
			if err := os.WriteFile(filepath.Join(root, "r", ID(2, 0), ManifestName), data, 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := s.LatestVerified(ctx, "r")
			if err != nil {
				t.Fatal(err)
			}
			if c.Manifest.Epoch != 1 || len(c.Skipped) != 1 || !strings.Contains(c.Skipped[0].Reason, "BLAKE3") {
				t.Fatalf("restored epoch %d, skipped %+v; want epoch 1, the altered one skipped for its hash", c.Manifest.Epoch, c.Skipped)
			}
		})
	}
}

// A format 2 checkpoint written by the release that hashed with
// lukechampine.com/blake3 (testdata/format2) verifies and loads with today's
// BLAKE3, and a damaged byte in it is caught.
func TestFormatTwoCheckpointsOfTheEarlierLibraryStillLoad(t *testing.T) {
	_, root, c := openFixture(t, "format2", 2, 4, 9)
	flippedByteIsCaught(t, c, root, "state.bin", "BLAKE3")
}

// The BLAKE3 hash lists of objects of every block shape are the ones the
// earlier library (lukechampine.com/blake3 v1.4.1) computed for the same
// bytes, recorded here, so checkpoints it wrote verify; and BLAKE3 itself
// gives the specification's test vector for the empty input.
func TestBLAKE3HashListsMatchTheEarlierLibrary(t *testing.T) {
	if got := hex.EncodeToString(func() []byte { s := hashBLAKE3.sum(nil); return s[:] }()); got != "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262" {
		t.Fatalf("BLAKE3 of the empty input is %s; the specification's test vector is af1349b9…3262", got)
	}
	for _, tc := range []struct {
		size int
		root string
	}{
		{0, "82878ed8a480ee41775636820e05a934ca5c747223ca64306658ee5982e6c227"},
		{1, "2bf4d007e0cefcaf167e4641bb0f343b402775122dbff17b11514e9cbd21eefa"},
		{BlockSize - 1, "049c2a31220595d13f6023b600f0c3e3e1cc55416dae3e1657e8c90104a43027"},
		{BlockSize + 1, "071b70864b78b91db6553f2b60ed3d6c6251baca4fb905aad946193fbef55faa"},
		{2*BlockSize + 5, "dbd1df989731384db32d793708f02ac5c99a1661d9a439190d4fc664f29f8618"},
	} {
		data := make([]byte, tc.size)
		for i := range data {
			data[i] = byte(i*31 + i/BlockSize)
		}
		h := newHashList(hashBLAKE3)
		n := 0
		for off := 0; off < len(data) || n == 0; off += BlockSize {
			h.hash(n, data[off:min(off+BlockSize, len(data))], nil)
			n++
		}
		if got := h.root(n); got != tc.root {
			t.Errorf("%d bytes: hash list root %s; the earlier library's was %s", tc.size, got, tc.root)
		}
	}
}
