// Package integration holds the tests that need a real Temporal server: it
// starts the embedded dev server in-process and real worker processes built
// from cmd/worker, and drives runs through the Temporal client as users do.
// It is the one test package that links the server.
package integration
