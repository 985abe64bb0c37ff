// Package registry owns the one way durabletrain's plug-in points (trainer
// backends, data set formats) keep what is registered under a name, in the
// manner of gocloud.dev's URL muxes: register once, usually from an init
// function, look up by the name a spec gives.
package registry

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Name is what a plug-in may be called: the same rule as the spec's fields.
var Name = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,63}$`)

// Set holds plug-ins of one kind by name; the zero value is empty and ready.
// It is safe for concurrent use.
type Set[T any] struct {
	// Kind names the plug-ins in messages: "trainer backend", "data set
	// format". Set it before the first use.
	Kind string

	mu sync.RWMutex
	m  map[string]T
}

// Register adds v under name. It panics on a malformed or taken name, as
// gocloud's and database/sql's registries do: both are programming errors
// found at start-up.
func (s *Set[T]) Register(name string, v T) {
	if !Name.MatchString(name) {
		panic(fmt.Sprintf("registry: %s name %q: want lower-case letters, digits, - and _", s.Kind, name))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, taken := s.m[name]; taken {
		panic(fmt.Sprintf("registry: %s %q is registered twice", s.Kind, name))
	}
	if s.m == nil {
		s.m = map[string]T{}
	}
	s.m[name] = v
}

// Lookup returns what name holds, or an error that lists what is registered.
func (s *Set[T]) Lookup(name string) (T, error) {
	s.mu.RLock()
	v, ok := s.m[name]
	s.mu.RUnlock()
	if !ok {
		names := s.Names()
		have := "none is registered"
		if len(names) > 0 {
			have = "registered: " + strings.Join(names, ", ")
		}
		return v, fmt.Errorf("no %s %q on this worker (%s)", s.Kind, name, have)
	}
	return v, nil
}

// Names lists the registered names, sorted.
func (s *Set[T]) Names() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	names := make([]string, 0, len(s.m))
	for n := range s.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
