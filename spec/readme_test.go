package spec_test

import (
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/specdoc"
)

// The training specs the README and the guides show are accepted as they
// are written (the searches: package tune checks them).
func TestGuideSpecsAreValid(t *testing.T) {
	guides, err := specdoc.Guides("..")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, text := range guides {
		for _, raw := range specdoc.JSONBlocks(text) {
			if strings.Contains(raw, "param_space") {
				continue
			}
			n++
			s, err := spec.Parse([]byte(raw))
			if err == nil {
				err = s.WithDefaults().Validate()
			}
			if err != nil {
				t.Errorf("%s: spec\n%s\n%v", name, raw, err)
			}
		}
	}
	if n < 2 {
		t.Fatalf("found %d specs in the guides", n)
	}
}
