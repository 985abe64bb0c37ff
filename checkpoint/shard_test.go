package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// writeShards has each of world ranks write its own part of run's
// checkpoint at (1, 5): rank r's "state" holds content(r).
func writeShards(t *testing.T, s *Store, run string, world int, content func(int) string) {
	t.Helper()
	ctx := context.Background()
	for r := range world {
		sw, err := s.BeginShard(ctx, run, 1, 5, r)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"state", "meta/rank.json"} {
			out, err := sw.Create(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			io.WriteString(out, content(r)+name)
			if err := out.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := sw.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Every rank's part is under one manifest; each rank reads back its own
// part by its own names, verified; a damaged part is caught on reading.
func TestShardedCheckpoint(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, err := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	content := func(r int) string { return fmt.Sprintf("rank %d's optimizer shard of ", r) }
	writeShards(t, s, "run", 3, content)
	w, err := s.Begin(ctx, "run", 1, 5)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.AdoptShards(ctx, 3); err != nil {
		t.Fatal(err)
	}
	m, err := w.Commit(ctx, Info{WorldSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	if m.Shards != 3 || len(m.Objects) != 6 {
		t.Fatalf("manifest: %d shards, objects %+v", m.Shards, m.Objects)
	}
	c, err := s.LatestVerified(ctx, "run") // every rank's objects verify
	if err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		rd, err := c.Shard(r).Open(ctx, "state")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rd)
		rd.Close()
		if err != nil || string(b) != content(r)+"state" {
			t.Fatalf("rank %d read %q, %v", r, b, err)
		}
	}
	if _, err := c.Shard(3).Open(ctx, "state"); err == nil {
		t.Fatal("a rank beyond the shards opened an object")
	}
	// A damaged part: reading it fails, and the checkpoint no longer verifies.
	path := filepath.Join(root, "run", m.ID, "shards", "1", "state")
	os.WriteFile(path, []byte(strings.Replace(content(1)+"state", "optimizer", "0ptimizer", 1)), 0o644)
	rd, _ := c.Shard(1).Open(ctx, "state")
	_, err = io.ReadAll(rd)
	rd.Close()
	if err == nil {
		t.Fatal("a damaged shard read without an error")
	}
	if _, err := s.LatestVerified(ctx, "run"); err == nil {
		t.Fatal("a checkpoint with a damaged shard verified")
	}
	// A clone keeps the shards.
	cm, err := s.Clone(ctx, &Checkpoint{Manifest: m, s: s}, "copy")
	if err == nil || cm.Shards != 0 {
		t.Fatalf("cloned a checkpoint with a damaged shard: %+v, %v", cm, err)
	}
	os.WriteFile(path, []byte(content(1)+"state"), 0o644)
	if cm, err = s.Clone(ctx, &Checkpoint{Manifest: m, s: s}, "copy"); err != nil || cm.Shards != 3 || len(cm.Objects) != 6 {
		t.Fatalf("clone %+v, %v", cm, err)
	}
}

// A rank whose part is missing or does not match its list keeps the
// checkpoint from being committed.
func TestShardedCheckpointNeedsEveryPart(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
	writeShards(t, s, "run", 2, func(r int) string { return fmt.Sprint(r) })
	w, _ := s.Begin(ctx, "run", 1, 5)
	if err := w.AdoptShards(ctx, 3); err == nil || !strings.Contains(err.Error(), "shard 2") {
		t.Fatalf("adopting 3 parts of which 2 exist: %v", err)
	}
	os.WriteFile(filepath.Join(root, "run", ID(1, 5), "shards", "0", "state"), []byte("longer than it was"), 0o644)
	w, _ = s.Begin(ctx, "run", 1, 5)
	if err := w.AdoptShards(ctx, 2); err == nil || !strings.Contains(err.Error(), "listed as") {
		t.Fatalf("adopting a part whose object changed size: %v", err)
	}
	if c, err := s.LatestVerified(ctx, "run"); !errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("a checkpoint without every part: %+v, %v", c, err)
	}
}

// A save that fails removes what it wrote: a rank's part (its objects and
// its list) through ShardWriter.Abort, and every part rank 0 adopted
// through Writer.Abort, leaving no file behind.
func TestAbortRemovesAFailedSavesObjects(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _ := Open(ctx, bloburl.FromPath(root)+"?metadata=skip", nil)
	dir := filepath.Join(root, "run", ID(1, 5))
	writeShards(t, s, "run", 3, func(r int) string { return fmt.Sprint(r) })
	sw, _ := s.BeginShard(ctx, "run", 1, 5, 2)
	for _, name := range []string{"state", "meta/rank.json"} {
		out, _ := sw.Create(ctx, name)
		io.WriteString(out, name)
		out.Close()
	}
	if err := sw.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if files := regularFiles(t, dir); len(files) != 6 || slices.ContainsFunc(files, func(f string) bool { return strings.HasPrefix(f, "shards/2") }) {
		t.Fatalf("after rank 2's part was aborted: %v; want ranks 0 and 1's parts only", files)
	}
	w, _ := s.Begin(ctx, "run", 1, 5)
	if err := w.AdoptShards(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := w.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if files := regularFiles(t, dir); len(files) != 2 {
		t.Fatalf("after the adopted parts were aborted: %v; want the two ranks' lists only", files)
	}
}

// regularFiles lists the files under dir, by their slash-separated names below it.
func regularFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return files
}
