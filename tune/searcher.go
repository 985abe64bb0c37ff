package tune

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
)

// Searcher suggests the next trials' configs from the results of the
// trials that ended (Ray Tune's search_alg). A searcher is deterministic:
// the same observations in the same order give the same suggestions, so a
// workflow replays it; its state (State, SetState) crosses continue-as-new.
type Searcher interface {
	// Suggest is trial's config (param_space path -> JSON value).
	Suggest(trial int) map[string]json.RawMessage
	// Observe records an ended trial's score under the search's metric and
	// mode (its value under the search's scope); NaN scores are ignored.
	Observe(trial int, config map[string]json.RawMessage, score float64)
}

// SearcherConfig chooses and configures a searcher.
type SearcherConfig struct {
	// Type: "random" (the default: Ray's BasicVariantGenerator; grid cells
	// repeated num_samples times, random dimensions drawn from the seed) or
	// "tpe" (Tree-structured Parzen Estimator, as Optuna's default sampler).
	Type string `json:"type,omitempty"`
	// NStartupTrials: tpe draws at random until this many trials have ended; default 10.
	NStartupTrials int `json:"n_startup_trials,omitempty"`
	// NEICandidates: tpe scores this many draws from the good trials' model per dimension; default 24.
	NEICandidates int `json:"n_ei_candidates,omitempty"`
}

// The searchers.
const (
	SearchRandom = "random"
	SearchTPE    = "tpe"
)

// MaxObservations bounds what a model-based searcher remembers: the
// newest this many ended trials (its state crosses continue-as-new in one
// payload).
const MaxObservations = 1000

// check names the first bad field of the searcher's configuration.
func (c SearcherConfig) check(space map[string]Domain) error {
	switch c.Type {
	case "", SearchRandom:
		if c.NStartupTrials != 0 || c.NEICandidates != 0 {
			return fmt.Errorf(`search_alg: n_startup_trials and n_ei_candidates are for "tpe"; the random searcher takes none`)
		}
		return nil
	case SearchTPE:
	default:
		return fmt.Errorf(`search_alg.type is %q; want "random" (the default) or "tpe"`, c.Type)
	}
	switch {
	case c.NStartupTrials < 0 || c.NStartupTrials > MaxObservations:
		return fmt.Errorf("search_alg.n_startup_trials is %d; want 1 to %d (leave it out for 10)", c.NStartupTrials, MaxObservations)
	case c.NEICandidates < 0 || c.NEICandidates > 1000:
		return fmt.Errorf("search_alg.n_ei_candidates is %d; want 1 to 1000 (leave it out for 24)", c.NEICandidates)
	}
	for _, k := range slices.Sorted(maps.Keys(space)) {
		if space[k].Kind == "grid_search" {
			return fmt.Errorf(`param_space.%s is a grid_search; search_alg "tpe" models every dimension: want choice, uniform, loguniform or randint`, boundKey(k))
		}
	}
	return nil
}

// NewSearcher builds the configured searcher over a space; nil for the
// random searcher, whose trials Trials expands ahead.
func NewSearcher(c SearcherConfig, space map[string]Domain, mode string, seed uint64) (Searcher, error) {
	if err := c.check(space); err != nil {
		return nil, err
	}
	if c.Type != SearchTPE {
		return nil, nil
	}
	t := &TPE{space: space, keys: slices.Sorted(maps.Keys(space)), mode: mode, seed: seed,
		startup: c.NStartupTrials, candidates: c.NEICandidates}
	if t.startup == 0 {
		t.startup = 10
	}
	if t.candidates == 0 {
		t.candidates = 24
	}
	return t, nil
}

// randomConfig draws a config as the random searcher draws trial i's
// random dimensions (one generator per trial, dimensions in key order), so
// a model-based searcher's first trials are random search's.
func randomConfig(space map[string]Domain, keys []string, seed uint64, trial int) map[string]json.RawMessage {
	rng := rand.New(rand.NewPCG(seed, uint64(trial)))
	cfg := make(map[string]json.RawMessage, len(keys))
	for _, k := range keys {
		cfg[k] = space[k].sample(rng)
	}
	return cfg
}

// SearcherState is a searcher's state as JSON (null for none).
func SearcherState(s Searcher) (json.RawMessage, error) {
	if t, ok := s.(*TPE); ok {
		return json.Marshal(t.obs)
	}
	return json.RawMessage("null"), nil
}

// SetSearcherState restores a state SearcherState returned, into a
// searcher NewSearcher made from the same configuration.
func SetSearcherState(s Searcher, state json.RawMessage) error {
	if len(state) == 0 || string(state) == "null" {
		return nil
	}
	t, ok := s.(*TPE)
	if !ok {
		return fmt.Errorf("a searcher state for a searcher that keeps none")
	}
	var obs []observation
	if err := json.Unmarshal(state, &obs); err != nil {
		return fmt.Errorf("tpe state: %w", err)
	}
	if len(obs) > MaxObservations {
		return fmt.Errorf("tpe state has %d observations; want at most %d", len(obs), MaxObservations)
	}
	t.obs = obs
	return nil
}

// finite reports whether v is a number a model can use.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
