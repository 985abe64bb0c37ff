package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/testkit/minio"
)

// optimisedMinIO is the MinIO that `make bench-s3` builds with the compiler's
// optimisations (the tests' bin/minio is built without them).
const optimisedMinIO = "bin/bench/minio"

// benchMinIO is the MinIO server to measure against: $MINIO_BIN, else the
// optimised build if there is one, else the tests' build, which it says.
func benchMinIO() (bin string, testsBuild bool, err error) {
	if os.Getenv("MINIO_BIN") != "" {
		bin, err = minio.Binary(".")
		return bin, false, err
	}
	if _, err := os.Stat(optimisedMinIO); err == nil {
		return optimisedMinIO, false, nil
	}
	bin, err = minio.Binary(".")
	return bin, true, err
}

// benchS3 measures a checkpoint saved to and restored from S3 (a real MinIO
// on this machine, benchMinIO) against the AWS CLI copying the same bytes
// to and from the same server, interleaved, in one run; and the same on
// gs:// (fake-gcs-server) and azblob:// (Azurite), each against its own
// cloud's Go SDK (cloud.google.com/go/storage, the Azure SDK's azblob)
// copying the same bytes.
func benchS3(args []string) error {
	fs := flag.NewFlagSet("s3", flag.ExitOnError)
	sizeFlag := fs.String("size", "1G", "state size (K, M, G suffixes)")
	repeat := fs.Int("repeat", 3, "interleaved runs; the table shows medians and the spread")
	awsBin := fs.String("aws", "/usr/bin/aws", "the AWS CLI to compare against (Debian's awscli)")
	others := fs.Bool("others", true, "also gs:// on fake-gcs-server and azblob:// on Azurite (bin/fake-gcs-server, bin/azurite), each against its own Go SDK")
	fs.Parse(args)
	size, err := parseSize(*sizeFlag)
	if err != nil || size < 1<<20 {
		return fmt.Errorf("-size: %q; want at least 1M", *sizeFlag)
	}
	if _, err := os.Stat(*awsBin); err != nil {
		return fmt.Errorf("no AWS CLI at %s (apt-get install awscli, or make deps-bench): %v", *awsBin, err)
	}
	bin, testsBuild, err := benchMinIO()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "durabletrain-s3-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.MkdirAll(filepath.Join(dir, "data"), 0o755)
	srv, err := minio.Start(bin, filepath.Join(dir, "data"))
	if err != nil {
		return err
	}
	defer srv.Stop()
	srv.SetEnv(func(k, v string) { os.Setenv(k, v) })
	ctx := context.Background()
	if err := srv.CreateBucket(ctx, "bench"); err != nil {
		return err
	}
	state := make([]byte, size)
	rand.Read(state)
	local := filepath.Join(dir, "state.bin")
	if err := os.WriteFile(local, state, 0o600); err != nil {
		return err
	}
	aws := func(args ...string) error {
		cmd := exec.Command(*awsBin, append([]string{"--endpoint-url", srv.Endpoint, "s3"}, args...)...)
		cmd.Env = append(os.Environ(), "AWS_DEFAULT_REGION=us-east-1", "AWS_PAGER=")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("aws s3 %s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	rows := [][]string{}
	save, restore, awsUp, awsDown, err := storeRounds(ctx, *repeat, srv.BucketURL("bench", "ours/"), state,
		func(rep int) error {
			return aws("cp", "--only-show-errors", local, fmt.Sprintf("s3://bench/peer/%d.bin", rep))
		},
		func(rep int) error {
			return aws("cp", "--only-show-errors", fmt.Sprintf("s3://bench/peer/%d.bin", rep), os.DevNull)
		})
	if err != nil {
		return err
	}
	rows = append(rows, storeRows("S3 (MinIO)", "aws s3 cp up", "aws s3 cp down", size, save, restore, awsUp, awsDown)...)
	if *others {
		more, err := otherStoreRows(ctx, dir, *repeat, state)
		if err != nil {
			return err
		}
		rows = append(rows, more...)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s state to each store on this machine (MinIO %s; fake-gcs-server and Azurite with -others), median of %d interleaved runs (spread: slowest–fastest GB/s); each store's peer is its own client copying the same bytes\n", humanBytes(size), bin, *repeat)
	if testsBuild {
		b.WriteString("# that MinIO is the tests' build, without the compiler's optimisations: `make bench-s3` builds an optimised one into " + optimisedMinIO + "\n")
	}
	b.WriteString("\n")
	fmt.Print(b.String())
	table([]string{"store", "operation", "ours GB/s", "spread", "peer", "peer GB/s", "spread", "ours / peer"}, rows)
	return nil
}

// storeRounds saves state to the checkpoint store at url and restores it,
// then runs the peer's upload and download, repeat times, interleaved; it
// returns each one's seconds.
func storeRounds(ctx context.Context, repeat int, url string, state []byte, peerUp, peerDown func(rep int) error) (save, restore, up, down []float64, err error) {
	for rep := range repeat {
		// Ours: objects with their XXH3 hash list, then the manifest.
		store, err := checkpoint.Open(ctx, url, nil)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		t := time.Now()
		w, err := store.Begin(ctx, "bench", rep+1, 0)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		f, err := w.Create(ctx, "state.bin")
		if err != nil {
			return nil, nil, nil, nil, err
		}
		if _, err := f.Write(state); err != nil {
			return nil, nil, nil, nil, err
		}
		if err := f.Close(); err != nil {
			return nil, nil, nil, nil, err
		}
		if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
			return nil, nil, nil, nil, err
		}
		save = append(save, time.Since(t).Seconds())
		t = time.Now()
		if _, err := store.RestoreLatest(ctx, "bench", func(c *checkpoint.Checkpoint) error { return readAll(ctx, c) }); err != nil {
			return nil, nil, nil, nil, err
		}
		restore = append(restore, time.Since(t).Seconds())
		store.Close()

		t = time.Now()
		if err := peerUp(rep); err != nil {
			return nil, nil, nil, nil, err
		}
		up = append(up, time.Since(t).Seconds())
		t = time.Now()
		if err := peerDown(rep); err != nil {
			return nil, nil, nil, nil, err
		}
		down = append(down, time.Since(t).Seconds())
	}
	return save, restore, up, down, nil
}

// storeRows are a store's two rows of the table.
func storeRows(store, peerUp, peerDown string, size int, save, restore, up, down []float64) [][]string {
	gbps := func(secs []float64) float64 { return float64(size) / median(secs) / 1e9 }
	spread := func(secs []float64) string {
		lo, hi := slices.Min(secs), slices.Max(secs)
		return fmt.Sprintf("%.2f–%.2f", float64(size)/hi/1e9, float64(size)/lo/1e9)
	}
	return [][]string{
		{store, "save: objects + XXH3 hash list + manifest", fmt.Sprintf("%.2f", gbps(save)), spread(save), peerUp, fmt.Sprintf("%.2f", gbps(up)), spread(up), fmt.Sprintf("%.2fx", gbps(save)/gbps(up))},
		{store, "restore: RestoreLatest, verified while read", fmt.Sprintf("%.2f", gbps(restore)), spread(restore), peerDown, fmt.Sprintf("%.2f", gbps(down)), spread(down), fmt.Sprintf("%.2fx", gbps(restore)/gbps(down))},
	}
}
