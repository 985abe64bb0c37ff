package activities

import (
	"testing"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// Checkpoints within an epoch saved in the background, while the gang
// trains on, are the very checkpoints a gang that waits for each one saves:
// every one committed, verified, and the same bytes. The snapshot is the
// state at its step, however far training has gone since.
func TestBackgroundCheckpointsAreTheForegroundOnes(t *testing.T) {
	hashes := map[bool]map[string][]string{}
	for _, async := range []bool{true, false} {
		agents, peers := newAgents(t, 2)
		root := t.TempDir()
		s := spec.Training{
			Model:      spec.Model{Hidden: []int{32}},
			Dataset:    spec.Dataset{URL: testdata.FashionMNISTSmall()},
			Hyper:      spec.Hyper{Epochs: 2, BatchSize: 16},
			Scaling:    spec.Scaling{Workers: 2},
			Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(root) + "?metadata=skip", EverySteps: 5, KeepLast: spec.Int(0), Async: &async},
		}.WithDefaults()
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		in := spec.EpochInput{Run: "bg", Generation: 1, Peers: peers, Secret: []byte("0123456789abcdef0123456789abcdef"), Spec: s}
		steps := trainEpochs(t, agents, &in, 2)[0].Metrics.Steps
		store, _ := checkpoint.Open(t.Context(), s.Checkpoint.URL, nil)
		defer store.Close()
		ids, err := store.IDs(t.Context(), "bg")
		if err != nil {
			t.Fatal(err)
		}
		// every 5 steps of each epoch, and each epoch's end (the next epoch's step 0)
		if want := 2 * ((steps-1)/5 + 1); len(ids) != want {
			t.Fatalf("async %v: %d checkpoints %v; want %d (%d steps an epoch, every 5, and each epoch's end)", async, len(ids), ids, want, steps)
		}
		hashes[async] = map[string][]string{}
		for _, id := range ids {
			c, err := store.Verify(t.Context(), "bg", id)
			if err != nil {
				t.Fatalf("async %v: %s: %v", async, id, err)
			}
			for _, o := range c.Manifest.Objects {
				hashes[async][id] = append(hashes[async][id], o.Name+":"+o.Hash())
			}
		}
	}
	for id, want := range hashes[false] {
		if got := hashes[true][id]; len(got) != len(want) || got[0] != want[0] {
			t.Fatalf("checkpoint %s saved in the background is %v; in the foreground %v", id, got, want)
		}
	}
}
