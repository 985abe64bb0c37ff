package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// TestSignedStoresLoadOnlyWhatTheirKeySigned: a store with a pool key signs
// its manifests; a store with the same key loads them; one with another key,
// or a writer without a key (whoever can write the bucket), cannot make a
// checkpoint it loads: forged and re-checksummed manifests are skipped as
// corrupt and the newest signed one is restored.
func TestSignedStoresLoadOnlyWhatTheirKeySigned(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	url := bloburl.FromPath(root) + "?metadata=skip"
	open := func(key []byte) *Store {
		s, err := Open(ctx, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		if key != nil {
			s.Sign(key)
		}
		return s
	}
	key := []byte("the-pool-key-of-at-least-32-bytes-long")
	signed := open(key)
	m := put(t, signed, "r", 1, map[string][]byte{"state.bin": []byte("signed state")}, map[string]float64{"test_accuracy": 0.5})
	if m.Signature == "" || m.KeyID != KeyID(key) {
		t.Fatalf("manifest not signed: %+v", m)
	}
	if _, err := open(key).Verify(ctx, "r", m.ID); err != nil {
		t.Fatalf("a store with the same key: %v", err)
	}
	if _, err := open(nil).Verify(ctx, "r", m.ID); err != nil {
		t.Fatalf("a store without a key reads signed checkpoints too: %v", err)
	}
	if _, err := open([]byte("another-pool-key-of-at-least-32-bytes")).Verify(ctx, "r", m.ID); err == nil || !strings.Contains(err.Error(), "another key") {
		t.Fatalf("a store with another key: %v; want it refused, naming the key", err)
	}

	// Someone who can write the bucket but has no key writes a newer checkpoint...
	forged := put(t, open(nil), "r", 2, map[string][]byte{"state.bin": []byte("forged state")}, nil)
	// ...and alters the signed one's metrics, recomputing its checksum.
	path := filepath.Join(root, "r", m.ID, ManifestName)
	var altered Manifest
	data, _ := os.ReadFile(path)
	json.Unmarshal(data, &altered)
	altered.Metrics["test_accuracy"] = 0.99
	altered.Checksum = altered.checksum()
	data, _ = json.Marshal(altered)
	put(t, signed, "r", 0, map[string][]byte{"state.bin": []byte("older signed state")}, nil)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := signed.LatestVerified(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if got.Manifest.ID != ID(0, 0) || string(readObject(t, got, "state.bin")) != "older signed state" {
		t.Fatalf("restored %s; want the only intact signed checkpoint %s", got.Manifest.ID, ID(0, 0))
	}
	reasons := map[string]string{}
	for _, s := range got.Skipped {
		reasons[s.ID] = s.Reason
	}
	if !strings.Contains(reasons[forged.ID], "not signed") || !strings.Contains(reasons[m.ID], "signature mismatch") {
		t.Fatalf("skipped %v; want the forged one as unsigned and the altered one as a signature mismatch", got.Skipped)
	}
}

// On a store with a key, every object of a format 3 checkpoint carries a
// GMAC root under a key of its own (a nonce of its own), and a store with
// the key checks it block by block: an object whose bytes were swapped for
// others with a matching checksum, under a manifest the key signed (as a
// shard list altered before rank 0 signs it would give), is refused for its
// MAC. A store without a key still loads signed checkpoints, checking their
// checksums.
func TestSignedFormatThreeAuthenticatesEveryBlock(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	url := bloburl.FromPath(root) + "?metadata=skip"
	key := []byte("the-pool-key-of-at-least-32-bytes-long")
	signed, _ := Open(ctx, url, nil)
	defer signed.Close()
	signed.Sign(key)
	state := bytes.Repeat([]byte("weights "), BlockSize/8+3) // two blocks
	m := put(t, signed, "r", 1, map[string][]byte{"state.bin": state, "meta.json": []byte("{}")}, nil)
	if m.Format != 3 || m.Objects[0].MAC == "" || m.Objects[1].MAC == "" || m.Objects[0].MACNonce == m.Objects[1].MACNonce {
		t.Fatalf("objects %+v; want a MAC on each, under nonces of their own", m.Objects)
	}
	keyless, _ := Open(ctx, url, nil)
	defer keyless.Close()
	for name, s := range map[string]*Store{"with the key": signed, "without a key": keyless} {
		if c, err := s.Verify(ctx, "r", m.ID); err != nil || !bytes.Equal(readObject(t, c, "state.bin"), state) {
			t.Fatalf("a store %s: %v", name, err)
		}
	}

	forged := slices.Clone(state)
	copy(forged[BlockSize+1:], "FORGED")
	if err := os.WriteFile(filepath.Join(root, "r", m.ID, "state.bin"), forged, 0o644); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(m.Objects, func(o Object) bool { return o.Name == "state.bin" })
	m.Objects[i].XXH3 = hashListRoot(hashXXH3, forged)
	m.Checksum = m.checksum()
	m.Signature = signature(key, m.Checksum)
	data, _ := json.Marshal(m)
	if err := os.WriteFile(filepath.Join(root, "r", m.ID, ManifestName), data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := signed.Verify(ctx, "r", m.ID)
	var corrupt *CorruptError
	if !errors.As(err, &corrupt) || !strings.Contains(err.Error(), "GMAC") {
		t.Fatalf("a swapped block with a matching checksum verified as %v; want a CorruptError naming its GMAC", err)
	}
	m.Objects[i].MAC, m.Objects[i].MACNonce = "", ""
	m.Checksum = m.checksum()
	m.Signature = signature(key, m.Checksum)
	data, _ = json.Marshal(m)
	os.WriteFile(filepath.Join(root, "r", m.ID, ManifestName), data, 0o644)
	if _, err := signed.Verify(ctx, "r", m.ID); err == nil || !strings.Contains(err.Error(), "no MAC") {
		t.Fatalf("a signed format 3 object without a MAC verified as %v; want it refused", err)
	}
}

// Shard lists are written by each rank and signed only when rank 0
// commits: someone who can write the bucket and swaps a rank's object,
// fixing its size and checksum in the list before rank 0 adopts it, gets
// a signed checkpoint that no store with the key loads; a list stripped
// of its MACs is not adopted at all.
func TestAShardAlteredBeforeAdoptionIsNeverLoaded(t *testing.T) {
	ctx := context.Background()
	for _, strip := range []bool{false, true} {
		root := t.TempDir()
		s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
		s.Sign([]byte("the-pool-key-of-at-least-32-bytes-long"))
		writeShards(t, s, "run", 2, func(r int) string { return fmt.Sprintf("rank %d's optimizer shard of ", r) })
		dir := filepath.Join(root, "run", ID(1, 5))
		forged := []byte("rank 1's OPTIMIZER shard of state")
		if err := os.WriteFile(filepath.Join(dir, "shards", "1", "state"), forged, 0o644); err != nil {
			t.Fatal(err)
		}
		var list []Object
		data, _ := os.ReadFile(filepath.Join(dir, shardListName(1)))
		json.Unmarshal(data, &list)
		for i := range list {
			if list[i].Name == ShardPrefix(1)+"state" {
				list[i].XXH3 = hashListRoot(hashXXH3, forged)
			}
			if strip {
				list[i].MAC, list[i].MACNonce = "", ""
			}
		}
		data, _ = json.Marshal(list)
		os.WriteFile(filepath.Join(dir, shardListName(1)), data, 0o644)

		w, _ := s.Begin(ctx, "run", 1, 5)
		err := w.AdoptShards(ctx, 2)
		if strip {
			if err == nil || !strings.Contains(err.Error(), "without a MAC") {
				t.Fatalf("a shard list without MACs adopted: %v", err)
			}
			s.Close()
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Commit(ctx, Info{WorldSize: 2}); err != nil {
			t.Fatal(err)
		}
		if c, err := s.LatestVerified(ctx, "run"); err == nil {
			t.Fatalf("restored %s, holding a forged shard", c.Manifest.ID)
		} else if !errors.Is(err, ErrNoCheckpoint) || !strings.Contains(err.Error(), "GMAC") {
			t.Fatalf("restoring: %v; want no checkpoint, the forged one skipped for its GMAC", err)
		}
		s.Close()
	}
}

// Under GODEBUG=fips140=only Go refuses GCM with nonces of the caller's
// choosing, which format 3's GMAC uses: a store with a key then fails to
// save and to load, saying so, and calls no checkpoint corrupt (a run
// must not skip past good checkpoints for its own process's settings).
// The test runs itself again with that setting, which only a process's
// start can choose.
func TestWithAKeyUnderFIPSOnlyModeSavesAndLoadsFailClearly(t *testing.T) {
	if os.Getenv("CHECKPOINT_FIPS_CHILD") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestWithAKeyUnderFIPSOnlyModeSavesAndLoadsFailClearly$", "-test.v")
		cmd.Env = append(os.Environ(), "CHECKPOINT_FIPS_CHILD=1", "GODEBUG=fips140=only")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("the run under fips140=only: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), "--- PASS") {
			t.Fatalf("the run under fips140=only passed nothing:\n%s", out)
		}
		return
	}
	ctx := context.Background()
	_, root, _ := openFixture(t, "format3", 3, 5, 11) // loads without a key: checksums only
	s, err := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Sign([]byte("the-format-3-fixture-pool-key-of-32-bytes"))
	c, err := s.Committed(ctx, "format3", ID(5, 11))
	if err != nil {
		t.Fatal(err)
	}
	var corrupt *CorruptError
	if _, err := c.Open(ctx, "state.bin"); err == nil || errors.As(err, &corrupt) || !strings.Contains(err.Error(), "FIPS") {
		t.Fatalf("opening a signed object under fips140=only: %v; want an error naming FIPS, not a CorruptError", err)
	}
	w, err := s.Begin(ctx, "new", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Create(ctx, "state.bin"); err == nil || !strings.Contains(err.Error(), "FIPS") {
		t.Fatalf("saving with a key under fips140=only: %v; want an error naming FIPS", err)
	}
}
