package chaos_test

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/chaos"
)

// TestChaosShort is `make chaos` in small: one fault of every kind over two
// runs, each run must complete with final weights bit-identical to an
// uninterrupted run, and every fault must be recovered from.
func TestChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and worker processes in network namespaces")
	}
	if err := chaos.Available(); err != nil {
		t.Skipf("no network namespaces here (%v): skipping the chaos test", err)
	}
	const data = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
	if _, err := os.Stat(data); err != nil {
		t.Skipf("%s is missing (make deps installs dataset-fashion-mnist): skipping", data)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := chaos.Build(bin, "", io.Discard); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	rep, err := chaos.Run(context.Background(), chaos.Config{Seed: 7, Faults: len(chaos.Kinds), FaultsPerRun: 3, Epochs: 4,
		Bin: bin, Dir: dir, Log: &log})
	var table strings.Builder
	if rep != nil {
		rep.Print(&table)
	}
	t.Logf("%s\n%s", log.String(), table.String())
	if rep != nil {
		t.Log(rep.Costs())
	}
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]bool{}
	for _, f := range rep.Faults {
		kinds[f.Kind] = true
	}
	// Two runs of three faults, and one more for each fault a run ended
	// before it could strike (the harness plans it again).
	if len(kinds) != len(chaos.Kinds) || len(rep.Runs) < 2 {
		t.Fatalf("%d fault kinds over %d runs; want all %d over 2 or more", len(kinds), len(rep.Runs), len(chaos.Kinds))
	}
	if problems := rep.Problems(); len(problems) > 0 {
		t.Fatalf("guarantees not met:\n%s", strings.Join(problems, "\n"))
	}
	for _, run := range rep.Runs {
		if run.Failures+run.Preemptions == 0 {
			t.Errorf("run %s saw no failure: the faults did not land", run.ID)
		}
	}
}
