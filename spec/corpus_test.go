package spec_test

import (
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/speccorpus"
)

// Every malformed spec of the corpus is refused with one bounded line that
// names the field.
func TestMalformedSpecsAreRefusedNamingTheField(t *testing.T) {
	for _, c := range speccorpus.Training() {
		s, err := spec.Parse([]byte(c.Input))
		if err == nil {
			err = s.WithDefaults().Validate()
		}
		if err == nil || !strings.Contains(err.Error(), c.Want) {
			t.Errorf("%s:\n got: %.300v\nwant: …%s…", c.Name, err, c.Want)
			continue
		}
		if msg := err.Error(); len(msg) > 400 || strings.ContainsAny(msg, "\n\r") {
			t.Errorf("%s: a %d-byte message: %.500q", c.Name, len(msg), msg)
		}
	}
}

// Zero means zero where a user can mean it; elsewhere 0 is refused above.
func TestExplicitZerosThatMeanZero(t *testing.T) {
	s, err := spec.Parse([]byte(`{"hyper": {"optimizer": "sgd", "momentum": 0}, "failure": {"max_failures": 0, "max_preemptions": 0}, "checkpoint": {"keep_last": 0}}`))
	if err != nil {
		t.Fatal(err)
	}
	s = s.WithDefaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.Hyper.MomentumOf() != 0 || s.Failure.FailureBudget() != 0 || s.Failure.PreemptionBudget() != 0 || s.Checkpoint.KeepLastN() != 0 {
		t.Fatalf("explicit zeros became %+v %+v %+v", s.Hyper, s.Failure, s.Checkpoint)
	}
	d, _ := spec.Parse([]byte(`{"hyper": {"optimizer": "sgd", "momentum": null}, "failure": {"max_failures": null}}`))
	d = d.WithDefaults()
	if d.Hyper.MomentumOf() != 0.9 || d.Failure.FailureBudget() != 3 || d.Failure.PreemptionBudget() != 20 || d.Checkpoint.KeepLastN() != 2 {
		t.Fatalf("left out or null did not take the defaults: %+v %+v %+v", d.Hyper, d.Failure, d.Checkpoint)
	}
}

func FuzzParseNeverPanics(f *testing.F) {
	for _, c := range speccorpus.Training() {
		if len(c.Input) < 4096 {
			f.Add([]byte(c.Input))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := spec.Parse(b)
		if err == nil {
			err = s.WithDefaults().Validate()
		}
		if err != nil && len(err.Error()) > 600 {
			t.Fatalf("a %d-byte message", len(err.Error()))
		}
	})
}
