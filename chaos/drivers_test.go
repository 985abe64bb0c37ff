package chaos

// Libraries register no blob driver (gocloud's habit); the tests, like the
// binaries, import the ones they use: file://, mem:// and s3:// (MinIO), not
// blobdrivers, whose Google Cloud and Azure SDKs would add some 370 packages to
// the test's build (and to make test's race build) for URLs no test opens.
import (
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/memblob"

	_ "github.com/durabletrain/durabletrain/blobdrivers/s3"
)
