package testkit

import (
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/durabletrain/durabletrain/"

type goPackage struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "../...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(out)
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func under(path string, roots ...string) bool {
	rel := strings.TrimPrefix(path, module)
	for _, r := range roots {
		if rel == r || strings.HasPrefix(rel, r+"/") {
			return true
		}
	}
	return false
}

// TestLayering: the house's floors, as `go list` sees their non-test code.
// The test kits are imported only by tests, bench/ and cmd/; the ground
// floor (internal/) imports nothing of ours above it; the compute core
// (collective, dataset, trainer, checkpoint) depends on nothing that
// imports the run's machinery (activities, gpuworker, workflows).
func TestLayering(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	for _, p := range pkgs {
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				continue
			}
			if under(imp, "testkit") && !under(p.ImportPath, "testkit", "bench", "cmd") {
				t.Errorf("%s imports the test kit %s", p.ImportPath, imp)
			}
			if under(p.ImportPath, "internal") && !under(imp, "internal") {
				t.Errorf("the ground floor's %s imports %s, above it", p.ImportPath, imp)
			}
		}
		if under(p.ImportPath, "collective", "dataset", "trainer", "checkpoint") {
			for _, dep := range p.Deps {
				if under(dep, "activities", "gpuworker", "workflows", "policy", "testkit") {
					t.Errorf("the compute core's %s depends on %s", p.ImportPath, dep)
				}
			}
		}
	}
}

// TestFilesOwnOneThing: no non-test Go file runs past 500 lines unless a
// comment at its top says why it must stay whole ("stays whole:").
func TestFilesOwnOneThing(t *testing.T) {
	out, err := exec.Command("git", "-C", "..", "ls-files", "*.go").Output()
	if err != nil {
		t.Skip("not a git checkout: ", err)
	}
	for _, name := range strings.Fields(string(out)) {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			continue // deleted in the work tree
		}
		lines := strings.Split(string(b), "\n")
		if len(lines) <= 500 {
			continue
		}
		head := strings.Join(lines[:min(40, len(lines))], "\n")
		if !strings.Contains(head, "stays whole:") {
			t.Errorf("%s is %d lines: split it by what each part owns, or say at its top why it stays whole", name, len(lines))
		}
	}
}

// TestTheGuidesAreReachable: the README reads in one sitting (≤ 250 lines),
// BENCHMARKS.md holds results, not logs (≤ 400), and every guide under docs/
// is linked from the README.
func TestTheGuidesAreReachable(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > 250 {
		t.Errorf("README.md is %d lines; keep it to 250 (move the rest into a guide under docs/)", n)
	}
	bench, err := os.ReadFile("../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(bench), "\n"); n > 400 {
		t.Errorf("BENCHMARKS.md is %d lines; keep it to 400 (the latest sitting of each benchmark; git keeps the rest)", n)
	}
	guides, err := filepath.Glob("../docs/*.md")
	if err != nil || len(guides) == 0 {
		t.Fatalf("no guides under docs/: %v", err)
	}
	for _, g := range guides {
		if link := "docs/" + filepath.Base(g); !strings.Contains(string(readme), "("+link+")") {
			t.Errorf("the README does not link %s", link)
		}
	}
}
