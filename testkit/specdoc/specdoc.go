// Package specdoc renders the reference of a JSON spec from the Go source of
// its types: every field reachable from a root struct, with its JSON name,
// its type in JSON's words, what Validate accepts for it, and its doc
// comment. The spec and tune packages' tests compare it with docs/spec.md,
// so the reference cannot drift from the code, and name every field that
// has no documentation.
package specdoc

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
)

// Package is the parsed source of one Go package's non-test files.
type Package struct {
	types map[string]*ast.TypeSpec
	docs  map[string]string // a type's doc comment
}

// Load parses the package in dir.
func Load(dir string) (*Package, error) {
	fset := token.NewFileSet()
	matches, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	p := &Package{types: map[string]*ast.TypeSpec{}, docs: map[string]string{}}
	for _, name := range matches {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || g.Tok != token.TYPE {
				continue
			}
			for _, s := range g.Specs {
				ts := s.(*ast.TypeSpec)
				p.types[ts.Name.Name] = ts
				text := ts.Doc.Text()
				if text == "" && len(g.Specs) == 1 {
					text = g.Doc.Text()
				}
				p.docs[ts.Name.Name] = text
			}
		}
	}
	return p, nil
}

// Field is one documented field of the spec.
type Field struct {
	Path     string // its JSON path, e.g. "scaling.workers"
	Type     string // in JSON's words
	Accepts  string // what validation accepts, where the package says
	Doc      string
	Sections bool // an object whose fields are listed under its own heading
}

// Walk lists the fields reachable from the struct type root, depth first, in
// source order; prefix is put before every path. Fields whose type is a
// struct of the package with JSON fields of its own are walked into.
func (p *Package) Walk(root, prefix string) ([]Field, error) {
	ts, ok := p.types[root]
	if !ok {
		return nil, fmt.Errorf("specdoc: no type %s", root)
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return nil, fmt.Errorf("specdoc: %s is not a struct", root)
	}
	var out []Field
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 || f.Tag == nil {
			continue
		}
		tag, _ := strconv.Unquote(f.Tag.Value)
		name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		text := strings.TrimSpace(strings.Join([]string{f.Doc.Text(), f.Comment.Text()}, " "))
		// Go's convention starts a field's comment with its Go name; the
		// reference is read by JSON's names.
		text = strings.TrimPrefix(text, f.Names[0].Name+": ")
		text = strings.TrimPrefix(text, f.Names[0].Name+" ")
		text = strings.Join(strings.Fields(text), " ")
		inner := p.structOf(f.Type)
		path := prefix + name
		field := Field{Path: path, Type: p.jsonType(f.Type), Doc: text}
		if inner != "" {
			if text == "" {
				field.Doc = firstSentence(p.docs[inner])
			}
			field.Sections = true
			out = append(out, field)
			sub, err := p.Walk(inner, path+".")
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
			continue
		}
		out = append(out, field)
	}
	return out, nil
}

// structOf is the package's struct type that t names (through a pointer),
// where it has JSON fields of its own.
func (p *Package) structOf(t ast.Expr) string {
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	id, ok := t.(*ast.Ident)
	if !ok {
		return ""
	}
	ts, ok := p.types[id.Name]
	if !ok {
		return ""
	}
	st, ok := ts.Type.(*ast.StructType)
	if !ok {
		return ""
	}
	for _, f := range st.Fields.List {
		if f.Tag != nil && strings.Contains(f.Tag.Value, "json:") {
			return id.Name
		}
	}
	return ""
}

