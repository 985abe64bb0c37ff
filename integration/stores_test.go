package integration

import (
	"context"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/azurite"
	"github.com/durabletrain/durabletrain/testkit/storeproc"
	"github.com/durabletrain/durabletrain/testkit/storetest"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

// TestTrainsOnEachStore: on each store the product claims (a real MinIO
// for s3://, fake-gcs-server for gs://, Azurite for azblob://, each reached
// through the worker's storage root that holds its endpoint), a run reads
// its data set from the store and checkpoints to it, its checkpoints verify
// in the bucket, and a second run on another worker resumes from them.
func TestTrainsOnEachStore(t *testing.T) {
	if testing.Short() {
		t.Skip("starts each store and worker processes")
	}
	for _, scheme := range storetest.Schemes {
		t.Run(scheme, func(t *testing.T) {
			store := storetest.Start(t, "..", scheme, "durabletrain")
			ctx := context.Background()
			// The committed data subset, uploaded.
			storeproc.UploadDir(t, store.BucketURL("durabletrain", "data/"), testdata.FashionMNISTSmallDir())

			queue := "it-store-" + scheme
			flags := []string{"-storage-roots", store.BucketURL("durabletrain", "")}
			startWorkerWith(t, "worker-a", "both", queue, flags, store.Env()...)
			c := dial(t)
			s := subsetSpec(t, queue, 1, 2)
			s.Hyper.BatchSize = 128
			s.Dataset.URL = scheme + "://durabletrain?prefix=data/"
			s.Checkpoint.URL = scheme + "://durabletrain?prefix=ckpt/"
			first := awaitRun(t, startRun(t, c, queue+"-1", queue, s), 3*time.Minute)
			if first.State != spec.StateCompleted || first.Latest == nil || first.Latest.URL != s.Checkpoint.URL {
				t.Fatalf("the run on %s: %+v", scheme, first)
			}

			// Its checkpoints are in the bucket and verify.
			cs, err := checkpoint.Open(ctx, store.BucketURL("durabletrain", "ckpt/"), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer cs.Close()
			c0, err := cs.LatestVerified(ctx, first.Run)
			if err != nil || c0.Manifest.Epoch != 2 {
				t.Fatalf("the latest verified checkpoint in %s: %+v, %v", scheme, c0, err)
			}

			// Another worker resumes from them.
			startWorkerWith(t, "worker-b", "agent", queue, flags, store.Env()...)
			s.ResumeFrom, s.Hyper.Epochs = first.Run, 3
			second := awaitRun(t, startRun(t, c, queue+"-2", queue, s), 3*time.Minute)
			if second.State != spec.StateCompleted || len(second.Metrics) != 1 || second.Metrics[0].Epoch != 2 {
				t.Fatalf("the resumed run: %+v", second)
			}
		})
	}
}

// TestAStoreThatCannotBeReachedFailsTheRun: a worker whose storage root
// names an endpoint where nothing listens (each scheme's) fails the run with
// an error that names the checkpoint URL, in seconds, not a hang, and the
// worker lives through it (Azure's driver panicked on such a store: the
// panic is contained in package blobwatch).
func TestAStoreThatCannotBeReachedFailsTheRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts worker processes")
	}
	port, err := storeproc.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://127.0.0.1:" + strconv.Itoa(port)
	roots := map[string]string{
		"s3":     "s3://gone?endpoint=" + url.QueryEscape(dead) + "&use_path_style=true&disable_https=true&region=us-east-1",
		"gs":     "gs://gone?endpoint=" + url.QueryEscape(dead) + "&anonymous=true",
		"azblob": "azblob://gone?domain=127.0.0.1:" + strconv.Itoa(port) + "&protocol=http&localemu=true&storage_account=" + azurite.Account,
	}
	env := []string{"AWS_ACCESS_KEY_ID=x", "AWS_SECRET_ACCESS_KEY=y", "AWS_EC2_METADATA_DISABLED=true",
		"AZURE_STORAGE_ACCOUNT=" + azurite.Account, "AZURE_STORAGE_KEY=" + azurite.Key}
	for _, scheme := range storetest.Schemes {
		t.Run(scheme, func(t *testing.T) {
			queue := "it-dead-" + scheme
			data := bloburl.FromPath(filepath.Dir(testdata.FashionMNISTSmallDir())) + "/" // the data set is local
			startWorkerWith(t, "worker-dead-"+scheme, "both", queue, []string{"-storage-roots", roots[scheme] + "," + data}, env...)
			s := subsetSpec(t, queue, 1, 2)
			s.Checkpoint.URL = scheme + "://gone?prefix=ckpt/"
			s.Failure.MaxFailures = spec.Int(0)
			start := time.Now()
			run := startRun(t, dial(t), queue, queue, s)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			err := run.Get(ctx, nil)
			took := time.Since(start)
			// The URL named is the one the worker opened: the spec's, with the root's endpoint.
			if err == nil || ctx.Err() != nil || !strings.Contains(err.Error(), scheme+"://gone?") || !strings.Contains(err.Error(), "prefix=ckpt%2F") {
				t.Fatalf("a run whose store cannot be reached ended after %v with %v; want it failed, naming %s", took, err, s.Checkpoint.URL)
			}
			// Not after the storage stall timeout (2 minutes): the store refuses
			// connections, and each SDK says so at once.
			if took > time.Minute {
				t.Errorf("the run failed only after %v; want it failed as soon as the store refused it", took)
			}
			t.Logf("%s: failed after %v: %v", scheme, took.Round(time.Millisecond), err)
		})
	}
}
