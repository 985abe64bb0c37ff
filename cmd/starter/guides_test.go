package main

import (
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/testkit/specdoc"
)

var (
	shellBlock  = regexp.MustCompile("(?s)```(?:sh|bash)\n(.*?)```")
	flagPattern = regexp.MustCompile(`(?:^|\s)-(-?[a-z][a-z0-9-]*)`)
	helpFlag    = regexp.MustCompile(`(?m)^\s+-([a-z][a-z0-9-]*)`)
)

// TestGuideCommands: every shell block of the README and the guides is
// valid shell, and every starter and worker command in it names a command
// and flags the binaries have, and every make target one the Makefile has;
// so the guides cannot drift from the flags. (The JSON blocks are parsed by
// package spec's and package tune's tests; the README's Python by the
// Python package's tests, which run it.)
func TestGuideCommands(t *testing.T) {
	guides, err := specdoc.Guides("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, b := range []string{"starter", "worker"} {
		if out, err := exec.Command("go", "build", "-o", filepath.Join(dir, b), "../"+b).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	helps := map[string]string{}
	help := func(args ...string) string {
		key := strings.Join(args, " ")
		if h, ok := helps[key]; ok {
			return h
		}
		out, _ := exec.Command(filepath.Join(dir, args[0]), append(args[1:], "-h")...).CombinedOutput()
		helps[key] = string(out)
		return helps[key]
	}
	checked := 0
	for name, text := range guides {
		for _, m := range shellBlock.FindAllStringSubmatch(text, -1) {
			block := m[1]
			if out, err := exec.Command("bash", "-n", "-c", block).CombinedOutput(); err != nil {
				t.Errorf("%s: a shell block that bash cannot parse:\n%s\n%s", name, block, out)
			}
			joined := strings.ReplaceAll(block, "\\\n", " ")
			for _, line := range strings.Split(joined, "\n") {
				line, _, _ = strings.Cut(line, " #")
				for _, part := range regexp.MustCompile(`&&|\|\||[;|&]`).Split(line, -1) {
					words := strings.Fields(part)
					for len(words) > 0 && strings.Contains(words[0], "=") && !strings.HasPrefix(words[0], "-") {
						words = words[1:] // VAR=value before a command
					}
					if len(words) == 0 {
						continue
					}
					switch filepath.Base(words[0]) {
					case "starter":
						if len(words) < 2 {
							continue
						}
						checked++
						if !regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(words[1]) + `\s`).MatchString(help("starter")) {
							t.Errorf("%s: `%s`: the starter has no command %q", name, strings.TrimSpace(part), words[1])
							continue
						}
						if h := help("starter", words[1]); strings.Contains(h, "Usage of "+words[1]) {
							checkFlags(t, name, part, words[2:], h)
						}
					case "worker":
						checked++
						checkFlags(t, name, part, words[1:], help("worker"))
					case "make":
						for _, target := range words[1:] {
							if strings.HasPrefix(target, "-") || strings.Contains(target, "=") {
								continue
							}
							checked++
							if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(target) + `:`).Match(makefile) {
								t.Errorf("%s: `%s`: the Makefile has no target %q", name, strings.TrimSpace(part), target)
							}
						}
					}
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked %d commands in the guides", checked)
	}
}

// TestGuideGoParses: every Go block of the guides is Go (a file, or
// statements, which are parsed inside a function); the runnable versions
// are the packages' example tests, which the guides name.
func TestGuideGoParses(t *testing.T) {
	guides, err := specdoc.Guides("../..")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, text := range guides {
		for _, m := range regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(text, -1) {
			n++
			src := m[1]
			if !strings.HasPrefix(strings.TrimSpace(src), "package ") {
				src = "package p\nfunc _() {\n" + src + "\n}\n"
			}
			if _, err := parser.ParseFile(token.NewFileSet(), name, src, 0); err != nil {
				t.Errorf("%s: a Go block that does not parse: %v\n%s", name, err, m[1])
			}
		}
	}
	if n == 0 {
		t.Fatal("no Go block in the guides")
	}
}

// checkFlags: every -flag among words is one the help lists.
func checkFlags(t *testing.T, guide, part string, words []string, help string) {
	t.Helper()
	have := map[string]bool{"h": true, "help": true}
	for _, m := range helpFlag.FindAllStringSubmatch(help, -1) {
		have[m[1]] = true
	}
	for _, w := range words {
		m := flagPattern.FindStringSubmatch(" " + w)
		if m == nil || !strings.HasPrefix(w, "-") {
			continue
		}
		flag, _, _ := strings.Cut(strings.TrimPrefix(m[1], "-"), "=")
		if !have[flag] {
			t.Errorf("%s: `%s`: no flag -%s (the binary has %v)", guide, strings.TrimSpace(part), flag, keys(have))
		}
	}
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
