// Package blobdrivers registers the gocloud.dev/blob drivers durabletrain's
// binaries accept in URLs: file://, mem://, s3:// (S3 and S3-compatible
// stores such as MinIO), gs:// (Google Cloud Storage) and azblob:// (Azure
// Blob Storage): every scheme spec.CheckURL accepts. Import it for its side
// effect. Credentials come from each cloud's usual environment (AWS_*,
// GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*). A store's endpoint goes in
// the URL's query, in a worker's storage root: s3://bucket?endpoint=...,
// gs://bucket?endpoint=... (package gcs), azblob://container?domain=...&protocol=http.
package blobdrivers

import (
	_ "gocloud.dev/blob/azureblob"
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/memblob"

	_ "github.com/durabletrain/durabletrain/blobdrivers/gcs" // gs://, with ?endpoint=
	_ "github.com/durabletrain/durabletrain/blobdrivers/s3"  // s3://, with our checksum default
)
