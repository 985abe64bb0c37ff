// Package dataset owns training data: the registry of data set formats
// (spec.dataset.format; "idx" reads Fashion-MNIST's IDX files) read through a
// gocloud.dev/blob URL, and the order in which ranks see them — a
// deterministic shuffle per (seed, epoch) and disjoint, equal-sized shards per
// rank, as torch's DistributedSampler(drop_last=True) makes them.
//
// It registers no blob driver: as gocloud leaves to main packages, the binary
// imports the drivers of the URLs it accepts (durabletrain's blobdrivers
// package: file://, mem://, s3://).
package dataset
