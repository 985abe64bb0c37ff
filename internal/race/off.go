//go:build !race

// Package race owns one fact: whether this binary was built with the race
// detector (go build -race), for code and tests that must act differently
// under it.
package race

// Enabled: built with the race detector.
const Enabled = false
