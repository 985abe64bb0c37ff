//go:build race

package exectrainer

// underRace: the tests run under the race detector (race_off_test.go).
const underRace = true
