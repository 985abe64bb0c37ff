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

// Go stamps a build from a Git checkout with a pseudo-version (and "+dirty"
// when the tree has changes), on some machines and not on others (GOFLAGS
// -buildvcs): none of them is a release, so each says this tree's Release;
// a tag says itself.
func TestReleaseOfTheMainModuleVersion(t *testing.T) {
	want := "v" + Release
	for main, expect := range map[string]string{
		"":                                     want,
		"(devel)":                              want,
		"v0.0.0-20261128040319-2e4fe4c06013":   want,
		"v0.6.1-0.20261128040319-2e4fe4c06013": want,
		"v0.6.0-rc1.0.20261128040319-2e4fe4c06013": want,
		"v0.0.0-20261128040319-2e4fe4c06013+dirty": want,
		"v0.6.0+dirty": want,
		"v0.6.0":       "v0.6.0",
		"v0.7.0-rc1":   "v0.7.0-rc1",
	} {
		if got := releaseOf(main); got != expect {
			t.Errorf("releaseOf(%q) = %q, want %q", main, got, expect)
		}
	}
}
