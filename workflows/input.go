package workflows

import (
	"encoding/json"
	"fmt"

	"go.temporal.io/sdk/converter"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/tune"
)

// continuedKey is the field of the input that carries a run's state through
// continue-as-new, beside the spec's own fields.
const continuedKey = "continued"

// continuedGangKey carries the gang a run kept through continue-as-new
// (keptGang): its hosts' holds wait for the next run to take them over.
const continuedGangKey = "continued_gang"

// keptGang is the gang a run continued as new with: its generation and,
// by host, what its hold was asked as and the host's own queue (where the
// next run asks for it). Placements are not carried: the hosts grant them
// again, so the input stays small however many hosts the gang has.
type keptGang struct {
	Generation int        `json:"generation"`
	Hosts      []keptHost `json:"hosts"`
}

type keptHost struct {
	Hold  holdID `json:"hold"`
	Queue string `json:"queue"`
}

// holdID names a host's hold as the agent knows it: the generation it was
// asked for (a grown gang's first hosts keep their older one) and the request.
type holdID struct {
	Generation int `json:"generation"`
	Request    int `json:"request"`
}

// inputBytes is the JSON a run or a search was started with, taken as raw
// bytes: the SDK's own decoding would fail malformed JSON with an error that
// names no field and is not typed as the user's.
func inputBytes(v converter.RawValue) ([]byte, error) {
	p := v.Payload()
	if p == nil {
		return nil, nil // no input: the spec parser says what is wanted
	}
	switch enc := string(p.GetMetadata()[converter.MetadataEncoding]); enc {
	case converter.MetadataEncodingJSON:
		return p.GetData(), nil
	case converter.MetadataEncodingNil:
		return nil, nil
	default:
		return nil, fmt.Errorf("the input is encoded as %.40q; want json/plain: the JSON spec as it is", enc)
	}
}

// decodeInput reads the spec strictly, and the carried state if this run
// continues another. Only a run that continue-as-new started (continued:
// the server says so, in its start event) may carry state: a caller cannot
// claim epochs done or lift the epoch limit.
func decodeInput(raw json.RawMessage, continued bool) (spec.Training, *spec.Progress, *keptGang, error) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil || fields[continuedKey] == nil && fields[continuedGangKey] == nil {
		s, err := spec.Parse(raw) // it explains what is wrong with the input
		return s, nil, nil, err
	}
	if !continued {
		return spec.Training{}, nil, nil, fmt.Errorf("%s: the state continue-as-new carries; a start may not supply it", continuedKey)
	}
	var p *spec.Progress
	if err := json.Unmarshal(fields[continuedKey], &p); err != nil || p == nil {
		return spec.Training{}, nil, nil, fmt.Errorf("%s: the carried state does not decode: %v", continuedKey, err)
	}
	var kept *keptGang
	if fields[continuedGangKey] != nil {
		// A gang that does not add up is not taken over: the run forms a new one.
		if json.Unmarshal(fields[continuedGangKey], &kept) != nil || kept == nil || len(kept.Hosts) == 0 {
			kept = nil
		}
	}
	p.Gang, p.World = nil, 0
	delete(fields, continuedKey)
	delete(fields, continuedGangKey)
	raw, _ = json.Marshal(fields)
	s, err := spec.Parse(raw)
	return s, p, kept, err
}

// encodeInput is the input of the run that continues this one; kept, if
// set, is the gang whose holds the next run takes over.
func encodeInput(s spec.Training, p *spec.Progress, kept *keptGang) (json.RawMessage, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	json.Unmarshal(b, &fields)
	carried := *p
	carried.Gang, carried.World = nil, 0 // the next run's gang is what it takes over
	fields[continuedKey], _ = json.Marshal(carried)
	if kept != nil {
		fields[continuedGangKey], _ = json.Marshal(kept)
	}
	return json.Marshal(fields)
}

// decodeTuneInput reads a search's spec strictly, and what it carries if
// continue-as-new started it (only then may it carry anything).
func decodeTuneInput(raw json.RawMessage, continued bool) (tune.Spec, *tuneCarried, error) {
	var fields map[string]json.RawMessage
	if json.Unmarshal(raw, &fields) != nil || fields[continuedKey] == nil {
		s, err := tune.ParseSpec(raw)
		return s, nil, err
	}
	if !continued {
		return tune.Spec{}, nil, fmt.Errorf("%s: the state continue-as-new carries; a start may not supply it", continuedKey)
	}
	var c *tuneCarried
	if err := json.Unmarshal(fields[continuedKey], &c); err != nil || c == nil || c.Results == nil {
		return tune.Spec{}, nil, fmt.Errorf("%s: the carried state does not decode: %v", continuedKey, err)
	}
	delete(fields, continuedKey)
	raw, _ = json.Marshal(fields)
	s, err := tune.ParseSpec(raw)
	return s, c, err
}

// encodeTuneInput is the input of the search execution that continues
// this one: its input with what it carries replaced.
func encodeTuneInput(raw json.RawMessage, c *tuneCarried) (json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	var err error
	if fields[continuedKey], err = json.Marshal(c); err != nil {
		return nil, err
	}
	return json.Marshal(fields)
}
