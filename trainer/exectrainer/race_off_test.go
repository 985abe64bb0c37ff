//go:build !race

package exectrainer

const underRace = false
