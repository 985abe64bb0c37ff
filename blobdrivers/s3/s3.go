// Package s3 registers gocloud.dev's s3:// blob driver (AWS S3 and
// S3-compatible stores such as MinIO) with durabletrain's default for the AWS
// SDK's response checksums. Package blobdrivers imports it beside the other
// drivers; a test that opens only file://, mem:// and s3:// URLs imports it
// (with fileblob and memblob) instead of blobdrivers, which keeps the Google
// Cloud and Azure SDKs, some 370 packages, out of its build: that is most of
// what `make test`'s race-detector build would otherwise compile for nothing.
package s3

import (
	"os"

	_ "gocloud.dev/blob/s3blob"
)

func init() {
	// The AWS SDK validates a response's checksum when the object has one of
	// its own, and for a multipart object (every large checkpoint) logs
	// "Skipped validation of multipart checksum" on every read: noise in the
	// worker's log, since our manifests verify every block anyway. Ask for
	// validation only where an operation requires it, unless the environment
	// says otherwise.
	if _, set := os.LookupEnv("AWS_RESPONSE_CHECKSUM_VALIDATION"); !set {
		os.Setenv("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")
	}
}
