// Package workflows owns the deterministic orchestration of training runs:
// TrainingWorkflow (spec validation, gang formation, the epoch loop, the
// failure policy, progress, stop, continue-as-new). It does no I/O, reads no
// clock and starts no goroutine of its own: everything that touches the world
// is an activity (see package activities), named by the constants in package spec.
package workflows
