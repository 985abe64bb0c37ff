package checkpoint

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// A clone is the source's objects at the source's cursor under another
// run, signed by the target store and naming its source; a source damaged
// after it was verified is caught while copying, and nothing is committed.
func TestCloneCopiesAVerifiedCheckpointAndNeverAHalfOne(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	src, _ := Open(ctx, bloburl.FromPath(root)+"/a?metadata=skip&create_dir=1", nil)
	dst, _ := Open(ctx, bloburl.FromPath(root)+"/b?metadata=skip&create_dir=1", nil)
	defer src.Close()
	defer dst.Close()
	dst.Sign([]byte(strings.Repeat("k", 32)))
	big := []byte(strings.Repeat("weights ", BlockSize/4)) // several blocks
	put(t, src, "donor", 4, map[string][]byte{"state.bin": big, "meta/opt.json": []byte(`{"lr": 0.1}`)}, map[string]float64{"test_accuracy": 0.8})
	from, err := src.Verify(ctx, "donor", ID(4, 0))
	if err != nil {
		t.Fatal(err)
	}
	m, err := dst.Clone(ctx, from, "trial-3-clone-1")
	if err != nil {
		t.Fatal(err)
	}
	if m.Run != "trial-3-clone-1" || m.ID != ID(4, 0) || m.Meta[MetaClonedFrom] != "donor/"+ID(4, 0) || m.Signature == "" || m.Metrics["test_accuracy"] != 0.8 {
		t.Fatalf("clone manifest %+v", m)
	}
	got, err := dst.LatestVerified(ctx, "trial-3-clone-1")
	if err != nil {
		t.Fatal(err)
	}
	if string(readObject(t, got, "state.bin")) != string(big) || string(readObject(t, got, "meta/opt.json")) != `{"lr": 0.1}` {
		t.Fatal("the clone's objects differ from the source's")
	}

	// The source is damaged after it was verified: the copy reads it to the
	// end, the hash fails, and no clone is committed.
	put(t, src, "donor", 5, map[string][]byte{"state.bin": big}, nil)
	from, err = src.Verify(ctx, "donor", ID(5, 0))
	if err != nil {
		t.Fatal(err)
	}
	flip(t, filepath.Join(root, "a", "donor", ID(5, 0), "state.bin"), BlockSize+3)
	_, err = dst.Clone(ctx, from, "trial-4-clone-1")
	var corrupt *CorruptError
	if !errors.As(err, &corrupt) {
		t.Fatalf("cloning a damaged source: %v; want a CorruptError", err)
	}
	if _, err := dst.LatestVerified(ctx, "trial-4-clone-1"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("after a failed clone the target has %v; want no checkpoint", err)
	}
	if files := regularFiles(t, filepath.Join(root, "b", "trial-4-clone-1")); len(files) != 0 {
		t.Fatalf("a failed clone left %v", files)
	}
}
