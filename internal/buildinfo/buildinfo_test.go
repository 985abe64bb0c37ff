package buildinfo

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The newest entry of CHANGELOG.md is this source tree's Release.
func TestChangelogNamesTheRelease(t *testing.T) {
	b, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^## \[?v?([0-9]+\.[0-9]+\.[0-9]+[^\] ]*)\]?`).FindSubmatch(b)
	if m == nil {
		t.Fatal("CHANGELOG.md has no '## <version>' heading")
	}
	if string(m[1]) != Release {
		t.Fatalf("CHANGELOG.md's newest entry is %s; buildinfo.Release is %s: bump one of them", m[1], Release)
	}
}

func TestBuildIDNamesTheBinary(t *testing.T) {
	id := BuildID()
	if !regexp.MustCompile(`^v[0-9][^+]*\+[0-9a-f]{12}$`).MatchString(id) {
		t.Fatalf("BuildID() = %q; want the version, '+' and 12 hex digits of the executable's hash", id)
	}
	if s := String("worker"); !strings.HasPrefix(s, "worker v") || !strings.Contains(s, id) {
		t.Fatalf("String() = %q", s)
	}
}

func TestVersionOverrides(t *testing.T) {
	defer func(v string) { Version = v }(Version)
	Version = "v9.9.9-test"
	if got := ReleaseVersion(); got != "v9.9.9-test" {
		t.Fatalf("ReleaseVersion() = %q with Version set", got)
	}
}
