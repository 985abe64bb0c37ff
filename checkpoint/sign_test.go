package checkpoint

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSignedStoresLoadOnlyWhatTheirKeySigned: a store with a pool key signs
// its manifests; a store with the same key loads them; one with another key,
// or a writer without a key (whoever can write the bucket), cannot make a
// checkpoint it loads: forged and re-checksummed manifests are skipped as
// corrupt and the newest signed one is restored.
func TestSignedStoresLoadOnlyWhatTheirKeySigned(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	url := "file://" + root + "?metadata=skip"
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
