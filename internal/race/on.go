//go:build race

package race

// Enabled: built with the race detector (off.go).
const Enabled = true
