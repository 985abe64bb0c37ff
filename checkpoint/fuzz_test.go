package checkpoint

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// fuzzObjects are the two checkpoints' objects: one small, one larger,
// one empty. All of one block: objects of several blocks cost 8 MiB each
// and a fuzzer's run would then be a few cases a second
// (TestObjectsOfEveryBlockShapeRoundTripAndDetectCorruption damages those).
func fuzzObjects(epoch int) map[string][]byte {
	big := make([]byte, 100_000)
	for i := range big {
		big[i] = byte(i*31 + epoch)
	}
	return map[string][]byte{
		"state.bin":  []byte("weights of epoch " + string(rune('0'+epoch))),
		"larger.bin": big,
		"empty.bin":  nil,
	}
}

// FuzzDamagedCheckpointIsNeverLoaded damages the newest of two checkpoints
// in any way a disk, a network or a stranger with write access to the
// bucket might: a byte changed, a file cut short, grown, removed or
// replaced, in the manifest or in any object. Whatever the damage, the
// store never panics and never hands out bytes that were not written:
// LatestVerified returns the newest checkpoint with exactly its objects,
// or the older one with exactly its objects, or an error; reading a
// damaged checkpoint directly fails (Verify, or the read of the object).
func FuzzDamagedCheckpointIsNeverLoaded(f *testing.F) {
	// Two stores of the same checkpoints: without a key, and with one (every
	// block GMAC-tagged, the manifest signed); a case's file byte picks one
	// by its top bit.
	var templates [2]string
	var files []string // the newest checkpoint's files, relative to it
	for signed := range 2 {
		template := f.TempDir()
		templates[signed] = template
		s, err := Open(context.Background(), bloburl.FromPath(template)+"?metadata=skip", nil)
		if err != nil {
			f.Fatal(err)
		}
		if signed == 1 {
			s.Sign(fuzzKey)
		}
		for epoch := 1; epoch <= 2; epoch++ {
			w, err := s.Begin(context.Background(), "r", epoch, 0)
			if err != nil {
				f.Fatal(err)
			}
			for name, data := range fuzzObjects(epoch) {
				ow, err := w.Create(context.Background(), name)
				if err != nil {
					f.Fatal(err)
				}
				ow.Write(data)
				if err := ow.Close(); err != nil {
					f.Fatal(err)
				}
			}
			if _, err := w.Commit(context.Background(), Info{WorldSize: 2, Meta: map[string]string{"backend": "test"}}); err != nil {
				f.Fatal(err)
			}
		}
		s.Close()
		newest := filepath.Join(template, "r", ID(2, 0))
		files = files[:0]
		filepath.WalkDir(newest, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(newest, p)
				files = append(files, rel)
			}
			return nil
		})
		slices.Sort(files)
		if len(files) < 4 {
			f.Fatalf("the newest checkpoint has files %v; want its manifest and 3 objects", files)
		}
	}

	// Seeds: every kind of damage to every file, at its start, middle and end.
	for i := range files {
		for kind := range byte(damageKinds) {
			for _, at := range []uint32{0, 17, 50_000, 1<<32 - 1} {
				f.Add(byte(i), kind, at, byte(0x5a), []byte(`{"format":3}`))
				f.Add(byte(i)|0x80, kind, at, byte(0x5a), []byte(`{"format":3}`))
			}
		}
	}
	f.Fuzz(func(t *testing.T, file, kind byte, at uint32, value byte, extra []byte) {
		var s *Store
		// Not t.TempDir(): a fuzz case's name holds '#', which a file:// URL
		// reads as the start of a fragment.
		root, err := os.MkdirTemp("", "damaged-checkpoint-")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(root)
		signed := file&0x80 != 0
		copyTree(t, templates[b2i(signed)], root)
		name := files[int(file&0x7f)%len(files)]
		changed := damage(t, filepath.Join(root, "r", ID(2, 0), name), kind%damageKinds, at, value, extra)

		ctx := context.Background()
		s, err = Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if signed {
			s.Sign(fuzzKey)
		}
		c, err := s.LatestVerified(ctx, "r")
		if err != nil {
			t.Fatalf("%s damaged (kind %d at %d): the older checkpoint is intact, yet: %v", name, kind%damageKinds, at, err)
		}
		epoch := c.Manifest.Epoch
		if c.Manifest.ID != ID(epoch, 0) || (epoch != 1 && epoch != 2) {
			t.Fatalf("loaded %s (epoch %d); want %s or %s", c.Manifest.ID, epoch, ID(1, 0), ID(2, 0))
		}
		mustHoldExactly(t, c, fuzzObjects(epoch))
		if epoch == 2 && changed && name != ManifestName {
			t.Fatalf("object %s was damaged (kind %d at %d), yet the damaged checkpoint verified", name, kind%damageKinds, at)
		}

		// Read directly, without LatestVerified's fallback: the damaged
		// checkpoint fails as a whole or reads exactly what was written.
		if d, err := s.Verify(ctx, "r", ID(2, 0)); err == nil {
			mustHoldExactly(t, d, fuzzObjects(2))
		} else if !changed {
			t.Fatalf("an undamaged checkpoint failed to verify: %v", err)
		}
	})
}

var fuzzKey = []byte("the-fuzzed-pool-key-of-at-least-32-bytes")

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// damageKinds is how many kinds of damage damage knows.
const damageKinds = 5

// damage changes the file at path by kind: 0 a byte XORed with value (made
// non-zero), 1 cut to at bytes, 2 extra appended, 3 removed, 4 replaced by
// extra. It reports whether the file's bytes changed.
func damage(t *testing.T, path string, kind byte, at uint32, value byte, extra []byte) bool {
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	after := slices.Clone(before)
	switch kind {
	case 0:
		if len(after) > 0 {
			after[int(at)%len(after)] ^= value | 1
		}
	case 1:
		after = after[:int(at)%(len(after)+1)]
	case 2:
		after = append(after, extra...)
	case 3:
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		return true
	case 4:
		after = slices.Clone(extra)
	}
	if err := os.WriteFile(path, after, 0o644); err != nil {
		t.Fatal(err)
	}
	return !bytes.Equal(before, after)
}

// mustHoldExactly reads every object of c, by Read and by WriteTo, and
// fails unless c lists exactly want's objects and each reads as written.
func mustHoldExactly(t *testing.T, c *Checkpoint, want map[string][]byte) {
	t.Helper()
	var names []string
	for _, o := range c.Manifest.Objects {
		names = append(names, o.Name)
	}
	if len(names) != len(want) {
		t.Fatalf("%s lists objects %v; want %d", c.Manifest.ID, names, len(want))
	}
	for name, data := range want {
		r, err := c.Open(context.Background(), name)
		if err != nil {
			t.Fatalf("%s: opening %s: %v", c.Manifest.ID, name, err)
		}
		got, err := io.ReadAll(r)
		r.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: %s read %d bytes (want %d), equal %v, error %v", c.Manifest.ID, name, len(got), len(data), bytes.Equal(got, data), err)
		}
		got, n, err := readByWriteTo(c, name)
		if err != nil || n != int64(len(data)) || !bytes.Equal(got, data) {
			t.Fatalf("%s: %s by WriteTo: %d bytes, equal %v, error %v", c.Manifest.ID, name, n, bytes.Equal(got, data), err)
		}
	}
}
