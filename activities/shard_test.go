package activities

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
	_ "github.com/durabletrain/durabletrain/trainer/exectrainer" // the exec backend
)

// A sharded run: every rank saves its own part; one manifest covers both.
// When rank 1's part of the newest checkpoint is damaged, rank 1 falls
// back to the one before, and the gang agrees on it: rank 0 loads that one
// too instead of the newest, so the ranks never train on from different
// states.
func TestShardedGangResumesFromTheCheckpointEveryRankCanLoad(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	agents, peers := newAgents(t, 2)
	py, _ := filepath.Abs("../python")
	script, _ := filepath.Abs("../trainer/exectrainer/testdata/counter.py")
	for _, a := range agents {
		a.PythonPath = py
		a.Policy.Exec = []string{"/usr/bin/python3"}
	}
	root := t.TempDir()
	s := spec.Training{
		Trainer:    spec.TrainerExec,
		Exec:       &spec.Exec{Command: []string{"/usr/bin/python3", script}, Env: map[string]string{"STEPS": "4"}},
		Dataset:    spec.Dataset{URL: testdata.FashionMNISTSmall()},
		Hyper:      spec.Hyper{Epochs: 4},
		Scaling:    spec.Scaling{Workers: 2},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(root) + "?metadata=skip", Sharded: true, KeepLast: spec.Int(0)},
	}.WithDefaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	in := spec.EpochInput{Run: "sharded", Generation: 1, Peers: peers, Secret: []byte("0123456789abcdef0123456789abcdef"), Spec: s}
	trainEpochs(t, agents, &in, 2)
	store, _ := checkpoint.Open(t.Context(), s.Checkpoint.URL, nil)
	defer store.Close()
	newest, err := store.Committed(t.Context(), "sharded", checkpoint.ID(2, 0))
	if err != nil {
		t.Fatal(err)
	}
	if newest.Manifest.Shards != 2 {
		t.Fatalf("manifest of %d shards, objects %+v", newest.Manifest.Shards, newest.Manifest.Objects)
	}
	part := filepath.Join(root, "sharded", checkpoint.ID(2, 0), "shards", "1", "files", "value.json")
	if err := os.WriteFile(part, []byte(`{"value": 99999, "epoch": 2, "step": 0}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// What each rank will have read from storage: the manifests, and its
	// own part of each checkpoint it loads (measured now: the new gang
	// writes its own epoch-2 checkpoint over this one).
	read := func(id string, shard int) int64 {
		n := fileBytes(t, filepath.Join(root, "sharded", id, checkpoint.ManifestName))
		filepath.WalkDir(filepath.Join(root, "sharded", id, "shards", fmt.Sprint(shard)), func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				n += fileBytes(t, path)
			}
			return err
		})
		return n
	}
	newer := []int64{read(checkpoint.ID(2, 0), 0), read(checkpoint.ID(2, 0), 1)}
	older := []int64{read(checkpoint.ID(1, 0), 0), read(checkpoint.ID(1, 0), 1)}
	// A new gang: cold replicas restore.
	in.Generation, in.Epoch = 2, 2
	res, errs := runEpochOnAll(t, agents, in)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		if res[r].Restored == nil || res[r].Restored.From.ID != checkpoint.ID(1, 0) || res[r].Metrics.Epoch != 1 {
			t.Fatalf("rank %d after its part of %s was damaged: restored %+v, trained epoch %d; want both from %s, training epoch 1",
				r, checkpoint.ID(2, 0), res[r].Restored, res[r].Metrics.Epoch, checkpoint.ID(1, 0))
		}
	}
	// Rank 0 loaded both whole; rank 1 stopped at the damaged file of its
	// part of the newer one.
	if want := newer[0] + older[0]; res[0].Restored.Bytes != want {
		t.Fatalf("rank 0 reports %d bytes read from storage; its parts of both checkpoints and their manifests are %d", res[0].Restored.Bytes, want)
	}
	if least, most := older[1], newer[1]+older[1]; res[1].Restored.Bytes <= least || res[1].Restored.Bytes > most {
		t.Fatalf("rank 1 reports %d bytes read from storage; want more than %d (the older checkpoint's part), at most %d", res[1].Restored.Bytes, least, most)
	}
	if res[0].Metrics.TestAccuracy != res[1].Metrics.TestAccuracy {
		t.Fatalf("the ranks hold different states: %+v vs %+v", res[0].Metrics, res[1].Metrics)
	}
}

func fileBytes(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
