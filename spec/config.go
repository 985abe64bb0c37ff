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
// reads the keys of NativeConfig, which take precedence over the fields
// they name.
type Config map[string]json.RawMessage

// Limits of a config: it travels to every rank in an environment variable.
const (
	MaxConfigKeys  = 256
	MaxConfigBytes = 8 << 10
)

var configKeyPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_-]{0,63}$`)

// NativeConfig maps the config keys the native trainer reads to the spec
// fields they set.
var NativeConfig = map[string]string{
	"lr":           "hyper.lr",
	"batch_size":   "hyper.batch_size",
	"optimizer":    "hyper.optimizer",
	"momentum":     "hyper.momentum",
	"weight_decay": "hyper.weight_decay",
	"seed":         "hyper.seed",
	"hidden":       "model.hidden",
}

// configWants is the JSON type each native config key takes.
var configWants = map[string]string{
	"lr": "a number", "batch_size": "an integer", "optimizer": `"adam" or "sgd"`, "momentum": "a number",
	"weight_decay": "a number", "seed": "an integer from 0 to 2^64-1", "hidden": "a list of layer widths, such as [256, 128]",
}

// nativeTarget is where the native trainer puts config key k in t.
func nativeTarget(t *Training, key string) any {
	switch key {
	case "lr":
		return &t.Hyper.LR
	case "batch_size":
		return &t.Hyper.BatchSize
	case "optimizer":
		return &t.Hyper.Optimizer
	case "momentum":
		return &t.Hyper.Momentum
	case "weight_decay":
		return &t.Hyper.WeightDecay
	case "seed":
		return &t.Hyper.Seed
	case "hidden":
		return &t.Model.Hidden
	}
	return nil
}

// JSON is the config as one compact JSON object, keys sorted ("{}" when empty).
func (c Config) JSON() string {
	if len(c) == 0 {
		return "{}"
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range slices.Sorted(maps.Keys(c)) {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		if err := json.Compact(&b, c[k]); err != nil {
			b.WriteString("null")
		}
	}
	b.WriteByte('}')
	return b.String()
}

// check names the first key or value of the config that is not accepted;
// for the native trainer, a key it does not read, or a value of the wrong
// type for the field it sets.
func (c Config) check(native bool) error {
	if len(c) > MaxConfigKeys {
		return fmt.Errorf("config has %d keys; want at most %d", len(c), MaxConfigKeys)
	}
	if n := len(c.JSON()); n > MaxConfigBytes {
		return fmt.Errorf("config is %d bytes as JSON; want at most %d (it reaches every rank in an environment variable)", n, MaxConfigBytes)
	}
	for _, k := range slices.Sorted(maps.Keys(c)) {
		if !configKeyPattern.MatchString(k) {
			return fmt.Errorf("config has the key %s; want 1-64 letters, digits, _ or -, starting with a letter or _", quoted(k))
		}
		if !json.Valid(c[k]) {
			return fmt.Errorf("config.%s is not JSON", k)
		}
		if !native {
			continue
		}
		field, ok := NativeConfig[k]
		if !ok {
			return fmt.Errorf("config.%s: the native trainer reads only %s from config; want one of them, or the field itself", k, nativeKeys())
		}
		var scratch Training
		dec := json.NewDecoder(bytes.NewReader(c[k]))
		if err := dec.Decode(nativeTarget(&scratch, k)); err != nil || string(bytes.TrimSpace(c[k])) == "null" {
			return fmt.Errorf("config.%s is %s; want %s (it sets %s)", k, bound(string(c[k])), configWants[k], field)
		}
	}
	return nil
}

func nativeKeys() string {
	keys := slices.Sorted(maps.Keys(NativeConfig))
	return strings.Join(keys, ", ")
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
		if target := nativeTarget(t, k); target != nil {
			// Decoded into a value of its own, then set: decoding into the
			// field itself would reuse a slice's array that copies of the
			// spec share.
			var scratch Training
			if decoded := nativeTarget(&scratch, k); json.Unmarshal(t.Config[k], decoded) == nil {
				reflect.ValueOf(target).Elem().Set(reflect.ValueOf(decoded).Elem())
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
		field, ok := NativeConfig[k]
		if !ok {
			continue
		}
		for _, prefix := range []string{"spec: " + field + " ", "spec: " + field + "["} {
			if strings.HasPrefix(msg, prefix) {
				return fmt.Errorf("spec: config.%s sets %s: %s", k, field, strings.TrimPrefix(msg, "spec: "))
			}
		}
	}
	return err
}
