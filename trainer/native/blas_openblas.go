//go:build openblas

package native

// #cgo LDFLAGS: -lopenblas
import "C"

import (
	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/netlib/blas/netlib"
)

func init() { blas32.Use(netlib.Implementation{}) }

// BLAS names the matrix-multiply implementation this binary was built with.
func BLAS() string { return "OpenBLAS (cgo)" }
