package native

import (
	"context"
	"testing"

	"github.com/durabletrain/durabletrain/trainer"
)

// BenchmarkTrainEpoch is one epoch over the committed subset (10000 examples), one rank;
// compare builds with and without -tags openblas.
func BenchmarkTrainEpoch(b *testing.B) {
	tr, te := subset(b)
	n := newTrainer(b, Config{}, tr, te, nil)
	ctx := context.Background()
	n.Init(ctx)
	b.ResetTimer()
	for i := range b.N {
		n.cursor.Epoch = i
		n.cursor.Step = 0
		if _, err := n.TrainEpoch(ctx, i, trainer.EpochOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*tr.Len())/b.Elapsed().Seconds(), "samples/s")
}
