//go:build race

package collective

// raceEnabled: built with the race detector (race_off.go).
const raceEnabled = true
