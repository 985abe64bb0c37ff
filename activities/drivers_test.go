package activities

// Libraries register no blob driver and no backend (gocloud's habit); the
// tests, like the binaries, import the ones they use.
import (
	_ "github.com/durabletrain/durabletrain/blobdrivers"
	_ "github.com/durabletrain/durabletrain/trainer/native"
)
