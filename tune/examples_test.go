package tune_test

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/tune"
)

// The searches the README and examples/ show are accepted as written.
func TestExampleSearchesAreValid(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../examples/tune-lr-width.json")
	if err != nil {
		t.Fatal(err)
	}
	searches := []string{string(example)}
	for _, m := range regexp.MustCompile("(?s)```json\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		if strings.Contains(m[1], "param_space") {
			searches = append(searches, m[1])
		}
	}
	if len(searches) < 2 {
		t.Fatal("no search in the README")
	}
	for _, raw := range searches {
		s, err := tune.ParseSpec([]byte(raw))
		if err == nil {
			_, err = tune.Trials(s.Train, s.ParamSpace, s.NumSamples, s.Seed)
		}
		if err != nil {
			t.Errorf("search:\n%s\n%v", raw, err)
		}
	}
}
