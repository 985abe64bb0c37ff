//go:build !openblas

package native

// BLAS names the matrix-multiply implementation this binary was built with.
func BLAS() string { return "gonum (pure Go)" }

// BLASThreads is how many threads one matrix product may use: gonum's run
// on the caller's.
func BLASThreads() int { return 1 }
