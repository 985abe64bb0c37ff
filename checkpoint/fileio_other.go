//go:build !linux

package checkpoint

import (
	"errors"
	"os"
)

// startWriteback is a no-op where sync_file_range does not exist; the final fsync does all the work.
func startWriteback(*os.File, int64, int64) {}

// canDirect: direct I/O is Linux's here; elsewhere objects go through the cache.
func canDirect(*os.File) bool { return false }

func setDirect(*os.File, bool) error { return errors.ErrUnsupported }

func cached(*os.File, int64, int64) bool { return false }

func isDirectRefused(error) bool { return false }
