//go:build openblas

package native

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// A process that says nothing about OpenBLAS's threads gets one per call;
// one that says otherwise keeps what it said. Each case is a fresh process
// (the test binary again), since OpenBLAS reads its variables once.
func TestOpenBLASRunsOneThreadUnlessTold(t *testing.T) {
	if os.Getenv("DT_PRINT_BLAS_THREADS") != "" {
		return
	}
	for _, tc := range []struct {
		env  []string
		want int
	}{
		{nil, 1},
		{[]string{"OPENBLAS_NUM_THREADS=2"}, 2},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestPrintBLASThreads$")
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "OPENBLAS_NUM_THREADS=") && !strings.HasPrefix(kv, "OMP_NUM_THREADS=") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(append(cmd.Env, "DT_PRINT_BLAS_THREADS=1"), tc.env...)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		var got int
		for _, line := range strings.Split(string(out), "\n") {
			if v, ok := strings.CutPrefix(line, "blas threads "); ok {
				got, _ = strconv.Atoi(v)
			}
		}
		if got != tc.want {
			t.Errorf("environment %v: %d OpenBLAS threads per call, want %d (%q)", tc.env, got, tc.want, out)
		}
	}
}

func TestPrintBLASThreads(t *testing.T) {
	if os.Getenv("DT_PRINT_BLAS_THREADS") == "" {
		t.Skip("run by TestOpenBLASRunsOneThreadUnlessTold")
	}
	os.Stdout.WriteString("blas threads " + strconv.Itoa(BLASThreads()) + "\n")
}
