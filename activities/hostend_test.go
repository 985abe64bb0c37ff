package activities

import (
	"errors"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

// TestHostEndIsTheMostTellingOfItsRanks: a host whose ranks all finished
// reports the first's result with the checkpoint whichever rank committed;
// one whose ranks failed reports a user error before a preemption with a
// checkpoint before any preemption before the first error.
func TestHostEndIsTheMostTellingOfItsRanks(t *testing.T) {
	ref := &spec.CheckpointRef{ID: "e1", Epoch: 1}
	res, err := hostEnd([]spec.EpochResult{{Rank: 8}, {Rank: 9, Checkpoint: ref}}, []error{nil, nil})
	if err != nil || res.Rank != 8 || res.Checkpoint != ref {
		t.Fatalf("all finished: %+v, %v; want rank 8's result with the checkpoint", res, err)
	}
	infra := errors.New("connection reset")
	user := temporal.NewNonRetryableApplicationError("bad data", spec.ErrUser, nil)
	bare := preemption("stopping", nil)
	withRef := preemption("stopping", ref)
	for _, c := range []struct {
		name string
		errs []error
		want error
	}{
		{"infrastructure only", []error{nil, infra, errors.New("later")}, infra},
		{"a preemption beats infrastructure", []error{infra, bare}, bare},
		{"a checkpoint beats a bare preemption", []error{bare, withRef}, withRef},
		{"a user error beats everything", []error{withRef, infra, user}, user},
	} {
		if _, err := hostEnd(make([]spec.EpochResult, len(c.errs)), c.errs); err != c.want {
			t.Errorf("%s: got %v; want %v", c.name, err, c.want)
		}
	}
}
