// Package activities owns what a GPU worker does for a training run: hold a
// slot of a gang (HoldSlot, slots.go), train one epoch as one rank (RunEpoch,
// epoch.go), and checkpoint on request (SaveCheckpoint, checkpoints.go). It
// is thin glue between Temporal (heartbeats, cancellation, error types:
// errors.go) and the compute packages (collective, trainer, checkpoint,
// dataset). It keeps each rank's replica warm in memory between the epochs of
// one gang (replicas.go), builds a rank with the backend the spec names from
// the worker's trainer registry, loads each data set once per worker by its
// registered format (data.go), and restores from the latest verified
// checkpoint (restore.go). Each of those tables has its own lock.
package activities
