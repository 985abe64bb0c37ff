package exectrainer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/durabletrain/durabletrain/trainer"
)

func restoreFile(ctx context.Context, from trainer.StateReader, object, rel, sum, dir string) error {
	if !filepath.IsLocal(filepath.FromSlash(rel)) {
		return fmt.Errorf("bad file name %q", rel)
	}
	r, err := from.Open(ctx, object)
	if err != nil {
		return err
	}
	defer r.Close()
	path := filepath.Join(dir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return fmt.Errorf("content does not match the saved SHA-256 (%s, want %s)", got[:12], sum[:min(12, len(sum))])
	}
	return nil
}

func writeState(ctx context.Context, to trainer.StateWriter, st state) error {
	w, err := to.Create(ctx, stateObject)
	if err != nil {
		return err
	}
	b, _ := json.Marshal(st) // map keys sorted: deterministic
	if _, err := w.Write(b); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

func readJSON(ctx context.Context, from trainer.StateReader, name string, v any) error {
	r, err := from.Open(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func saveFile(ctx context.Context, to trainer.StateWriter, path, name string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	w, err := to.Create(ctx, name)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if _, err := io.Copy(io.MultiWriter(w, h), f); err != nil {
		w.Close()
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), w.Close()
}

// copyFile copies the regular file src, or the one a symbolic link src
// names, to dst. Anything else is refused without blocking: a named pipe
// would wait forever for a writer, a device such as /dev/zero never ends,
// and the worker copies while it should be answering its gang. It opens
// src without waiting and asks the open file what it is, so a file swapped
// for a pipe after a look is refused all the same.
func copyFile(src, dst string) error {
	in, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	info, err := in.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is a %s, not a regular file; want a checkpoint directory of regular files, links to them and directories (not links to directories)", src, fileKind(info.Mode()))
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return &copyError{err}
	}
	out, err := os.Create(dst)
	if err != nil {
		return &copyError{err}
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		if pe := (*os.PathError)(nil); errors.As(err, &pe) && pe.Path == dst {
			return &copyError{err} // the worker's write (a full or failing disk), not the program's file
		}
		return err
	}
	if err := out.Close(); err != nil {
		return &copyError{err}
	}
	return nil
}

// copyError is a failure to write the worker's copy of a checkpoint file
// (its scratch disk full or failing): the worker's fault, which another
// gang may not meet, not the program's.
type copyError struct{ err error }

func (e *copyError) Error() string { return e.err.Error() }

func (e *copyError) Unwrap() error { return e.err }

// fileKind names what a file that is not a regular one is.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "device"
	case m.IsDir():
		return "directory"
	}
	return "special file (" + m.String() + ")"
}
