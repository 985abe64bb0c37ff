package checkpoint_test

import (
	"context"
	"fmt"
	"io"

	_ "gocloud.dev/blob/memblob" // a binary imports the drivers of the URLs it accepts

	"github.com/durabletrain/durabletrain/checkpoint"
)

// Save a checkpoint, then restore the newest one that verifies.
func Example() {
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, "mem://", nil) // or file:///path?create_dir=1, s3://bucket/prefix, ...
	if err != nil {
		panic(err)
	}
	defer store.Close()

	w, _ := store.Begin(ctx, "my-run", 3, 0) // the cursor training resumes at: epoch 3, step 0
	obj, _ := w.Create(ctx, "weights.bin")   // w is a trainer.StateWriter: trainers call Create themselves
	obj.Write([]byte("the weights"))
	obj.Close()
	if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 2, Metrics: map[string]float64{"test_accuracy": 0.87}}); err != nil {
		panic(err)
	}

	c, err := store.RestoreLatest(ctx, "my-run", func(c *checkpoint.Checkpoint) error {
		r, err := c.Open(ctx, "weights.bin") // verified while it streams
		if err != nil {
			return err
		}
		defer r.Close()
		data, err := io.ReadAll(r)
		fmt.Printf("%s\n", data)
		return err
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Manifest.ID, c.Manifest.Metrics["test_accuracy"])
	// Output:
	// the weights
	// ckpt-e000003-s000000000 0.87
}
