package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"google.golang.org/api/option"

	"github.com/durabletrain/durabletrain/testkit/azurite"
	"github.com/durabletrain/durabletrain/testkit/fakegcs"

	_ "github.com/durabletrain/durabletrain/blobdrivers" // gs:// with ?endpoint=, azblob://
)

// otherStoreRows measures gs:// on fake-gcs-server and azblob:// on Azurite
// as benchS3 measures S3: our checkpoint save and restore against the
// cloud's own Go SDK writing and reading the same bytes as one object, with
// its defaults (GCS: a resumable upload in 16 MiB chunks; Azure: UploadBuffer
// in blocks, DownloadStream).
func otherStoreRows(ctx context.Context, dir string, repeat int, state []byte) ([][]string, error) {
	var rows [][]string

	bin, err := fakegcs.Binary(".")
	if err != nil {
		return nil, err
	}
	os.MkdirAll(filepath.Join(dir, "gcs", "data"), 0o755)
	gcs, err := fakegcs.Start(bin, filepath.Join(dir, "gcs", "data"))
	if err != nil {
		return nil, err
	}
	defer gcs.Stop()
	if err := gcs.CreateBucket(ctx, "bench"); err != nil {
		return nil, err
	}
	gc, err := storage.NewClient(ctx, option.WithEndpoint(gcs.Endpoint+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		return nil, err
	}
	defer gc.Close()
	save, restore, up, down, err := storeRounds(ctx, repeat, gcs.BucketURL("bench", "ours/"), state,
		func(rep int) error {
			w := gc.Bucket("bench").Object(fmt.Sprintf("peer/%d.bin", rep)).NewWriter(ctx)
			if _, err := w.Write(state); err != nil {
				w.Close()
				return err
			}
			return w.Close()
		},
		func(rep int) error {
			r, err := gc.Bucket("bench").Object(fmt.Sprintf("peer/%d.bin", rep)).NewReader(ctx)
			if err != nil {
				return err
			}
			defer r.Close()
			return drain(r, len(state))
		})
	if err != nil {
		return nil, fmt.Errorf("gs://: %w", err)
	}
	rows = append(rows, storeRows("GCS (fake-gcs-server)", "storage.Writer", "storage.Reader", len(state), save, restore, up, down)...)

	bin, err = azurite.Binary(".")
	if err != nil {
		return nil, err
	}
	os.MkdirAll(filepath.Join(dir, "azurite", "data"), 0o755)
	az, err := azurite.Start(bin, filepath.Join(dir, "azurite", "data"))
	if err != nil {
		return nil, err
	}
	defer az.Stop()
	for _, kv := range az.Env() {
		k, v, _ := bytes.Cut([]byte(kv), []byte("="))
		os.Setenv(string(k), string(v))
	}
	if err := az.CreateBucket(ctx, "bench"); err != nil {
		return nil, err
	}
	cred, err := azblob.NewSharedKeyCredential(azurite.Account, azurite.Key)
	if err != nil {
		return nil, err
	}
	ac, err := azblob.NewClientWithSharedKeyCredential("http://"+az.Host+"/"+azurite.Account, cred, nil)
	if err != nil {
		return nil, err
	}
	save, restore, up, down, err = storeRounds(ctx, repeat, az.BucketURL("bench", "ours/"), state,
		func(rep int) error {
			_, err := ac.UploadBuffer(ctx, "bench", fmt.Sprintf("peer/%d.bin", rep), state, nil)
			return err
		},
		func(rep int) error {
			resp, err := ac.DownloadStream(ctx, "bench", fmt.Sprintf("peer/%d.bin", rep), nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			return drain(resp.Body, len(state))
		})
	if err != nil {
		return nil, fmt.Errorf("azblob://: %w", err)
	}
	rows = append(rows, storeRows("Azure Blob (Azurite)", "azblob UploadBuffer", "azblob DownloadStream", len(state), save, restore, up, down)...)
	return rows, nil
}

// drain reads r to its end and checks it held want bytes.
func drain(r io.Reader, want int) error {
	n, err := io.Copy(io.Discard, r)
	if err == nil && n != int64(want) {
		err = fmt.Errorf("read %d bytes; want %d", n, want)
	}
	return err
}
