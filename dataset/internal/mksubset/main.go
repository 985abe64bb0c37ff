// Command mksubset writes the first examples of Fashion-MNIST to a folder, for
// the small real data set committed under testdata/ (tests run without the
// Debian package and in seconds).
//
//	go run ./dataset/internal/mksubset -train 10000 -test 1000 -out testdata/fashion-mnist-small
package main

import (
	"context"
	"flag"
	"log"
	"os"
	"path/filepath"

	_ "gocloud.dev/blob/fileblob"

	// file:// and s3:// only, not blobdrivers: make test builds this
	// package under the race detector, and the Google Cloud and Azure SDKs
	// would add some 370 packages to that build.
	_ "github.com/durabletrain/durabletrain/blobdrivers/s3"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/internal/bloburl"
)

func main() {
	from := flag.String("from", dataset.DefaultURL, "bucket URL (file:// or s3://) holding the full data set")
	out := flag.String("out", "testdata/fashion-mnist-small", "folder to write the subset to")
	train := flag.Int("train", 10000, "training examples to keep")
	test := flag.Int("test", 1000, "test examples to keep")
	flag.Parse()
	ctx := context.Background()
	abs, err := filepath.Abs(*out)
	if err != nil {
		log.Fatal(err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		log.Fatal(err)
	}
	for split, n := range map[dataset.Split]int{dataset.Train: *train, dataset.Test: *test} {
		s, err := dataset.Load(ctx, *from, split)
		if err != nil {
			log.Fatal(err)
		}
		if err := dataset.Write(ctx, bloburl.FromPath(abs)+"?metadata=skip", split, s.Head(n)); err != nil {
			log.Fatal(err)
		}
	}
}
