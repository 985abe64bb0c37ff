package spec

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
)

// Config is a run's hyperparameters as Ray passes them to a trainable: any
// JSON values by name. A search's param_space sets them as "config.<key>".
// An exec program reads the whole of it (DURABLETRAIN_CONFIG, as a JSON
// object; durabletrain.config() in the Python helper); the native trainer
// reads the keys of nativeConfig, which take precedence over the fields
// they name.
type Config map[string]json.RawMessage

// Limits of a config: it travels to every rank in an environment variable.
const (
	MaxConfigKeys  = 256
	MaxConfigBytes = 8 << 10
)

var configKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,63}$`)

// nativeConfig is what the native trainer reads from a config: each key,
// the spec field it sets, the JSON it takes, and where it goes.
var nativeConfig = map[string]struct {
	field, wants string
	target       func(*Training) any
}{
	"lr":           {"hyper.lr", "a number", func(t *Training) any { return &t.Hyper.LR }},
	"batch_size":   {"hyper.batch_size", "an integer", func(t *Training) any { return &t.Hyper.BatchSize }},
	"optimizer":    {"hyper.optimizer", `"adam" or "sgd"`, func(t *Training) any { return &t.Hyper.Optimizer }},
	"momentum":     {"hyper.momentum", "a number", func(t *Training) any { return &t.Hyper.Momentum }},
	"weight_decay": {"hyper.weight_decay", "a number", func(t *Training) any { return &t.Hyper.WeightDecay }},
	"seed":         {"hyper.seed", "an integer from 0 to 2^64-1", func(t *Training) any { return &t.Hyper.Seed }},
	"hidden":       {"model.hidden", "a list of layer widths, such as [256, 128]", func(t *Training) any { return &t.Model.Hidden }},
}

// JSON is the config as one compact JSON object, keys sorted ("{}" when
// empty; call it on a config that check accepted).
func (c Config) JSON() string {
	if len(c) == 0 {
		return "{}"
	}
	b, err := json.Marshal(map[string]json.RawMessage(c))
	if err != nil {
		return "{}"
	}
	return string(b)
}

// check names the first key or value of the config that is not accepted;
// for the native trainer, a key it does not read, or a value of the wrong
// type for the field it sets.
func (c Config) check(native bool) error {
	if len(c) > MaxConfigKeys {
		return fmt.Errorf("config has %d keys; want at most %d", len(c), MaxConfigKeys)
	}
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if !configKeyPattern.MatchString(k) {
			return fmt.Errorf("config has the key %s; want 1-64 letters, digits, _ or -, starting with a letter or _", quoted(k))
		}
		if !json.Valid(c[k]) {
			return fmt.Errorf("config.%s is not JSON", k)
		}
	}
	if n := len(c.JSON()); n > MaxConfigBytes {
		return fmt.Errorf("config is %d bytes as JSON; want at most %d (it reaches every rank in an environment variable)", n, MaxConfigBytes)
	}
	if !native {
		return nil
	}
	for _, k := range slices.Sorted(maps.Keys(c)) {
		key, ok := nativeConfig[k]
		if !ok {
			return fmt.Errorf("config.%s: the native trainer reads only %s from config; want one of them, or the field itself",
				k, strings.Join(slices.Sorted(maps.Keys(nativeConfig)), ", "))
		}
		var scratch Training
		if err := json.Unmarshal(c[k], key.target(&scratch)); err != nil || string(bytes.TrimSpace(c[k])) == "null" {
			return fmt.Errorf("config.%s is %s; want %s (it sets %s)", k, bound(string(c[k])), key.wants, key.field)
		}
	}
	return nil
}

func bound(s string) string {
	if len(s) > 64 {
		return s[:48] + "…"
	}
	return s
}

// applyNativeConfig sets the fields the native trainer's config keys name
// (values that do not decode are left for Validate to name).
func (t *Training) applyNativeConfig() {
	for _, k := range slices.Sorted(maps.Keys(t.Config)) {
		if key, ok := nativeConfig[k]; ok {
			// Decoded into a value of its own, then set: decoding into the
			// field itself would reuse a slice's array that copies of the
			// spec share.
			var scratch Training
			if decoded := key.target(&scratch); json.Unmarshal(t.Config[k], decoded) == nil {
				reflect.ValueOf(key.target(t)).Elem().Set(reflect.ValueOf(decoded).Elem())
			}
		}
	}
}

// fromConfig rewrites a validation error about a field the native config
// set so that it names the config key the value came from.
func (t Training) fromConfig(err error) error {
	if err == nil || t.Trainer != TrainerNative {
		return err
	}
	msg := err.Error()
	for _, k := range slices.Sorted(maps.Keys(t.Config)) {
		key, ok := nativeConfig[k]
		if !ok {
			continue
		}
		field := key.field
		for _, prefix := range []string{"spec: " + field + " ", "spec: " + field + "["} {
			if strings.HasPrefix(msg, prefix) {
				return fmt.Errorf("spec: config.%s sets %s: %s", k, field, strings.TrimPrefix(msg, "spec: "))
			}
		}
	}
	return err
}
