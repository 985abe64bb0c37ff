package spec_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
)

// The training specs the README shows are accepted as they are written.
func TestREADMESpecsAreValid(t *testing.T) {
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	// and the specs inside --input '...' of the shell examples
	inputs := regexp.MustCompile(`--input '(\{.*?\})'`).FindAllStringSubmatch(string(b), -1)
	n := 0
	for _, m := range append(blocks, inputs...) {
		if strings.Contains(m[1], "param_space") {
			continue // a search: package tune checks it
		}
		n++
		s, err := spec.Parse([]byte(m[1]))
		if err == nil {
			err = s.WithDefaults().Validate()
		}
		if err != nil {
			t.Errorf("README spec:\n%s\n%v", m[1], err)
		}
	}
	if n < 2 {
		t.Fatalf("found %d specs in the README", n)
	}
}
