package spec_test

import (
	"reflect"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer/native"
)

// The spec cannot import the trainer (workflows depend on spec alone), so the
// model and optimizer defaults live in both: this test keeps them the same.
func TestDefaultsAgreeWithTheNativeTrainer(t *testing.T) {
	for _, opt := range []string{"", "adam", "sgd"} {
		s := spec.Training{Hyper: spec.Hyper{Optimizer: opt}}.WithDefaults()
		fromSpec := native.ConfigOf(s, s.Hyper.BatchSize)
		own := native.Config{Optimizer: opt}.WithDefaults()
		if !reflect.DeepEqual(fromSpec, own) {
			t.Errorf("optimizer %q: the spec's defaults give %+v, the native trainer's %+v", opt, fromSpec, own)
		}
	}
}
