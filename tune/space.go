// Package tune owns hyperparameter search as pure, deterministic functions:
// the search space over any field of a training spec (Ray Tune's
// grid_search, choice, uniform, loguniform and randint), the trials it
// expands to (grid cells repeated num_samples times, random dimensions drawn
// from a seed), and the trial schedulers (FIFO, ASHA, median stopping) as
// decisions on reported results. TuneWorkflow (package workflows) drives
// them; nothing here knows Temporal.
package tune

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/durabletrain/durabletrain/spec"
)

// Domain is one dimension of a search space, written as Ray Tune writes it:
//
//	{"grid_search": [0.001, 0.01]}   every value, in every sample
//	{"choice": [[64], [256, 128]]}   one of the values, at random
//	{"uniform": [0.0, 0.5]}          a float in [lo, hi)
//	{"loguniform": [1e-4, 1e-1]}     a float whose log is uniform in [log lo, log hi)
//	{"randint": [16, 257]}           an integer in [lo, hi)
type Domain struct {
	Kind   string            // grid_search, choice, uniform, loguniform, randint
	Values []json.RawMessage // grid_search, choice
	Lo, Hi float64           // uniform, loguniform, randint
}

func (d *Domain) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || len(m) != 1 {
		return fmt.Errorf(`want one of {"grid_search": [...]}, {"choice": [...]}, {"uniform": [lo, hi]}, {"loguniform": [lo, hi]}, {"randint": [lo, hi]}`)
	}
	for kind, raw := range m {
		d.Kind = kind
		switch kind {
		case "grid_search", "choice":
			if err := json.Unmarshal(raw, &d.Values); err != nil || len(d.Values) == 0 {
				return fmt.Errorf("%s: want a non-empty list of values", kind)
			}
		case "uniform", "loguniform", "randint":
			var lh []float64
			if err := json.Unmarshal(raw, &lh); err != nil || len(lh) != 2 || !(lh[0] < lh[1]) {
				return fmt.Errorf("%s: want [lo, hi] with lo < hi", kind)
			}
			d.Lo, d.Hi = lh[0], lh[1]
			if kind == "loguniform" && d.Lo <= 0 {
				return fmt.Errorf("loguniform: lo must be above 0, not %v", d.Lo)
			}
			if kind == "randint" && (d.Lo != math.Trunc(d.Lo) || d.Hi != math.Trunc(d.Hi)) {
				return fmt.Errorf("randint: want integers [lo, hi)")
			}
		default:
			return fmt.Errorf("unknown domain %q: want grid_search, choice, uniform, loguniform or randint", kind)
		}
	}
	return nil
}

func (d Domain) MarshalJSON() ([]byte, error) {
	switch d.Kind {
	case "grid_search", "choice":
		return json.Marshal(map[string]any{d.Kind: d.Values})
	}
	return json.Marshal(map[string]any{d.Kind: []float64{d.Lo, d.Hi}})
}

// sample draws a value of a random dimension.
func (d Domain) sample(rng *rand.Rand) json.RawMessage {
	var v any
	switch d.Kind {
	case "choice":
		return d.Values[rng.IntN(len(d.Values))]
	case "uniform":
		v = d.Lo + rng.Float64()*(d.Hi-d.Lo)
	case "loguniform":
		v = math.Exp(math.Log(d.Lo) + rng.Float64()*(math.Log(d.Hi)-math.Log(d.Lo)))
	case "randint":
		v = int64(d.Lo) + rng.Int64N(int64(d.Hi-d.Lo))
	}
	b, _ := json.Marshal(v)
	return b
}

// Trial is one configuration to train.
type Trial struct {
	Index  int                        `json:"index"`
	Config map[string]json.RawMessage `json:"config"` // spec path -> value
	Spec   spec.Training              `json:"-"`
}

// Trials expands a search space over base: every grid cell (the cross
// product of the grid_search dimensions, in key order) repeated numSamples
// times, each with its random dimensions drawn from seed and the trial's
// index, so the same inputs give the same trials. Every trial's spec is
// parsed strictly, so a path that names no field is an error naming it.
func Trials(base json.RawMessage, space map[string]Domain, numSamples int, seed uint64) ([]Trial, error) {
	if numSamples < 1 {
		return nil, fmt.Errorf("num_samples is %d; want 1 or more", numSamples)
	}
	if _, err := trialCount(space, numSamples); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(space))
	for k := range space {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	cells := []map[string]json.RawMessage{{}}
	for _, k := range keys {
		d := space[k]
		if d.Kind != "grid_search" {
			continue
		}
		var next []map[string]json.RawMessage
		for _, c := range cells {
			for _, v := range d.Values {
				n := cloneConfig(c)
				n[k] = v
				next = append(next, n)
			}
		}
		cells = next
	}
	var trials []Trial
	for range numSamples {
		for _, c := range cells {
			i := len(trials)
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			cfg := cloneConfig(c)
			for _, k := range keys {
				if d := space[k]; d.Kind != "grid_search" {
					cfg[k] = d.sample(rng)
				}
			}
			sp, err := Apply(base, cfg)
			if err != nil {
				return nil, err
			}
			trials = append(trials, Trial{Index: i, Config: cfg, Spec: sp})
		}
	}
	return trials, nil
}

func cloneConfig(m map[string]json.RawMessage) map[string]json.RawMessage {
	n := make(map[string]json.RawMessage, len(m)+4)
	for k, v := range m {
		n[k] = v
	}
	return n
}

// Apply sets each dotted path of cfg ("hyper.lr", "model.hidden") in the
// base spec, parses the result strictly and validates it.
func Apply(base json.RawMessage, cfg map[string]json.RawMessage) (spec.Training, error) {
	var doc map[string]any
	if len(base) == 0 {
		base = json.RawMessage("{}")
	}
	if err := decodeNumbers(base, &doc); err != nil || doc == nil {
		return spec.Training{}, fmt.Errorf("train: not a JSON object: %v", err)
	}
	keys := make([]string, 0, len(cfg))
	for k := range cfg {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, path := range keys {
		var v any
		if err := decodeNumbers(cfg[path], &v); err != nil {
			return spec.Training{}, fmt.Errorf("param_space.%s: %v", path, err)
		}
		parts := strings.Split(path, ".")
		m := doc
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok && m[p] != nil {
				return spec.Training{}, fmt.Errorf("param_space.%s: train.%s is not an object", path, p)
			}
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = v
	}
	b, _ := json.Marshal(doc)
	s, err := spec.Parse(b)
	if err == nil {
		err = s.WithDefaults().Validate()
	}
	if err != nil {
		return spec.Training{}, fmt.Errorf("param_space: %v", err)
	}
	return s, nil
}

// decodeNumbers decodes JSON keeping numbers as written (a seed of 2^64-1
// survives; float64 would round it).
func decodeNumbers(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	return dec.Decode(v)
}
