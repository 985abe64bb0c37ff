package activities

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.temporal.io/sdk/temporal"
	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/spec"
)

// A host's epoch that ended because another host's rank broke the gang says
// so, naming that rank; one whose own rank is to blame, or that ended any
// other way, says nothing of the kind.
func TestBlameNamesAnotherHostsRank(t *testing.T) {
	in := spec.EpochInput{Rank: 5}
	place := spec.LocalPlace{LocalRank: 1, LocalWorld: 4} // ranks 4..7
	wrapped := func(rank int) error {
		return fmt.Errorf("step 3: %w", &collective.PeerError{Rank: rank, Reporter: 4, Reason: "stalled"})
	}
	for name, c := range map[string]struct {
		err  error
		want int // the rank blamed; -2: not blamed
	}{
		"another host's rank":         {wrapped(8), 8},
		"rank 0":                      {wrapped(0), 0},
		"a rank of this host":         {wrapped(7), -2},
		"this rank":                   {wrapped(5), -2},
		"nobody to blame (cancelled)": {wrapped(-1), -2},
		"not the collective's":        {errors.New("disk full"), -2},
		"a user error":                {userError(wrapped(8)), -2},
	} {
		err := blame(c.err, in, place)
		var app *temporal.ApplicationError
		if c.want == -2 {
			if err != c.err {
				t.Errorf("%s: %v became %v; want it as it was", name, c.err, err)
			}
			continue
		}
		var b spec.BrokenBy
		if !errors.As(err, &app) || app.Type() != spec.ErrPeerFailed || app.Details(&b) != nil || b.Rank != c.want || b.Reason != "stalled" {
			t.Errorf("%s: %v; want an %s blaming rank %d", name, err, spec.ErrPeerFailed, c.want)
		}
		if app != nil && app.Message() != c.err.Error() {
			t.Errorf("%s: message %q; want %q", name, app.Message(), c.err.Error())
		}
	}
	if blame(nil, in, place) != nil {
		t.Error("no error became one")
	}
}

// A host whose own rank was declared stalled by another host's rank, and
// heard the verdict, has a word for its run (spec.StallHeard): which rank,
// who declared it, and how long it had been silent, in its epoch's error
// and by signal from its group's watch. Any other end has none.
func TestAStallHeardByItsRankIsTold(t *testing.T) {
	in := spec.EpochInput{Rank: 5, Generation: 3}
	place := spec.LocalPlace{LocalRank: 1, LocalWorld: 4} // ranks 4..7
	const silence = 2300 * time.Millisecond
	verdict := func(rank, reporter int, reason string, silence time.Duration) error {
		return fmt.Errorf("step 3: %w", &collective.PeerError{Rank: rank, Reporter: reporter, Reason: reason, Silence: silence})
	}
	stalled := collective.ReasonStalled + ": no data or keepalive for 2s"
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"heard, declared by another host":     {verdict(6, 8, stalled, silence), true},
		"heard, after its gang broke":         {&gangBrokeError{gang: verdict(4, 3, stalled, silence), own: errors.New("exit 1")}, true},
		"another host's rank stalled":         {verdict(8, 6, stalled, 0), false},
		"declared by a rank of this host":     {verdict(6, 7, stalled, silence), false},
		"lost, not stalled":                   {verdict(6, 8, "connection lost: EOF", silence), false},
		"no silence measured (not its right)": {verdict(6, 8, stalled, 0), false},
		"not the collective's":                {errors.New("disk full"), false},
		"a user error":                        {userError(verdict(6, 8, stalled, silence)), false},
	} {
		got := stallHeard(c.err, in, place)
		signals := make(chan any, 1)
		a := &Agent{Log: zap.NewNop(), signalled: func(name string, arg any) error {
			if name == spec.SignalStallHeard {
				signals <- arg
			}
			return nil
		}}
		herr := hostError(c.err, in, place)
		a.stallWatch(context.Background(), in, place)(c.err) // the group's OnFailure
		if !c.want {
			if got != nil {
				t.Errorf("%s: told %+v; want nothing", name, got)
			}
			if want := blame(c.err, in, place); herr.Error() != want.Error() || errors.Is(herr, c.err) != errors.Is(want, c.err) {
				t.Errorf("%s: the host's error %v; want blame's", name, herr)
			}
			if len(signals) != 0 {
				t.Errorf("%s: the run was told %+v", name, <-signals)
			}
			continue
		}
		var app *temporal.ApplicationError
		var told spec.StallHeard
		if !errors.As(herr, &app) || app.Type() != spec.ErrStalledHeard || app.Details(&told) != nil || got == nil || told != *got || app.Message() != c.err.Error() {
			t.Errorf("%s: the host's error %v; want an %s carrying %+v", name, herr, spec.ErrStalledHeard, got)
		}
		if len(signals) == 0 {
			t.Errorf("%s: the run was not told", name)
		} else if s := <-signals; got != nil && s != *got {
			t.Errorf("%s: told the run %+v; want %+v", name, s, *got)
		}
		var pe *collective.PeerError
		errors.As(c.err, &pe)
		want := spec.StallHeard{Generation: 3, Rank: pe.Rank, Reporter: pe.Reporter, Silence: spec.Duration(silence)}
		if got == nil || *got != want {
			t.Errorf("%s: told %+v; want %+v", name, got, want)
		}
	}
}
