//go:build openblas

package native

// #cgo LDFLAGS: -lopenblas
// void openblas_set_num_threads(int);
// int openblas_get_num_threads(void);
import "C"

import (
	"fmt"
	"os"

	"gonum.org/v1/gonum/blas/blas32"
	"gonum.org/v1/netlib/blas/netlib"
)

func init() {
	blas32.Use(netlib.Implementation{})
	// The ranks are the parallelism: a worker runs one rank per slot, in
	// one process, and each rank's products belong on its own thread.
	// OpenBLAS would otherwise start a thread per core for each call and
	// leave them spinning in sched_yield beside the ranks. A process told
	// otherwise (OPENBLAS_NUM_THREADS, or OMP_NUM_THREADS for an OpenMP
	// build) keeps what it was told.
	if os.Getenv("OPENBLAS_NUM_THREADS") == "" && os.Getenv("OMP_NUM_THREADS") == "" {
		C.openblas_set_num_threads(1)
	}
}

// BLAS names the matrix-multiply implementation this binary was built
// with, and for OpenBLAS the threads each call may use.
func BLAS() string {
	return fmt.Sprintf("OpenBLAS (cgo), %d thread(s) per call", BLASThreads())
}

// BLASThreads is how many threads OpenBLAS may use for one call: 1 unless
// OPENBLAS_NUM_THREADS or OMP_NUM_THREADS said otherwise.
func BLASThreads() int { return int(C.openblas_get_num_threads()) }
