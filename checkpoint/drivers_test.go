package checkpoint

// Libraries register no blob driver (gocloud's habit); the tests, like the
// binaries, import the ones they use.
import _ "github.com/durabletrain/durabletrain/blobdrivers"
