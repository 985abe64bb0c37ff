package activities

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/trainertest"
)

// The trainer gets the gang's collective metered, and still caller-driven
// where the collective is: its started all-reduces pass through and sum.
func TestMeteredCollectiveStaysCallerDriven(t *testing.T) {
	m := newRankMetrics(context.Background(), "run", 0)
	if _, ok := metered(trainer.Local{}, m).(trainer.CallerDrivenReducer); ok {
		t.Fatal("a reducer without started operations became caller-driven when metered")
	}
	groups := trainertest.GangWith(t, 2, collective.Options{Progress: collective.ProgressCaller})
	bufs := [][]float32{{1, 2, 3}, {10, 20, 30}}
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for r, g := range groups {
		wg.Go(func() {
			d, ok := metered(g, m).(trainer.CallerDrivenReducer)
			if !ok || !d.CallerDriven() {
				errs[r] = errors.New("the metered group is not caller-driven")
				return
			}
			if errs[r] = d.StartAllReduce(context.Background(), bufs[r]); errs[r] == nil {
				errs[r] = d.Wait()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range bufs {
		if bufs[r][0] != 11 || bufs[r][1] != 22 || bufs[r][2] != 33 {
			t.Fatalf("rank %d holds %v; want [11 22 33]", r, bufs[r])
		}
	}
}
