// Package checkpoint owns checkpoints in blob storage (gocloud.dev/blob, opened
// from a URL: file://, mem://, or s3://, gs://, azblob:// with their drivers
// imported). A checkpoint is a set of named objects under
// <run>/<id>/ plus a manifest, <run>/<id>/MANIFEST.json, written last: a
// checkpoint exists only once its manifest does. The manifest records the
// format version, run, training cursor, world size, metrics, creation time,
// and the size and check of every object, a hash list over BlockSize blocks
// so that checking uses every core: in format 3 an XXH3-128 checksum of
// each block and, from a store with a key, a GMAC tag of each under a key
// of the object's own; BLAKE3 in format 2 and SHA-256 in format 1, which it
// still reads. It carries a SHA-256 checksum of itself and, from a store
// with a key, an HMAC of that (Store.Sign).
//
// LatestVerified returns the newest checkpoint whose manifest and objects all
// verify, and says which newer ones it skipped and why; a truncated,
// corrupted or half-written checkpoint is never returned, and Open verifies
// again while reading. Prune applies retention (keep the last N and the best K
// by a metric) and never deletes the latest verified checkpoint.
//
// On a local disk objects are written and read with O_DIRECT where the file
// system takes it (fileio.go), bypassing the page cache; file:// URLs take
// direct_io=off to go through it.
//
// It knows nothing of Temporal or of trainers; a Writer and a Checkpoint
// satisfy trainer.StateWriter and trainer.StateReader.
package checkpoint
