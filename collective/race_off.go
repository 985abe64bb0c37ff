//go:build !race

package collective

// raceEnabled: built with the race detector. A ring's two sides then also
// meet on a process-wide counter (shmRing.clock), so that the detector sees
// the order that the ring's own counters give ranks of one process: it
// cannot see it through two mappings of one page.
const raceEnabled = false
