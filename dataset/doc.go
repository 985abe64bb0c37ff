// Package dataset owns training data: reading Fashion-MNIST's IDX files
// through a gocloud.dev/blob URL, and the order in which ranks see them — a
// deterministic shuffle per (seed, epoch) and disjoint, equal-sized shards per
// rank, as torch's DistributedSampler(drop_last=True) makes them.
//
// Local URLs (file://, mem://) work out of the box; for s3://, gs:// or
// azblob:// import the matching gocloud.dev driver (or durabletrain's
// blobdrivers package) in the binary.
package dataset
