package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/exectrainer"
	"github.com/durabletrain/durabletrain/tune"
)

// check validates a spec as the workflow would, without starting anything:
// the Python front door runs it before it starts a run or a search, so a
// malformed config fails there with the Go side's own words.
//
//	starter check -kind training -f spec.json     (- or no -f: standard input)
//
// It prints the spec with its defaults filled in and exits 0, or prints the
// error (naming the field and what is accepted) and exits 2.
func check(args []string) {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	kind := fs.String("kind", "training", "what the spec is for: training (TrainingWorkflow) or tune (TuneWorkflow)")
	file := fs.String("f", "-", "the spec (JSON); - reads standard input")
	fs.Parse(args)
	var raw []byte
	var err error
	if *file == "-" {
		raw, err = io.ReadAll(io.LimitReader(os.Stdin, 4*spec.MaxSpecBytes))
	} else {
		raw, err = os.ReadFile(*file)
	}
	if err != nil {
		fail(exitUsage, "check: %v", err)
	}
	switch *kind {
	case "training":
		s, err := spec.Parse(raw)
		if err == nil {
			s = s.WithDefaults()
			err = s.Validate()
		}
		if err != nil {
			fail(exitUsage, "%v", err)
		}
		printJSON(s)
	case "tune":
		s, err := tune.ParseSpec(raw)
		if err != nil {
			fail(exitUsage, "%v", err)
		}
		printJSON(s)
	default:
		fail(exitUsage, "check: -kind is %q; want training or tune", *kind)
	}
}

func printJSON(v any) {
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		fail(exitUsage, "check: %v", err)
	}
	fmt.Println(string(out))
}

// extract writes the files of a verified checkpoint into a directory: what
// the Python front door's Checkpoint.to_directory() runs, so that the Go
// side stays the one reader of checkpoints (formats, checksums, shards).
//
//	starter extract -url file:///ckpts -run RUN -id ckpt-e000003-s000000000 -to DIR
//
// A checkpoint that does not verify is not written at all (exit 1). Files go
// under DIR as the rank wrote them (its checkpoint directory's layout); a
// sharded checkpoint's parts go under DIR/shards/RANK/, but for a merged one
// (checkpoint.merge_shards), whose parts are one directory: DIR. An exec
// run's files keep the names its program gave them, whatever they are.
func extract(args []string) {
	fs := flag.NewFlagSet("extract", flag.ExitOnError)
	url := fs.String("url", "", "the checkpoint store's URL (the run's checkpoint.url)")
	run := fs.String("run", "", "the run's name in the store")
	id := fs.String("id", "", "the checkpoint's ID (ckpt-eEEEEEE-sSSSSSSSS)")
	to := fs.String("to", "", "the directory to write the files into (made if missing)")
	fs.Parse(args)
	for _, f := range []struct{ name, v string }{{"-url", *url}, {"-run", *run}, {"-id", *id}, {"-to", *to}} {
		if f.v == "" {
			fail(exitUsage, "extract: %s is empty; want a value (starter help extract)", f.name)
		}
	}
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, *url, nil)
	if err != nil {
		fail(exitFailed, "extract: %v", err)
	}
	defer store.Close()
	ck, err := store.Verify(ctx, *run, *id)
	if err != nil {
		fail(exitFailed, "extract: %v", err)
	}
	root, err := filepath.Abs(*to)
	if err != nil {
		fail(exitUsage, "extract: -to: %v", err)
	}
	n, err := extractFiles(ctx, ck, root)
	if err != nil {
		fail(exitFailed, "extract: checkpoint %s: %v", *id, err)
	}
	fmt.Printf("%d files of %s (epoch %d step %d) in %s\n", n, *id, ck.Manifest.Epoch, ck.Manifest.Step, root)
}

// extractFiles writes ck's files under root and says how many. An exec
// run's checkpoint is its program's directory, as the exec trainer restores
// it (every name, verified; a merged sharded checkpoint's parts as one
// directory); any other checkpoint's files/ objects as they are named.
func extractFiles(ctx context.Context, ck *checkpoint.Checkpoint, root string) (int, error) {
	m := ck.Manifest
	if m.Meta["trainer"] == spec.TrainerExec {
		if m.Shards > 0 && m.Meta[checkpoint.MetaShards] != checkpoint.ShardsMerged {
			// Each rank restores its own part: each part in a directory of its own.
			for r := range m.Shards {
				dir := filepath.Join(root, "shards", strconv.Itoa(r))
				if err := writeExecFiles(ctx, []trainer.StateReader{ck.Shard(r)}, dir); err != nil {
					return 0, fmt.Errorf("rank %d's part: %w", r, err)
				}
			}
			return countFiles(root)
		}
		parts := []trainer.StateReader{ck}
		if m.Shards > 0 {
			parts = parts[:0]
			for r := range m.Shards {
				parts = append(parts, ck.Shard(r))
			}
		}
		if err := writeExecFiles(ctx, parts, root); err != nil {
			return 0, err
		}
		return countFiles(root)
	}
	n := 0
	for _, o := range m.Objects {
		rel, ok := checkpointFile(o.Name)
		if !ok {
			continue
		}
		dst := filepath.Join(root, filepath.FromSlash(rel))
		if !strings.HasPrefix(dst, root+string(filepath.Separator)) {
			return n, fmt.Errorf("it holds %q, which would land outside %s: not written", o.Name, root)
		}
		if err := copyObject(ctx, ck, o.Name, dst); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func writeExecFiles(ctx context.Context, parts []trainer.StateReader, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	_, err := exectrainer.WriteFiles(ctx, parts, dir)
	return err
}

// countFiles counts the regular files under root.
func countFiles(root string) (int, error) {
	n := 0
	err := filepath.WalkDir(root, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			n++
		}
		return err
	})
	return n, err
}

// checkpointFile maps a manifest object to where its file goes: "files/x"
// to "x", "shards/1/files/x" to "shards/1/x"; other objects (the trainer's
// own state) to none.
func checkpointFile(name string) (string, bool) {
	if rest, ok := strings.CutPrefix(name, "files/"); ok && rest != "" {
		return rest, true
	}
	if rest, ok := strings.CutPrefix(name, "shards/"); ok {
		if rank, file, ok := strings.Cut(rest, "/files/"); ok && rank != "" && file != "" {
			return "shards/" + rank + "/" + file, true
		}
	}
	return "", false
}

func copyObject(ctx context.Context, ck *checkpoint.Checkpoint, name, dst string) error {
	r, err := ck.Open(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return fmt.Errorf("%s: %w", name, err)
	}
	return f.Close()
}
