// Package buildinfo owns what a durabletrain binary says about itself: its
// release, the build it came from, and the build ID it gives Temporal's
// worker versioning. Every binary prints it for -version.
package buildinfo

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"

	"golang.org/x/mod/module"
)

// Release is the release this source tree is; CHANGELOG.md's newest entry
// names the same one (a test checks).
const Release = "0.6.0"

// Version overrides Release for a tagged build:
//
//	go build -ldflags "-X github.com/durabletrain/durabletrain/internal/buildinfo.Version=v0.6.0-rc1" ./cmd/worker
var Version = ""

// ReleaseVersion is Version if the build set it, the module's tag when the
// binary was built from one (`go install module@v0.6.0`, or a checkout of the
// tag), else Release.
func ReleaseVersion() string {
	if Version != "" {
		return Version
	}
	main := ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		main = bi.Main.Version
	}
	return releaseOf(main)
}

// releaseOf is the release a binary whose main module has the version main
// (from its build information) says it is: a tag as it is; else, for a
// build of no tag ("" or "(devel)"), of a commit (a pseudo-version, which Go
// stamps on a build from a Git checkout or an install at a commit) or of a
// tree with changes ("+dirty"), this tree's Release. (The build ID still
// tells every binary apart.)
func releaseOf(main string) string {
	if main == "" || main == "(devel)" || strings.Contains(main, "+") || module.IsPseudoVersion(main) {
		return "v" + Release
	}
	return main
}

var (
	buildIDOnce sync.Once
	buildID     string
)

// BuildID identifies this very binary: the release and the first 12 hex
// digits of the SHA-256 of the executable, so two different builds of one
// release never share an ID (Temporal's worker versioning routes workflow
// tasks by it). Where the executable cannot be read, the release alone.
func BuildID() string {
	buildIDOnce.Do(func() {
		buildID = ReleaseVersion()
		exe, err := os.Executable()
		if err != nil {
			return
		}
		f, err := os.Open(exe)
		if err != nil {
			return
		}
		defer f.Close()
		h := sha256.New()
		if _, err := io.Copy(h, f); err != nil {
			return
		}
		buildID += "+" + hex.EncodeToString(h.Sum(nil))[:12]
	})
	return buildID
}

// String is the line -version prints: the program, its version, build ID,
// Go version and platform.
func String(program string) string {
	return fmt.Sprintf("%s %s (build %s, %s, %s/%s)", program, ReleaseVersion(), BuildID(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
