package collective

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A peer names the ring to open: nothing but a ring of ours in /dev/shm is
// opened (not a worker's file, a link to one, a FIFO that would block).
func TestOpenShmRingOpensOnlyRings(t *testing.T) {
	ring, path, token, err := createShmRing(2, 4096)
	if err != nil {
		t.Skip("no /dev/shm:", err)
	}
	defer os.Remove(path)
	defer ring.close()
	if r, err := openShmRing(path, 2, 4096, token); err != nil {
		t.Fatalf("our own ring: %v", err)
	} else {
		r.close()
	}
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, make([]byte, shmHeader+2*4096), 0o600)
	link := filepath.Join(shmDir, shmPrefix+"link-"+filepath.Base(t.TempDir()))
	os.Symlink(secret, link)
	defer os.Remove(link)
	fifo := filepath.Join(shmDir, shmPrefix+"fifo-"+filepath.Base(t.TempDir()))
	syscall.Mkfifo(fifo, 0o600)
	defer os.Remove(fifo)
	for _, p := range []string{secret, "/etc/passwd", link, fifo, shmDir + "/../../etc/passwd", shmDir + "/other-file"} {
		if r, err := openShmRing(p, 2, 4096, token); err == nil {
			r.close()
			t.Errorf("%s was opened", p)
		} else if strings.Contains(err.Error(), "holds another token") {
			t.Errorf("%s was opened and mapped before the token check", p)
		}
	}
}
