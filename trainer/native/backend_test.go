package native

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// A model over the worker's memory allowance is a user error, before the
// model is allocated.
func TestNewRankRefusesAModelOverTheMemoryLimit(t *testing.T) {
	set := &dataset.Set{Images: make([]float32, 2*784), Labels: []uint8{0, 1}, Rows: 28, Cols: 28}
	r := trainer.Rank{
		Spec:        spec.Training{Model: spec.Model{Hidden: []int{8192, 8192}}}.WithDefaults(),
		MemoryLimit: 256 << 20,
		Comm:        trainer.Local{},
		Data:        func(context.Context) (*dataset.Set, *dataset.Set, error) { return set, set, nil },
	}
	_, err := NewRank(context.Background(), r)
	if !errors.Is(err, trainer.ErrUser) || !strings.Contains(err.Error(), "this worker allows 256 MiB (-max-rank-memory)") {
		t.Fatalf("got %v", err)
	}
	r.Spec.Model.Hidden = []int{32}
	if _, err := NewRank(context.Background(), r); err != nil {
		t.Fatalf("a small model: %v", err)
	}
}
