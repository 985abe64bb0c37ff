package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// benchRay is `bench ray`: durabletrain against Ray Train on the same jobs
// (bench/ray/ray_vs_durabletrain.py). It builds the bench's own Python
// environment first (.venv-ray: the test environment and pinned
// ray[train,tune], scripts/venv.sh ray; never part of `make test`) and the
// binaries durabletrain.init() starts, then runs the Python side with the
// flags given (`bench ray -h` lists them).
func benchRay(args []string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	steps := [][]string{
		{"make", "-C", root, "--no-print-directory", "bins"},
		{filepath.Join(root, "scripts", "venv.sh"), "ray"},
		append([]string{filepath.Join(root, ".venv-ray", "bin", "python"), filepath.Join(root, "bench", "ray", "ray_vs_durabletrain.py")}, args...),
	}
	for _, s := range steps {
		cmd := exec.Command(s[0], s[1:]...)
		cmd.Dir = root
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("%s: %w", s[0], err)
		}
	}
	return nil
}

// repoRoot is the repository's root: the directory above this package's
// that holds go.mod, from the working directory up.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "bench", "ray", "ray_vs_durabletrain.py")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("run it inside the durabletrain repository (no bench/ray/ray_vs_durabletrain.py above the working directory)")
		}
		dir = up
	}
}
