// Package workflows owns the deterministic orchestration of training runs
// and searches: TrainingWorkflow (spec validation, gang formation, the epoch
// loop, the failure policy, progress, stop, continue-as-new) and
// TuneWorkflow (trials as child runs, schedulers, stop criteria). It does no
// I/O, reads no clock and starts no goroutine of its own: everything that
// touches the world is an activity (see package activities), named by the
// constants in package spec. The decisions themselves are pure functions in
// policy.go and tunepolicy.go, tested with tables; the files around them make
// the SDK calls.
package workflows
