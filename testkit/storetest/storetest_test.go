package storetest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/blobopen"
	"github.com/durabletrain/durabletrain/testkit/storetest"
)

// TestEachStoreHoldsObjects: each store, reached through its URL with the
// endpoint in the query, writes, lists, reads and deletes an object under a
// prefix, and says an object that is not there is not there.
func TestEachStoreHoldsObjects(t *testing.T) {
	for _, scheme := range storetest.Schemes {
		t.Run(scheme, func(t *testing.T) {
			store := storetest.Start(t, "../..", scheme, "objects")
			ctx := context.Background()
			b, err := blobopen.Open(ctx, store.BucketURL("objects", "runs/a/"))
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if err := b.WriteAll(ctx, "x/state.bin", []byte("durable"), nil); err != nil {
				t.Fatal(err)
			}
			got, err := b.ReadAll(ctx, "x/state.bin")
			if err != nil || string(got) != "durable" {
				t.Fatalf("read back %q, %v", got, err)
			}
			whole, err := blobopen.Open(ctx, store.BucketURL("objects", ""))
			if err != nil {
				t.Fatal(err)
			}
			defer whole.Close()
			if ok, err := whole.Exists(ctx, "runs/a/x/state.bin"); !ok || err != nil {
				t.Fatalf("the object is not under the prefix in the bucket: %v, %v", ok, err)
			}
			page, _, err := b.ListPage(ctx, blob.FirstPageToken, 10, nil)
			if err != nil || len(page) != 1 || page[0].Key != "x/state.bin" {
				t.Fatalf("listed %+v, %v", page, err)
			}
			if err := b.Delete(ctx, "x/state.bin"); err != nil {
				t.Fatal(err)
			}
			if _, err := b.ReadAll(ctx, "x/state.bin"); gcerrors.Code(err) != gcerrors.NotFound {
				t.Fatalf("after delete: %v; want not found", err)
			}
		})
	}
}

const bigCheckpointBytes = 1 << 30

// TestBigCheckpointOnEachStore: on each store, a 1 GiB checkpoint goes
// through the store's large upload (S3's multipart upload, GCS's resumable
// upload, Azure's staged blocks) and verifies; a writer killed with SIGKILL
// in the middle of the same upload leaves nothing that verifies, so nothing
// partial can load.
func TestBigCheckpointOnEachStore(t *testing.T) {
	if os.Getenv("DURABLETRAIN_BIG_CHECKPOINT_URL") != "" {
		writeBigCheckpoint(t) // the child the test kills
		return
	}
	if testing.Short() {
		t.Skip("writes 1 GiB twice to each store")
	}
	for _, scheme := range storetest.Schemes {
		t.Run(scheme, func(t *testing.T) { bigCheckpoint(t, scheme) })
	}
}

func bigCheckpoint(t *testing.T, scheme string) {
	store := storetest.Start(t, "../..", scheme, "big")
	ctx := context.Background()
	url := store.BucketURL("big", "ckpt/")

	// Killed mid-upload: the child writes, the parent waits for it to be
	// well into the object, then kills it.
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBigCheckpointOnEachStore$", "-test.v")
	cmd.Env = append(os.Environ(), "DURABLETRAIN_BIG_CHECKPOINT_URL="+url, "DURABLETRAIN_BIG_CHECKPOINT_RUN=killed")
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var seen bytes.Buffer
	started := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := out.Read(buf)
			seen.Write(buf[:n])
			if bytes.Contains(seen.Bytes(), []byte("wrote 256 MiB")) {
				close(started)
				io.Copy(io.Discard, out)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-started:
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("the writer did not get 256 MiB in:\n%s", seen.String())
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	cs, err := checkpoint.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if c, err := cs.LatestVerified(ctx, "killed"); !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		t.Fatalf("after a writer killed mid-upload: %+v, %v; want no checkpoint", c, err)
	}

	// Written whole: it commits, verifies, and reads back byte for byte.
	t.Setenv("DURABLETRAIN_BIG_CHECKPOINT_URL", url)
	t.Setenv("DURABLETRAIN_BIG_CHECKPOINT_RUN", "whole")
	start := time.Now()
	writeBigCheckpoint(t)
	wrote := time.Since(start)
	start = time.Now()
	c, err := cs.LatestVerified(ctx, "whole")
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Open(ctx, "state.bin")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, r)
	r.Close()
	if err != nil || n != bigCheckpointBytes || c.Manifest.Bytes() != bigCheckpointBytes {
		t.Fatalf("read back %d bytes (%v); manifest says %d", n, err, c.Manifest.Bytes())
	}
	t.Logf("1 GiB checkpoint on %s: saved in %v (%.2f GB/s), verified and read in %v",
		scheme, wrote.Round(time.Millisecond), float64(bigCheckpointBytes)/wrote.Seconds()/1e9, time.Since(start).Round(time.Millisecond))
}

// writeBigCheckpoint writes a 1 GiB checkpoint to $DURABLETRAIN_BIG_CHECKPOINT_URL,
// saying how far it got every 256 MiB.
func writeBigCheckpoint(t *testing.T) {
	ctx := context.Background()
	store, err := checkpoint.Open(ctx, os.Getenv("DURABLETRAIN_BIG_CHECKPOINT_URL"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w, err := store.Begin(ctx, os.Getenv("DURABLETRAIN_BIG_CHECKPOINT_RUN"), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	f, err := w.Create(ctx, "state.bin")
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("durabletrain"), (1<<20)/12+1)[:1<<20]
	for i := 1; i <= bigCheckpointBytes>>20; i++ {
		chunk[0] = byte(i) // not one repeated block
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
		if i%256 == 0 {
			fmt.Printf("wrote %d MiB\n", i)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
		t.Fatal(err)
	}
}
