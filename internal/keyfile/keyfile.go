// Package keyfile owns reading the secret keys durabletrain's commands are
// given as files (the workers' pool key, the payload codec key): kept out of
// flags and environment, where ps and /proc show them, and refused when the
// file could be read by others or is too short to be a key.
package keyfile

import (
	"bytes"
	"fmt"
	"os"
)

// MinBytes is the shortest key accepted: 256 bits.
const MinBytes = 32

// Read returns the key in the file at path, without trailing whitespace
// (`openssl rand -hex 32 > f` and `head -c 32 /dev/urandom > f` both work).
// flag names the option that gave the path, for the error.
func Read(path, flag string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	switch {
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("%s: %s is not a regular file", flag, path)
	case st.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("%s: %s can be read by others (mode %04o); want it readable by its owner only: chmod 600 %s", flag, path, st.Mode().Perm(), path)
	case st.Size() > 64<<10:
		return nil, fmt.Errorf("%s: %s has %d bytes; a key file holds at most 64 KiB", flag, path, st.Size())
	}
	data := make([]byte, st.Size())
	if _, err := f.ReadAt(data, 0); err != nil && st.Size() > 0 {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	key := bytes.TrimRight(data, " \t\r\n")
	if len(key) < MinBytes {
		return nil, fmt.Errorf("%s: %s holds %d bytes; want at least %d (make one with: openssl rand -hex 32 > %s; chmod 600 %s)", flag, path, len(key), MinBytes, path, path)
	}
	return key, nil
}
