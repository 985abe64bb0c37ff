// Package blobdrivers registers the gocloud.dev/blob drivers durabletrain's
// binaries accept in URLs: file://, mem:// and s3:// (S3 and S3-compatible
// stores such as MinIO). Import it for its side effect.
package blobdrivers

import (
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/memblob"
	_ "gocloud.dev/blob/s3blob"
)
