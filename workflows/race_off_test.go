//go:build !race

package workflows

const raceEnabled = false
