package spec

import (
	"os"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/specdoc"
)

// TestSpecReference: docs/spec.md's training reference is what the spec's
// own types and limits say, and every field is documented. After changing a
// field, regenerate it with UPDATE_DOCS=1 go test ./spec -run Reference.
func TestSpecReference(t *testing.T) {
	pkg, err := specdoc.Load(".")
	if err != nil {
		t.Fatal(err)
	}
	fields, err := pkg.Walk("Training", "")
	if err != nil {
		t.Fatal(err)
	}
	if missing := specdoc.Undocumented(fields); len(missing) > 0 {
		t.Errorf("spec fields without a doc comment: %v", missing)
	}
	for path := range accepted {
		found := false
		for _, f := range fields {
			found = found || f.Path == path
		}
		if !found {
			t.Errorf("accepted names %q, which is no field of the spec", path)
		}
	}
	md := specdoc.Markdown(fields, "The training spec", accepted)
	if err := specdoc.Check("../docs/spec.md", "<!-- training spec: generated -->", "<!-- end of training spec -->", md, os.Getenv("UPDATE_DOCS") != ""); err != nil {
		t.Fatal(err)
	}
}
