// Package activities owns what a GPU worker does for a training run: hold a
// slot of a gang (HoldSlot), train one epoch as one rank (RunEpoch), and
// checkpoint on request (SaveCheckpoint). It is thin glue between Temporal
// (heartbeats, cancellation, error types) and the compute packages
// (collective, trainer, checkpoint, dataset), and keeps each rank's replica
// warm in memory between the epochs of one gang.
package activities
