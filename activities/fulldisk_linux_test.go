package activities

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"
	"golang.org/x/sys/unix"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// An epoch whose checkpoint does not fit on its disk fails as the
// infrastructure's fault (retryable, naming the disk's error), not as the
// user's, and leaves no object of the failed save behind; with room again,
// the next gang's epoch commits. (Root only: it mounts a small tmpfs.) The
// native trainer writes one object, which the failed write discards by
// itself; checkpoint's TestAFullDiskFailsTheSaveAndKeepsTheLast is the one
// that needs Abort, for the objects written before the one that failed.
func TestACheckpointOntoAFullDiskFailsTheEpochCleanly(t *testing.T) {
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=16k"); err != nil {
		t.Skipf("mounting a tmpfs: %v (root only)", err)
	}
	t.Cleanup(func() { unix.Unmount(root, unix.MNT_DETACH) })
	agents, peers := newAgents(t, 2)
	s := spec.Training{Model: spec.Model{Hidden: []int{64}}, Dataset: spec.Dataset{URL: testdata.FashionMNISTSmall()}, Hyper: spec.Hyper{Epochs: 1},
		Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(root) + "?metadata=skip"}}.WithDefaults()
	in := spec.EpochInput{Run: "full", Generation: 1, Peers: peers, Secret: []byte("0123456789abcdef"), Spec: s}
	_, errs := runEpochOnAll(t, agents, in)
	var app *temporal.ApplicationError
	if errs[0] == nil || !strings.Contains(errs[0].Error(), "no space left on device") || (errors.As(errs[0], &app) && (app.NonRetryable() || app.Type() == spec.ErrUser)) {
		t.Fatalf("rank 0, its checkpoint 200 KiB on a 16 KiB disk: %v; want a retryable error naming the disk's", errs[0])
	}
	if errs[1] == nil {
		t.Fatal("rank 1 reported the epoch done while rank 0's checkpoint failed")
	}
	var left []string
	filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.Contains(path, "/tensorboard/") { // the run's events stay
			left = append(left, path)
		}
		return nil
	})
	if len(left) != 0 {
		t.Fatalf("the failed save left %v", left)
	}
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_REMOUNT, "size=16m"); err != nil {
		t.Fatal(err)
	}
	in.Generation = 2
	res, errs := runEpochOnAll(t, agents, in)
	if errs[0] != nil || res[0].Checkpoint == nil {
		t.Fatalf("with room again: %+v, %v; want the epoch's checkpoint", res[0], errs[0])
	}
}
