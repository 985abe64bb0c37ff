package workflows

import (
	"encoding/json"
	"fmt"

	"github.com/durabletrain/durabletrain/spec"
)

// continuedKey is the field of the input that carries a run's state through
// continue-as-new, beside the spec's own fields.
const continuedKey = "continued"

// decodeInput reads the spec strictly, and the carried state if this run continues another.
func decodeInput(raw json.RawMessage) (spec.Training, *spec.Progress, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return spec.Training{}, nil, fmt.Errorf("spec: the input is not a JSON object: %v", err)
	}
	var p *spec.Progress
	if c, ok := fields[continuedKey]; ok {
		if err := json.Unmarshal(c, &p); err != nil {
			return spec.Training{}, nil, fmt.Errorf("continued state: %v", err)
		}
		delete(fields, continuedKey)
		raw, _ = json.Marshal(fields)
	}
	s, err := spec.Parse(raw)
	return s, p, err
}

// encodeInput is the input of the run that continues this one.
func encodeInput(s spec.Training, p *spec.Progress) (json.RawMessage, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	json.Unmarshal(b, &fields)
	fields[continuedKey], _ = json.Marshal(p)
	return json.Marshal(fields)
}
