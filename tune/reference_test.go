package tune

import (
	"os"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/specdoc"
)

// TestSearchSpecReference: docs/spec.md's search reference is what the
// search spec's own types say, and every field is documented. Regenerate it
// with UPDATE_DOCS=1 go test ./tune -run Reference.
func TestSearchSpecReference(t *testing.T) {
	pkg, err := specdoc.Load(".")
	if err != nil {
		t.Fatal(err)
	}
	fields, err := pkg.Walk("Spec", "")
	if err != nil {
		t.Fatal(err)
	}
	if missing := specdoc.Undocumented(fields); len(missing) > 0 {
		t.Errorf("search spec fields without a doc comment: %v", missing)
	}
	md := specdoc.Markdown(fields, "The search spec", nil)
	if err := specdoc.Check("../docs/spec.md", "<!-- search spec: generated -->", "<!-- end of search spec -->", md, os.Getenv("UPDATE_DOCS") != ""); err != nil {
		t.Fatal(err)
	}
}
