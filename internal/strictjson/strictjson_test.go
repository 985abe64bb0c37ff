package strictjson

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

type dur time.Duration

func (d *dur) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration such as \"10s\"")
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want a duration such as \"10s\", not %q", s)
	}
	*d = dur(v)
	return nil
}

type inner struct {
	Epochs  int      `json:"epochs,omitempty"`
	LR      float64  `json:"lr,omitempty"`
	Timeout dur      `json:"timeout,omitempty"`
	Widths  []int    `json:"widths,omitempty"`
	Max     *int     `json:"max,omitempty"`
	Names   []string `json:"names,omitempty"`
}

type doc struct {
	Name  string             `json:"name,omitempty"`
	Hyper inner              `json:"hyper"`
	Stop  map[string]float64 `json:"stop,omitempty"`
	Train json.RawMessage    `json:"train,omitempty"`
	Seed  uint64             `json:"seed,omitempty"`
}

func TestErrorsNameTheFieldAndThePosition(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{``, "the input is empty; want a JSON object"},
		{`null`, "the input is null; want a JSON object (line 1, column 1)"},
		{`[]`, "want an object {...}, got a list (line 1, column 1)"},
		{`{"hyper": {"epochs": "ten"}}`, `hyper.epochs: want a whole number, got the string "ten" (line 1, column 22)`},
		{"{\n  \"hyper\": {\n    \"epochs\": 1.5}}", "hyper.epochs: want a whole number, got the number 1.5 (line 3, column 15)"},
		{`{"hyper": {"epochz": 1}}`, `hyper: unknown field "epochz"; want one of epochs, lr, max, names, timeout, widths (line 1, column 12)`},
		{`{"Hyper": {}}`, `unknown field "Hyper"; did you mean "hyper"? (names are lower case) (line 1, column 2)`},
		{`{"name": "a", "name": "b"}`, `name: given twice; want each field once (line 1, column 15)`},
		{`{"hyper": {"timeout": "10 s"}}`, `hyper.timeout: want a duration such as "10s", not "10 s" (line 1, column 23)`},
		{`{"hyper": {"timeout": 10}}`, `hyper.timeout: want a duration such as "10s" (line 1, column 23)`},
		{`{"hyper": {"widths": [1, "x"]}}`, `hyper.widths[1]: want a whole number, got the string "x" (line 1, column 26)`},
		{`{"hyper": {"widths": 3}}`, `hyper.widths: want a list [...], got the number 3 (line 1, column 22)`},
		{`{"stop": {"loss": "low"}}`, `stop.loss: want a number, got the string "low" (line 1, column 19)`},
		{`{"seed": -1}`, `seed: want a whole number, 0 or more, got the number -1 (line 1, column 10)`},
		{`{"hyper": {"lr": 1e999}}`, `hyper.lr: want a number, got the number 1e999 (line 1, column 18)`},
		{`{"hyper": {"epochs": 1}`, `the JSON ends before it is complete`},
		{"{\n\"hyper\": {\"epochs\": 1,}}", `not valid JSON: invalid character '}' looking for beginning of object key string (line 2, column 23)`},
		{`{"name": "a"} {"name": "b"}`, `not valid JSON: invalid character '{' after top-level value (line 1, column 15)`},
		{"{\"name\": \"\xff\"}", `not valid UTF-8 text (line 1, column 11)`},
	} {
		var d doc
		err := Decode([]byte(tc.in), &d)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s\n got: %v\nwant: %s", tc.in, err, tc.want)
		}
	}
}

func TestAcceptedDocumentsDecode(t *testing.T) {
	var d doc
	err := Decode([]byte(`{"name": "x", "hyper": {"epochs": 3, "max": 0, "timeout": "2s", "widths": [4, 5], "names": null},
		"stop": {"a": 1}, "train": {"anything": [1, {"goes": true}]}, "seed": 18446744073709551615}`), &d)
	if err != nil {
		t.Fatal(err)
	}
	if d.Hyper.Epochs != 3 || d.Hyper.Max == nil || *d.Hyper.Max != 0 || time.Duration(d.Hyper.Timeout) != 2*time.Second ||
		d.Seed != 18446744073709551615 || !strings.Contains(string(d.Train), "goes") {
		t.Fatalf("decoded %+v", d)
	}
}

// As checks a raw field against a schema it is not decoded into.
func TestAsChecksARawFieldAgainstASchema(t *testing.T) {
	var d doc
	err := Decode([]byte(`{"train": {"hyper": {"epochs": "x"}}}`), &d, As("train", doc{}))
	if err == nil || err.Error() != `train.hyper.epochs: want a whole number, got the string "x" (line 1, column 32)` {
		t.Fatalf("got %v", err)
	}
	if err := Decode([]byte(`{"train": {"hyper": {"epochs": 2}}}`), &d, As("train", doc{})); err != nil || string(d.Train) != `{"hyper": {"epochs": 2}}` {
		t.Fatalf("got %v, train %s", err, d.Train)
	}
}

// Whatever the input, the message stays one short line.
func TestMessagesAreBounded(t *testing.T) {
	huge := strings.Repeat("x", 5<<20)
	for _, in := range []string{
		`{"` + huge + `": 1}`,
		`{"name": 1, "hyper": {"epochs": "` + huge + `"}}`,
		`{"hyper": {"widths": [` + strings.Repeat("1,", 1000) + `"` + huge + `"]}}`,
		`{"stop": {"` + huge + `": "x"}}`,
		strings.Repeat("[", 100000),
	} {
		var d doc
		err := Decode([]byte(in), &d)
		if err == nil || len(err.Error()) > 400 || strings.Contains(err.Error(), "\n") {
			t.Fatalf("a %d-byte input gave a %d-byte message: %.500v", len(in), len(err.Error()), err)
		}
	}
}

func FuzzDecodeNeverPanics(f *testing.F) {
	f.Add([]byte(`{"hyper": {"epochs": 3, "widths": [1]}, "stop": {"a": 1}}`))
	f.Add([]byte(`{"hyper": {"timeout": "1s"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d doc
		err := Decode(b, &d, As("train", doc{}))
		if err != nil && len(err.Error()) > 600 {
			t.Fatalf("message of %d bytes", len(err.Error()))
		}
		if err == nil {
			// What passes the strict check, encoding/json accepts too.
			var again doc
			if err := json.Unmarshal(b, &again); err != nil {
				t.Fatalf("passed the strict check but not encoding/json: %v", err)
			}
		}
	})
}

func TestCheckPath(t *testing.T) {
	for path, want := range map[string]string{
		"hyper.lr":         "",
		"hyper.widths":     "",
		"hyper":            "",
		"hyper.":           `"hyper." has an empty part`,
		"hyper.learn_rate": `"hyper.learn_rate": unknown field "learn_rate"; want one of epochs, lr, max, names, timeout, widths in hyper`,
		"hyper.lr.x":       `"hyper.lr.x": hyper.lr is a single value`,
		"Hyper.lr":         `did you mean "hyper"?`,
		"nope":             `unknown field "nope"; want one of hyper, name, seed, stop, train in the spec`,
		"stop.anything":    "",
		"stop.a.b":         `"stop.a.b": stop.a is a single value`,
	} {
		err := CheckPath(doc{}, path)
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: got %v, want %q", path, err, want)
		}
	}
}
