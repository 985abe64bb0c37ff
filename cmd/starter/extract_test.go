package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
)

// putExecState writes an exec program's checkpoint directory as the exec
// trainer saves it: each file's object, and exec-state.json listing them
// (renamed: files whose path is no object name, under an object of their own).
func putExecState(t *testing.T, create func(string) io.WriteCloser, files map[string]string, renamed map[string]string) {
	t.Helper()
	sums := map[string]string{}
	for rel, v := range files {
		sum := sha256.Sum256([]byte(v))
		sums[rel] = hex.EncodeToString(sum[:])
		object := "files/" + rel
		if o, ok := renamed[rel]; ok {
			object = o
		}
		w := create(object)
		io.WriteString(w, v)
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	b, _ := json.Marshal(map[string]any{"cursor": map[string]int{"epoch": 2, "step": 0}, "files": sums, "objects": renamed})
	w := create("exec-state.json")
	w.Write(b)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func filesUnder(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(root, p)
			out[filepath.ToSlash(rel)] = string(b)
		}
		return err
	})
	return out
}

// extract writes an exec checkpoint's directory as the program wrote it: a
// file whose name is no object name too, a sharded checkpoint's parts each
// in shards/RANK/, and a merged sharded one's parts as one directory.
func TestExtractWritesTheProgramsDirectory(t *testing.T) {
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, bloburl.FromPath(t.TempDir())+"?metadata=skip", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	must := func(w io.WriteCloser, err error) io.WriteCloser {
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	exec := map[string]string{"trainer": "exec"}

	w, err := store.Begin(ctx, "plain", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	putExecState(t, func(n string) io.WriteCloser { return must(w.Create(ctx, n)) },
		map[string]string{"model.pt": "m", "optimizer state.pt": "o"}, map[string]string{"optimizer state.pt": "renamed/000000"})
	if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1, Meta: exec}); err != nil {
		t.Fatal(err)
	}

	parts := []map[string]string{{".metadata": "meta", "__0_0.distcp": "zero"}, {"__1_0.distcp": "one"}}
	for _, merged := range []bool{false, true} {
		run := map[bool]string{false: "own", true: "merged"}[merged]
		for r, files := range parts {
			sw, err := store.BeginShard(ctx, run, 2, 0, r)
			if err != nil {
				t.Fatal(err)
			}
			putExecState(t, func(n string) io.WriteCloser { return must(sw.Create(ctx, n)) }, files, nil)
			if err := sw.Close(ctx); err != nil {
				t.Fatal(err)
			}
		}
		w, err := store.Begin(ctx, run, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AdoptShards(ctx, 2); err != nil {
			t.Fatal(err)
		}
		meta := map[string]string{"trainer": "exec"}
		if merged {
			meta[checkpoint.MetaShards] = checkpoint.ShardsMerged
		}
		if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 2, Meta: meta}); err != nil {
			t.Fatal(err)
		}
	}

	for _, c := range []struct {
		run  string
		want map[string]string
	}{
		{"plain", map[string]string{"model.pt": "m", "optimizer state.pt": "o"}},
		{"own", map[string]string{"shards/0/.metadata": "meta", "shards/0/__0_0.distcp": "zero", "shards/1/__1_0.distcp": "one"}},
		{"merged", map[string]string{".metadata": "meta", "__0_0.distcp": "zero", "__1_0.distcp": "one"}},
	} {
		ck, err := store.Verify(ctx, c.run, checkpoint.ID(2, 0))
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		n, err := extractFiles(ctx, ck, root)
		if got := filesUnder(t, root); err != nil || n != len(c.want) || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: extracted %d files %v (%v); want %v", c.run, n, got, err, c.want)
		}
	}
}
