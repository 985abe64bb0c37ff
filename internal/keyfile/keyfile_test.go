package keyfile

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	hex := bytes.Repeat([]byte("ab"), 32)
	if k, err := Read(write("good", append(hex, '\n'), 0o600), "-pool-key-file"); err != nil || !bytes.Equal(k, hex) {
		t.Fatalf("a good key file: %q %v", k, err)
	}
	for name, tc := range map[string]struct {
		path, want string
	}{
		"world-readable": {write("open", hex, 0o644), "chmod 600"},
		"short":          {write("short", []byte("secret\n"), 0o600), "at least 32"},
		"empty":          {write("empty", nil, 0o600), "at least 32"},
		"missing":        {filepath.Join(dir, "nope"), "no such file"},
		"directory":      {dir, "not a regular file"},
	} {
		if _, err := Read(tc.path, "-pool-key-file"); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "-pool-key-file") {
			t.Errorf("%s: %v; want an error naming the flag and saying %q", name, err, tc.want)
		}
	}
}
