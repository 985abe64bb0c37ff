//go:build !openblas

package native

// BLAS names the matrix-multiply implementation this binary was built with.
func BLAS() string { return "gonum (pure Go)" }
