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
// to and from the same server, interleaved, in one run.
func benchS3(args []string) error {
	fs := flag.NewFlagSet("s3", flag.ExitOnError)
	sizeFlag := fs.String("size", "1G", "state size (K, M, G suffixes)")
	repeat := fs.Int("repeat", 3, "interleaved runs; the table shows medians and the spread")
	awsBin := fs.String("aws", "/usr/bin/aws", "the AWS CLI to compare against (Debian's awscli)")
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
	var save, restore, awsUp, awsDown []float64
	for rep := range *repeat {
		// Ours: objects with their XXH3 hash list, then the manifest.
		store, err := checkpoint.Open(ctx, srv.BucketURL("bench", "ours/"), nil)
		if err != nil {
			return err
		}
		t := time.Now()
		w, err := store.Begin(ctx, "bench", rep+1, 0)
		if err != nil {
			return err
		}
		f, err := w.Create(ctx, "state.bin")
		if err != nil {
			return err
		}
		if _, err := f.Write(state); err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if _, err := w.Commit(ctx, checkpoint.Info{WorldSize: 1}); err != nil {
			return err
		}
		save = append(save, time.Since(t).Seconds())
		t = time.Now()
		if _, err := store.RestoreLatest(ctx, "bench", func(c *checkpoint.Checkpoint) error { return readAll(ctx, c) }); err != nil {
			return err
		}
		restore = append(restore, time.Since(t).Seconds())
		store.Close()

		// The AWS CLI: the same bytes up (multipart, its defaults) and down.
		t = time.Now()
		if err := aws("cp", "--only-show-errors", local, fmt.Sprintf("s3://bench/peer/%d.bin", rep)); err != nil {
			return err
		}
		awsUp = append(awsUp, time.Since(t).Seconds())
		t = time.Now()
		if err := aws("cp", "--only-show-errors", fmt.Sprintf("s3://bench/peer/%d.bin", rep), os.DevNull); err != nil {
			return err
		}
		awsDown = append(awsDown, time.Since(t).Seconds())
	}
	gbps := func(secs []float64) float64 { return float64(size) / median(secs) / 1e9 }
	spread := func(secs []float64) string {
		lo, hi := slices.Min(secs), slices.Max(secs)
		return fmt.Sprintf("%.2f–%.2f", float64(size)/hi/1e9, float64(size)/lo/1e9)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# %s state to MinIO %s on this machine (%s), median of %d interleaved runs (spread: slowest–fastest GB/s)\n", humanBytes(size), srv.Endpoint, bin, *repeat)
	if testsBuild {
		b.WriteString("# that MinIO is the tests' build, without the compiler's optimisations: `make bench-s3` builds an optimised one into " + optimisedMinIO + "\n")
	}
	b.WriteString("\n")
	fmt.Print(b.String())
	table([]string{"operation", "ours GB/s", "spread", "aws s3 cp GB/s", "spread", "ours / aws"}, [][]string{
		{"save: objects + XXH3 hash list + manifest", fmt.Sprintf("%.2f", gbps(save)), spread(save), fmt.Sprintf("%.2f", gbps(awsUp)), spread(awsUp), fmt.Sprintf("%.2fx", gbps(save)/gbps(awsUp))},
		{"restore: RestoreLatest, verified while read", fmt.Sprintf("%.2f", gbps(restore)), spread(restore), fmt.Sprintf("%.2f", gbps(awsDown)), spread(awsDown), fmt.Sprintf("%.2fx", gbps(restore)/gbps(awsDown))},
	})
	return nil
}
