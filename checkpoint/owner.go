package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	neturl "net/url"
	"os"
	"path/filepath"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// OwnerName is the object, beside a run's checkpoints, that names the run
// that writes them.
const OwnerName = "OWNER.json"

// Owner is what OwnerName holds.
type Owner struct {
	Owner   string    `json:"owner"` // the workflow's ID and first run ID
	Claimed time.Time `json:"claimed"`
}

// ErrOwned is returned by Claim when another owner holds the run name.
var ErrOwned = fmt.Errorf("checkpoint: run name owned by another run")

// Claim makes owner the only writer of run's checkpoints in this store: the
// first claim wins (a conditional write, atomic on every driver that
// supports it: file, mem, S3, GCS, Azure), and a claim by anyone else fails
// with ErrOwned naming the owner, so two runs that map to one name (the same
// spec "name", or a workflow ID reused after its run closed) cannot restore
// or overwrite each other's checkpoints. A run whose checkpoints predate
// ownership is claimed by the first run that writes it now.
func (s *Store) Claim(ctx context.Context, run, owner string) error {
	if err := checkRun(run); err != nil {
		return err
	}
	key := run + "/" + OwnerName
	data, _ := json.Marshal(Owner{Owner: owner, Claimed: time.Now().UTC().Truncate(time.Second)})
	for attempt := 0; attempt < 2; attempt++ {
		if path, ok := s.localPath(key); ok {
			// fileblob checks IfNotExist before its rename, not atomically
			// with it: two claims at once could both win. A hard link is
			// atomic, across processes too.
			won, err := linkExclusive(path, data)
			if err != nil {
				return fmt.Errorf("checkpoint: claiming run %s in %s: %w", run, s.url, err)
			}
			if won {
				return nil
			}
		} else {
			err := s.bucket.WriteAll(ctx, key, data, &blob.WriterOptions{IfNotExist: true, ContentType: "application/json"})
			if err == nil {
				return nil
			}
			if gcerrors.Code(err) != gcerrors.FailedPrecondition {
				return fmt.Errorf("checkpoint: claiming run %s in %s: %w", run, s.url, err)
			}
		}
		got, rerr := s.bucket.ReadAll(ctx, key, maxOwnerBytes)
		if gcerrors.Code(rerr) == gcerrors.NotFound {
			continue // removed between the two calls: try again
		}
		if rerr != nil {
			return fmt.Errorf("checkpoint: reading the owner of run %s in %s: %w", run, s.url, rerr)
		}
		var o Owner
		if json.Unmarshal(got, &o) != nil || o.Owner == "" {
			return fmt.Errorf("%w: %s/%s is not an owner record; remove it or use another run name", ErrOwned, run, OwnerName)
		}
		if o.Owner == owner {
			return nil
		}
		return fmt.Errorf("%w: run %s in %s belongs to %s (since %s); give this run another name (spec \"name\" or workflow ID), or start from its checkpoints with \"resume_from\"",
			ErrOwned, run, s.url, o.Owner, o.Claimed.Format(time.RFC3339))
	}
	return fmt.Errorf("checkpoint: claiming run %s in %s: its owner record keeps changing", run, s.url)
}

// maxOwnerBytes bounds an owner record read back (ours are under 200 bytes).
const maxOwnerBytes = 64 << 10

// localPath is where key lies on local disk, for a file:// store.
func (s *Store) localPath(key string) (string, bool) {
	u, err := neturl.Parse(s.url)
	if err != nil || u.Scheme != "file" || u.Path == "" {
		return "", false
	}
	return filepath.Join(u.Path, filepath.FromSlash(u.Query().Get("prefix")+key)), true
}

// linkExclusive creates path holding data, whole, unless it exists: the
// data goes to a temporary file beside it, which is then hard-linked to
// path (atomic: exactly one of many linkers wins). won is false if path
// existed.
func linkExclusive(path string, data []byte) (won bool, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, ".claim-*")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return false, err
	}
	switch err := os.Link(tmp.Name(), path); {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrExist):
		return false, nil
	default:
		return false, err
	}
}
