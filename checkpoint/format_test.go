package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/internal/bloburl"
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
	s, err := Open(context.Background(), bloburl.FromPath(root)+"?metadata=skip", nil)
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

// New checkpoints are format 3, XXH3-128, for objects of every block shape;
// a flipped byte anywhere is caught.
func TestFormatThreeChecksumsWithXXH3(t *testing.T) {
	ctx := context.Background()
	for _, size := range []int{1, BlockSize + 1} {
		root := t.TempDir()
		s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
		data := bytes.Repeat([]byte{7, 1, 3}, size/3+1)[:size]
		m := put(t, s, "r", 1, map[string][]byte{"o": data}, nil)
		if o := m.Objects[0]; m.Format != 3 || len(o.XXH3) != 64 || o.SHA256 != "" || o.BLAKE3 != "" || o.MAC != "" || o.MACNonce != "" {
			t.Fatalf("size %d: manifest %+v; want format 3 with an XXH3 root only (no key, no MAC)", size, m)
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
		if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), "XXH3-128") {
			t.Fatalf("size %d: a flipped byte read as %v; want a CorruptError naming XXH3-128", size, err)
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
		"blake3 in format 3": func(o *Object) { o.BLAKE3, o.XXH3 = o.XXH3, "" },
		"no hash":            func(o *Object) { o.XXH3 = "" },
		"both hashes":        func(o *Object) { o.SHA256 = o.XXH3 },
		"short hash":         func(o *Object) { o.XXH3 = o.XXH3[:10] },
		"a MAC, no nonce":    func(o *Object) { o.MAC = o.XXH3 },
		"a MAC not in hex":   func(o *Object) { o.MAC, o.MACNonce = strings.Repeat("z", 64), strings.Repeat("0", 32) },
	} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
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
			if c.Manifest.Epoch != 1 || len(c.Skipped) != 1 || !strings.Contains(c.Skipped[0].Reason, "XXH3-128") {
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

// A signed format 3 checkpoint written when the format was made
// (testdata/format3) loads with and without its key: with it, every block's
// GMAC is checked, so the MAC's derivation (HKDF salt and info, the nonce
// of each block) cannot change without this failing. A flipped byte is
// caught by the checksum.
func TestFormatThreeCheckpointsLoadWithTheirKey(t *testing.T) {
	_, root, c := openFixture(t, "format3", 3, 5, 11)
	s, err := Open(context.Background(), bloburl.FromPath(root)+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Sign([]byte("the-format-3-fixture-pool-key-of-32-bytes"))
	keyed, err := s.LatestVerified(context.Background(), "format3")
	if err != nil {
		t.Fatalf("the fixture with its key: %v", err)
	}
	if got := string(readObject(t, keyed, "state.bin")); got != "weights written by format 3\n" {
		t.Fatalf("state.bin reads %q", got)
	}
	flippedByteIsCaught(t, c, root, "state.bin", "XXH3-128")
}

// blockPattern is size bytes whose pattern differs from block to block.
func blockPattern(size int) []byte {
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*31 + i/BlockSize)
	}
	return data
}

// hashListRoot is the hash list root of data in algo, its blocks checked whole.
func hashListRoot(algo hashAlgo, data []byte) string {
	h := newHashList(blockCheck{algo: algo})
	n := 0
	for off := 0; off < len(data) || n == 0; off += BlockSize {
		h.hash(n, data[off:min(off+BlockSize, len(data))], nil)
		n++
	}
	return h.root(n)
}

// The hash lists of objects of every block shape, in formats 2 and 3, are
// the ones recorded here, whether the blocks are checked whole or in
// pieces (a running sum, as large unaligned writes take them), so neither
// format can drift with its library. BLAKE3's are those the earlier library
// (lukechampine.com/blake3 v1.4.1) computed for the same bytes, so
// checkpoints it wrote verify. XXH3's were checked against the reference
// implementation when format 3 was made: each block's `xxhsum -H2`
// (Debian's xxhash 0.8.1), concatenated and hashed with SHA-256, gave these
// roots. Each gives its specification's value for the empty input.
func TestHashListsAreFixed(t *testing.T) {
	for algo, empty := range map[hashAlgo]string{
		hashBLAKE3: "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
		hashXXH3:   "99aa06d3014798d86001c324468d497f" + strings.Repeat("0", 32), // 128 bits, no tag
	} {
		if got := fmt.Sprintf("%x", blockCheck{algo: algo}.sum(0, nil)); got != empty {
			t.Errorf("%s of the empty input is %s; the specification gives %s", algo, got, empty)
		}
	}
	for _, tc := range []struct {
		algo hashAlgo
		size int
		root string
	}{
		{hashBLAKE3, 0, "82878ed8a480ee41775636820e05a934ca5c747223ca64306658ee5982e6c227"},
		{hashBLAKE3, 1, "2bf4d007e0cefcaf167e4641bb0f343b402775122dbff17b11514e9cbd21eefa"},
		{hashBLAKE3, BlockSize - 1, "049c2a31220595d13f6023b600f0c3e3e1cc55416dae3e1657e8c90104a43027"},
		{hashBLAKE3, BlockSize + 1, "071b70864b78b91db6553f2b60ed3d6c6251baca4fb905aad946193fbef55faa"},
		{hashBLAKE3, 2*BlockSize + 5, "dbd1df989731384db32d793708f02ac5c99a1661d9a439190d4fc664f29f8618"},
		{hashXXH3, 0, "5e962a7229a481a37be83531cb161dead8eedafe66b592ca77e10e29489e0b30"},
		{hashXXH3, 1, "c7b141821ef0dd5cec66663ff718f719ae511db2a6ccdc06847acae5cb7a19eb"},
		{hashXXH3, BlockSize - 1, "cd3c1d5f0b9073825eab814e8c2d832351f5eba1e3fcafaa6f2c1403560d7e84"},
		{hashXXH3, BlockSize + 1, "053ce40f816c068cf33aed37e79973c110d310929e3ef2df8e1b1152a88636f4"},
		{hashXXH3, 2*BlockSize + 5, "ff68d553c702c8d20481703d3020288631d7676326caccc344705a26e1e75c4a"},
	} {
		data := blockPattern(tc.size)
		pieces := newHashList(blockCheck{algo: tc.algo})
		n := 0
		for off := 0; off < len(data) || n == 0; off += BlockSize {
			block := data[off:min(off+BlockSize, len(data))]
			head := pieces.check.newHead()
			head.Write(block[:len(block)/3])
			pieces.hashAfter(n, head, block[len(block)/3:], nil)
			n++
		}
		got, inPieces := hashListRoot(tc.algo, data), pieces.root(n)
		if got != tc.root || inPieces != got {
			t.Errorf("%s, %d bytes: hash list root %s whole, %s in pieces; recorded %s", tc.algo, tc.size, got, inPieces, tc.root)
		}
	}
}