// jsonType says what JSON a field holds.
func (p *Package) jsonType(t ast.Expr) string {
	switch t := t.(type) {
	case *ast.StarExpr:
		return p.jsonType(t.X)
	case *ast.ArrayType:
		return "list of " + p.jsonType(t.Elt)
	case *ast.MapType:
		return "object of " + p.jsonType(t.Value)
	case *ast.SelectorExpr:
		if t.Sel.Name == "RawMessage" {
			return "any JSON"
		}
		if t.Sel.Name == "Duration" {
			return `duration ("30s")`
		}
		return t.Sel.Name
	case *ast.Ident:
		switch t.Name {
		case "string":
			return "string"
		case "bool":
			return "boolean"
		case "int", "int32", "int64", "uint", "uint32", "uint64":
			return "integer"
		case "float32", "float64":
			return "number"
		case "Duration":
			return `duration ("30s")`
		}
		if p.structOf(t) != "" {
			return "object"
		}
		if ts, ok := p.types[t.Name]; ok {
			if _, isStruct := ts.Type.(*ast.StructType); !isStruct {
				return p.jsonType(ts.Type)
			}
		}
		return t.Name
	}
	return "?"
}

func firstSentence(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if i := strings.Index(s, ". "); i >= 0 {
		return s[:i+1]
	}
	return s
}

// Undocumented names the fields with no doc comment.
func Undocumented(fields []Field) []string {
	var out []string
	for _, f := range fields {
		if f.Doc == "" {
			out = append(out, f.Path)
		}
	}
	return out
}

// Markdown renders fields as one table per object, the root's first.
// accepted gives, by path, what validation accepts (nil: none known).
func Markdown(fields []Field, rootTitle string, accepted map[string]string) string {
	groups := map[string][]Field{}
	var order []string
	for _, f := range fields {
		parent := ""
		if i := strings.LastIndex(f.Path, "."); i >= 0 {
			parent = f.Path[:i]
		}
		if _, ok := groups[parent]; !ok {
			order = append(order, parent)
		}
		groups[parent] = append(groups[parent], f)
	}
	var b strings.Builder
	for _, parent := range order {
		title := rootTitle
		if parent != "" {
			title = "`" + parent + "`"
		}
		fmt.Fprintf(&b, "#### %s\n\n| field | type | accepts | what it does |\n|---|---|---|---|\n", title)
		for _, f := range groups[parent] {
			name := f.Path[strings.LastIndex(f.Path, ".")+1:]
			accepts := accepted[f.Path]
			if f.Sections {
				accepts = "see `" + f.Path + "` below"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, f.Type, cell(accepts), cell(f.Doc))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// Between is the part of text between the begin and end markers.
func Between(text, begin, end string) (string, bool) {
	i := strings.Index(text, begin)
	j := strings.Index(text, end)
	if i < 0 || j < i {
		return "", false
	}
	return text[i+len(begin) : j], true
}

// Check compares the generated reference with the part of the file at path
// between the markers; with update it rewrites that part instead.
func Check(path, begin, end, generated string, update bool) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	text := string(b)
	have, ok := Between(text, begin, end)
	if !ok {
		return fmt.Errorf("%s has no %q ... %q markers", path, begin, end)
	}
	want := "\n" + generated
	if have == want {
		return nil
	}
	if update {
		i := strings.Index(text, begin) + len(begin)
		j := strings.Index(text, end)
		return os.WriteFile(path, []byte(text[:i]+want+text[j:]), 0o644)
	}
	return fmt.Errorf("%s is out of date with the spec's types: run `UPDATE_DOCS=1 go test ./spec ./tune -run Reference` and commit it", path)
}

// Guides is the text of the README and of every guide under docs/, by
// file name, from the module root at root.
func Guides(root string) (map[string]string, error) {
	names, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	names = append(names, filepath.Join(root, "README.md"))
	out := map[string]string{}
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out[n] = string(b)
	}
	return out, nil
}

var (
	jsonBlock  = regexp.MustCompile("(?s)```json\n(.*?)```")
	inputFlags = regexp.MustCompile(`--input '(\{.*?\})'`)
)

// JSONBlocks is every JSON block of a guide and every spec inside a shell
// example's --input '...'.
func JSONBlocks(text string) []string {
	var out []string
	for _, m := range append(jsonBlock.FindAllStringSubmatch(text, -1), inputFlags.FindAllStringSubmatch(text, -1)...) {
		out = append(out, m[1])
	}
	return out
}
