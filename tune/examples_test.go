package tune_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/specdoc"
	"github.com/durabletrain/durabletrain/tune"
)

// The searches the README, the guides and examples/ show are accepted as written.
func TestExampleSearchesAreValid(t *testing.T) {
	guides, err := specdoc.Guides("..")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../examples/tune-lr-width.json")
	if err != nil {
		t.Fatal(err)
	}
	searches := []string{string(example)}
	for _, text := range guides {
		for _, raw := range specdoc.JSONBlocks(text) {
			if strings.Contains(raw, "param_space") {
				searches = append(searches, raw)
			}
		}
	}
	if len(searches) < 2 {
		t.Fatal("no search in the guides")
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

// TestScopeDefaultsToLastAndIsChecked: a search ranks by the last value
// unless its scope says otherwise, and a scope Ray does not have is refused
// naming the field and the scopes it may be.
func TestScopeDefaultsToLastAndIsChecked(t *testing.T) {
	const search = `{"param_space": {"hyper.lr": {"choice": [0.01, 0.1]}}%s}`
	s, err := tune.ParseSpec([]byte(fmt.Sprintf(search, "")))
	if err != nil || s.Scope != spec.ScopeLast {
		t.Fatalf("no scope: %q, %v; want last", s.Scope, err)
	}
	if s, err := tune.ParseSpec([]byte(fmt.Sprintf(search, `, "scope": "last-5-avg"`))); err != nil || s.Scope != spec.ScopeLast5Avg {
		t.Fatalf("last-5-avg: %q, %v", s.Scope, err)
	}
	_, err = tune.ParseSpec([]byte(fmt.Sprintf(search, `, "scope": "median"`)))
	if err == nil || !strings.Contains(err.Error(), `scope is "median"; want one of "last", "all", "avg", "last-5-avg" or "last-10-avg"`) {
		t.Fatalf("scope median: %v", err)
	}
}
