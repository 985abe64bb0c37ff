//go:build race

package workflows

// raceEnabled: the race detector slows workflow code about tenfold, past the
// SDK's one-second deadlock detector for the largest gangs.
const raceEnabled = true
