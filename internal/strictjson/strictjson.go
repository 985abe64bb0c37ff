// Package strictjson owns reading user-written JSON (a training spec, a
// search) strictly and explaining what is wrong with it: the first problem's
// field path ("hyper.epochs", "param_space.hyper.lr"), its line and column,
// and what would be accepted, in one line of bounded length. Unknown fields,
// fields given twice and fields spelt in another case are errors (encoding/json
// accepts all three silently); null means "left out".
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unicode/utf8"
)

// Error is the first problem found in a document.
type Error struct {
	Path         string // dotted field path; "" for the document itself
	Line, Column int    // 1-based position of the offending value or key
	Msg          string // what is wrong, and what is accepted
}

func (e *Error) Error() string {
	where := ""
	if e.Line > 0 {
		where = fmt.Sprintf(" (line %d, column %d)", e.Line, e.Column)
	}
	if e.Path == "" {
		return e.Msg + where
	}
	return e.Path + ": " + e.Msg + where
}

// Option changes how Decode reads a document.
type Option func(*decoder)

// As checks the raw JSON at path (a json.RawMessage field) as if it were
// decoded into a value of schema's type, which it is not.
func As(path string, schema any) Option {
	return func(d *decoder) { d.schemas[path] = reflect.TypeOf(schema) }
}

// Decode checks data against v's type (a pointer to a struct) and, if it
// passes, decodes it into v.
func Decode(data []byte, v any, opts ...Option) error {
	d := &decoder{data: data, schemas: map[string]reflect.Type{}}
	for _, o := range opts {
		o(d)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return &Error{Msg: "the input is empty; want a JSON object"}
	}
	if !utf8.Valid(data) {
		return d.errAt(int64(firstInvalidUTF8(data)), "", "not valid UTF-8 text")
	}
	var raw json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var syn *json.SyntaxError
		if errors.As(err, &syn) {
			msg := strings.TrimPrefix(syn.Error(), "json: ")
			if msg == "unexpected end of JSON input" {
				return d.errAt(int64(len(data)), "", "the JSON ends before it is complete (an unclosed { or [, or a missing value)")
			}
			return d.errAt(syn.Offset-1, "", "not valid JSON: "+msg)
		}
		return &Error{Msg: "not valid JSON: " + bound(err.Error())}
	}
	t := reflect.TypeOf(v).Elem()
	start := int64(len(data) - len(bytes.TrimLeft(data, " \t\r\n")))
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return d.errAt(start, "", "the input is null; want a JSON object")
	}
	if err := d.walk(bytes.TrimSpace(data), start, t, ""); err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

type decoder struct {
	data    []byte
	schemas map[string]reflect.Type
}

var rawType = reflect.TypeOf(json.RawMessage(nil))
var unmarshalerType = reflect.TypeOf((*json.Unmarshaler)(nil)).Elem()

// walk checks raw, found at offset base of the document, against t.
func (d *decoder) walk(raw []byte, base int64, t reflect.Type, path string) error {
	if s, ok := d.schemas[path]; ok {
		t = s
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if string(raw) == "null" {
		return nil // left out
	}
	if t != rawType && !reflect.PointerTo(t).Implements(unmarshalerType) {
		switch t.Kind() {
		case reflect.Struct:
			return d.object(raw, base, path, func(key string) (reflect.Type, error) {
				f, ok := field(t, key)
				if !ok {
					return nil, unknown(t, key)
				}
				return f, nil
			})
		case reflect.Map:
			if t.Key().Kind() == reflect.String {
				return d.object(raw, base, path, func(string) (reflect.Type, error) { return t.Elem(), nil })
			}
		case reflect.Slice, reflect.Array:
			if t.Elem().Kind() != reflect.Uint8 {
				return d.list(raw, base, t, path)
			}
		}
	}
	// A leaf: let encoding/json (or the type's own UnmarshalJSON) judge it.
	err := json.Unmarshal(raw, reflect.New(t).Interface())
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return d.errAt(base, path, fmt.Sprintf("want %s, got %s", describe(t), got(te.Value, raw)))
	}
	return d.errAt(base, path, boundMsg(strings.TrimPrefix(err.Error(), "json: ")))
}

