package tune_test

import (
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/speccorpus"
	"github.com/durabletrain/durabletrain/tune"
)

// Every malformed search of the corpus is refused, before any trial is
// expanded in full, with one bounded line that names the field.
func TestMalformedSearchesAreRefusedNamingTheField(t *testing.T) {
	for _, c := range speccorpus.Tune() {
		s, err := tune.ParseSpec([]byte(c.Input))
		if err == nil {
			_, err = tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
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
