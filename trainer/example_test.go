package trainer_test

import (
	"context"
	"fmt"

	_ "gocloud.dev/blob/fileblob" // file:// for the data set

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
)

// A backend and a data set format of your own. In a package of yours,
// register them from init with trainer.Register and dataset.Register; a
// worker binary that imports that package (next to the built-in backends)
// then runs specs that name them:
//
//	{"trainer": "tiny-mlp", "dataset": {"url": "s3://bucket/fmnist", "format": "idx-head"}}
//
// Here they go into registries of their own, and the example does for one
// rank what a GPU worker does: look the backend up by the spec's name and
// build the rank with the run's data.
func Example_yourOwnBackend() {
	ctx := context.Background()
	backends := trainer.NewBackends()
	backends.Register("tiny-mlp", trainer.BackendFunc(func(ctx context.Context, r trainer.Rank) (trainer.Trainer, error) {
		train, test, err := r.Data(ctx)
		if err != nil {
			return nil, err
		}
		t, err := native.New(native.Config{Hidden: []int{16}, BatchSize: r.BatchSize, Seed: r.Spec.Hyper.Seed}, train, test, r.Comm)
		if err != nil {
			return nil, trainer.UserError(err) // the spec's to fix: no retry on a new gang
		}
		return t, nil
	}))
	formats := dataset.NewRegistry()
	formats.Register("idx-head", dataset.LoaderFunc(func(ctx context.Context, url string) (*dataset.Set, *dataset.Set, error) {
		train, test, err := dataset.LoadIDX(ctx, url)
		if err != nil {
			return nil, nil, err
		}
		return train.Head(2000), test.Head(500), nil
	}))

	s := spec.Training{Trainer: "tiny-mlp", Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall(), Format: "idx-head"}}.WithDefaults()
	backend, err := backends.Lookup(s.Trainer)
	if err != nil {
		panic(err)
	}
	tr, err := backend.NewRank(ctx, trainer.Rank{Spec: s, Comm: trainer.Local{}, BatchSize: 64,
		Data: func(ctx context.Context) (*dataset.Set, *dataset.Set, error) {
			loader, err := formats.Lookup(s.Dataset.Format)
			if err != nil {
				return nil, nil, err
			}
			return loader.Load(ctx, s.Dataset.URL)
		}})
	if err != nil {
		panic(err)
	}
	defer tr.Close()
	tr.Init(ctx)
	m, _ := tr.TrainEpoch(ctx, 0, trainer.EpochOptions{})
	fmt.Println(backends.Names(), "trained", m.Steps, "steps")

	_, err = backends.Lookup("jax")
	fmt.Println(err)
	// Output:
	// [tiny-mlp] trained 32 steps
	// no trainer backend "jax" on this worker (registered: tiny-mlp)
}
