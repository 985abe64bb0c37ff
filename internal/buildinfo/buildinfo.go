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
	"sync"
)

// Release is the release this source tree is; CHANGELOG.md's newest entry
// names the same one (a test checks).
const Release = "0.6.0"

// Version overrides Release for a tagged build:
//
//	go build -ldflags "-X github.com/durabletrain/durabletrain/internal/buildinfo.Version=v0.6.0-rc1" ./cmd/worker
var Version = ""

// ReleaseVersion is Version if the build set it, the module version when the
// binary was installed with `go install module@version`, else Release.
func ReleaseVersion() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "v" + Release
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