// object checks each member of a JSON object, typed by member.
func (d *decoder) object(raw []byte, base int64, path string, member func(key string) (reflect.Type, error)) error {
	if raw[0] != '{' {
		return d.errAt(base, path, "want an object {...}, got "+kindOf(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.Token() // {
	seen := map[string]bool{}
	for dec.More() {
		keyAt := base + skipSpace(raw, dec.InputOffset())
		tok, _ := dec.Token()
		key, _ := tok.(string)
		sub := join(path, key)
		if seen[key] {
			return d.errAt(keyAt, sub, "given twice; want each field once")
		}
		seen[key] = true
		t, err := member(key)
		if err != nil {
			return d.errAt(keyAt, path, err.Error())
		}
		var v json.RawMessage
		valueAt := skipSpace(raw, dec.InputOffset())
		if err := dec.Decode(&v); err != nil {
			return d.errAt(base+valueAt, sub, bound(err.Error()))
		}
		if err := d.walk(v, base+valueAt, t, sub); err != nil {
			return err
		}
	}
	return nil
}

// list checks each element of a JSON array.
func (d *decoder) list(raw []byte, base int64, t reflect.Type, path string) error {
	if raw[0] != '[' {
		return d.errAt(base, path, "want a list [...], got "+kindOf(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.Token() // [
	for i := 0; dec.More(); i++ {
		at := skipSpace(raw, dec.InputOffset())
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return d.errAt(base+at, path, bound(err.Error()))
		}
		if err := d.walk(v, base+at, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
			return err
		}
	}
	return nil
}

// errAt is an Error at offset off of the document.
func (d *decoder) errAt(off int64, path, msg string) *Error {
	off = max(0, min(off, int64(len(d.data))))
	line := 1 + bytes.Count(d.data[:off], []byte("\n"))
	col := 1 + utf8.RuneCount(d.data[bytes.LastIndexByte(d.data[:off], '\n')+1:off])
	return &Error{Path: boundPath(path), Line: line, Column: col, Msg: msg}
}

// skipSpace is the offset of the first byte at or after off that is not
// white space, a comma or a colon: where the next key or value starts.
func skipSpace(b []byte, off int64) int64 {
	for off < int64(len(b)) && strings.IndexByte(" \t\r\n,:", b[off]) >= 0 {
		off++
	}
	return off
}

// fields is the JSON name of each field of a struct type.
func fields(t reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		m[name] = f.Type
	}
	return m
}

func field(t reflect.Type, key string) (reflect.Type, bool) {
	f, ok := fields(t)[key]
	return f, ok
}

// unknown explains a key that names no field of t.
func unknown(t reflect.Type, key string) error {
	names := []string{}
	for n := range fields(t) {
		if strings.EqualFold(n, key) {
			return fmt.Errorf("unknown field %s; did you mean %q? (names are lower case)", quote(key), n)
		}
		names = append(names, n)
	}
	slices.Sort(names)
	return fmt.Errorf("unknown field %s; want one of %s", quote(key), strings.Join(names, ", "))
}

// describe says what a leaf of type t is written as.
func describe(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list [...]"
	case reflect.Map, reflect.Struct:
		return "an object {...}"
	}
	return t.String()
}

// got describes the JSON value encoding/json could not store.
func got(value string, raw []byte) string {
	if strings.HasPrefix(value, "number") {
		return "the number " + bound(string(raw))
	}
	return kindOf(raw)
}

func kindOf(raw []byte) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case '{':
		return "an object"
	case '[':
		return "a list"
	case '"':
		return "the string " + bound(string(raw))
	case 't', 'f':
		return string(raw)
	}
	return "the number " + bound(string(raw))
}

// maxShown bounds how much of a user's value an error repeats.
const maxShown = 48

func bound(s string) string {
	if len(s) <= maxShown {
		return s
	}
	cut := maxShown
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + fmt.Sprintf("… (%d bytes)", len(s))
}

// boundMsg bounds a message a type's own UnmarshalJSON wrote.
func boundMsg(s string) string {
	if len(s) <= 4*maxShown {
		return s
	}
	return bound(s[:4*maxShown]) + "…"
}

func quote(s string) string { return bound(fmt.Sprintf("%q", s)) }

// boundPath keeps an error's field path readable when a key is huge.
func boundPath(p string) string {
	if len(p) <= 3*maxShown {
		return p
	}
	return bound(p)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func firstInvalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// CheckPath says whether a dotted path ("hyper.lr") names a field of
// schema's type, explaining the first part that does not.
func CheckPath(schema any, path string) error {
	t := reflect.TypeOf(schema)
	parts := strings.Split(path, ".")
	for i, p := range parts {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		where := strings.Join(parts[:i], ".")
		if p == "" {
			return fmt.Errorf("%s has an empty part; want dotted field names such as hyper.lr", quote(path))
		}
		if t.Kind() == reflect.Map && t.Key().Kind() == reflect.String {
			// Any key of a map (config.<key>); what the map holds is checked
			// when the spec is parsed.
			t = t.Elem()
			continue
		}
		if t.Kind() != reflect.Struct {
			return fmt.Errorf("%s: %s is a single value, not an object with fields", quote(path), where)
		}
		f, ok := field(t, p)
		if !ok {
			if where == "" {
				where = "the spec"
			}
			return fmt.Errorf("%s: %s in %s", quote(path), unknown(t, p), where)
		}
		t = f
	}
	return nil
}
