package integration

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

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/minio/miniotest"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// TestTrainsOnS3: a run reads its data set from S3 and checkpoints to S3
// (a real MinIO, through the worker's storage root that holds the endpoint),
// and a second run on another worker resumes from those checkpoints.
func TestTrainsOnS3(t *testing.T) {
	if testing.Short() {
		t.Skip("starts MinIO and worker processes")
	}
	s3 := miniotest.Start(t, "..", "durabletrain")
	ctx := context.Background()
	// The committed data subset, uploaded.
	miniotest.UploadDir(t, s3, "durabletrain", "data/", testdata.FashionMNISTSmallDir())

	queue := "it-s3"
	root := s3.BucketURL("durabletrain", "")
	flags := []string{"-storage-roots", root}
	startWorkerWith(t, "worker-a", "both", queue, flags, s3.Env()...)
	c := dial(t)
	s := subsetSpec(t, queue, 1, 2)
	s.Hyper.BatchSize = 128
	s.Dataset.URL = "s3://durabletrain?prefix=data/"
	s.Checkpoint.URL = "s3://durabletrain?prefix=ckpt/"
	first := awaitRun(t, startRun(t, c, "it-s3-1", queue, s), 3*time.Minute)
	if first.State != spec.StateCompleted || first.Latest == nil || first.Latest.URL != s.Checkpoint.URL {
		t.Fatalf("the run on S3: %+v", first)
	}

	// Its checkpoints are in the bucket and verify.
	store, err := checkpoint.Open(ctx, s3.BucketURL("durabletrain", "ckpt/"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	c0, err := store.LatestVerified(ctx, first.Run)
	if err != nil || c0.Manifest.Epoch != 2 {
		t.Fatalf("the latest verified checkpoint in S3: %+v, %v", c0, err)
	}

	// Another worker resumes from them.
	startWorkerWith(t, "worker-b", "agent", queue, flags, s3.Env()...)
	s.ResumeFrom, s.Hyper.Epochs = first.Run, 3
	second := awaitRun(t, startRun(t, c, "it-s3-2", queue, s), 3*time.Minute)
	if second.State != spec.StateCompleted || len(second.Metrics) != 1 || second.Metrics[0].Epoch != 2 {
		t.Fatalf("the resumed run: %+v", second)
	}
}

const bigCheckpointBytes = 1 << 30

// TestBigCheckpointOnS3: a 1 GiB checkpoint goes through S3's multipart
// upload and verifies; a writer killed with SIGKILL in the middle of the
// same upload leaves nothing that verifies, so nothing partial can load.
func TestBigCheckpointOnS3(t *testing.T) {
	if os.Getenv("DURABLETRAIN_BIG_CHECKPOINT_URL") != "" {
		writeBigCheckpoint(t) // the child the test kills
		return
	}
	if testing.Short() {
		t.Skip("writes 1 GiB twice")
	}
	s3 := miniotest.Start(t, "..", "big")
	ctx := context.Background()
	url := s3.BucketURL("big", "ckpt/")

	// Killed mid-upload: the child writes, the parent waits for it to be
	// well into the object, then kills it.
	cmd := exec.Command(os.Args[0], "-test.run", "^TestBigCheckpointOnS3$", "-test.v")
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
	store, err := checkpoint.Open(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if c, err := store.LatestVerified(ctx, "killed"); !errors.Is(err, checkpoint.ErrNoCheckpoint) {
		t.Fatalf("after a writer killed mid-upload: %+v, %v; want no checkpoint", c, err)
	}

	// Written whole: it commits, verifies, and reads back byte for byte.
	t.Setenv("DURABLETRAIN_BIG_CHECKPOINT_URL", url)
	t.Setenv("DURABLETRAIN_BIG_CHECKPOINT_RUN", "whole")
	start := time.Now()
	writeBigCheckpoint(t)
	wrote := time.Since(start)
	start = time.Now()
	c, err := store.LatestVerified(ctx, "whole")
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
	t.Logf("1 GiB checkpoint on MinIO: saved in %v (%.2f GB/s), verified and read in %v", wrote.Round(time.Millisecond),
		float64(bigCheckpointBytes)/wrote.Seconds()/1e9, time.Since(start).Round(time.Millisecond))
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
