package registry

import (
	"strings"
	"testing"
)

func TestLookupFindsWhatWasRegisteredAndNamesTheRest(t *testing.T) {
	var s Set[int]
	s.Kind = "widget"
	if _, err := s.Lookup("a"); err == nil || !strings.Contains(err.Error(), `no widget "a"`) || !strings.Contains(err.Error(), "none is registered") {
		t.Fatalf("empty set: got %v", err)
	}
	s.Register("b", 2)
	s.Register("a", 1)
	if v, err := s.Lookup("a"); err != nil || v != 1 {
		t.Fatalf("Lookup(a) = %v, %v", v, err)
	}
	if _, err := s.Lookup("c"); err == nil || !strings.Contains(err.Error(), "registered: a, b") {
		t.Fatalf("Lookup(c): got %v, want the registered names", err)
	}
	if got := strings.Join(s.Names(), ","); got != "a,b" {
		t.Fatalf("Names = %s", got)
	}
}

func TestRegisterRefusesTakenAndMalformedNames(t *testing.T) {
	for _, name := range []string{"a", "Bad", "", "has space", strings.Repeat("x", 65)} {
		t.Run(name, func(t *testing.T) {
			var s Set[int]
			s.Register("a", 1)
			defer func() {
				if recover() == nil {
					t.Fatalf("Register(%q) did not panic", name)
				}
			}()
			s.Register(name, 2)
		})
	}
}
