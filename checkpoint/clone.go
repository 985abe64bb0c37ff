package checkpoint

import (
	"context"
	"fmt"
	"io"
	"maps"
)

// MetaClonedFrom is the Meta key of a clone's manifest naming its source ("run/id").
const MetaClonedFrom = "cloned_from"

// Clone copies a committed checkpoint of another run (possibly in another
// store) into run toRun of this store, at the same cursor, as a new
// checkpoint: each object is read through the source's verification and
// the clone is committed only once every object has been read whole and
// matched the source's manifest, so a damaged or half-written source never
// becomes a checkpoint. The clone is signed with this store's key, if it
// has one; its Meta names the source. Cloning again replaces an earlier
// clone at the same cursor.
func (s *Store) Clone(ctx context.Context, from *Checkpoint, toRun string) (_ Manifest, err error) {
	src := from.Manifest
	w, err := s.Begin(ctx, toRun, src.Epoch, src.Step)
	if err != nil {
		return Manifest{}, err
	}
	defer func() {
		if err != nil {
			w.Abort(ctx) // nothing of a failed clone stays behind
		}
	}()
	w.format = src.Format // the same hashes: each object's is checked against the source's
	for _, o := range src.Objects {
		if err := copyObject(ctx, from, w, o.Name); err != nil {
			return Manifest{}, fmt.Errorf("checkpoint: cloning %s/%s into %s: %w", src.Run, src.ID, toRun, err)
		}
	}
	meta := maps.Clone(src.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[MetaClonedFrom] = src.Run + "/" + src.ID
	return w.Commit(ctx, Info{WorldSize: src.WorldSize, Shards: src.Shards, Metrics: src.Metrics, Meta: meta})
}

func copyObject(ctx context.Context, from *Checkpoint, w *Writer, name string) error {
	r, err := from.Open(ctx, name)
	if err != nil {
		return err
	}
	defer r.Close()
	out, err := w.Create(ctx, name)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, r); err != nil {
		out.Close()
		return err // not committed: the clone never exists
	}
	if err := out.Close(); err != nil {
		return err
	}
	// The bytes read verified against the source; what was written must hash the same.
	w.mu.Lock()
	got := w.objects[name].Hash()
	w.mu.Unlock()
	if want := from.Manifest.Objects[objectIndex(from.Manifest, name)].Hash(); got != want {
		return fmt.Errorf("object %s was written as %s; the source's is %s", name, got, want)
	}
	return nil
}

func objectIndex(m Manifest, name string) int {
	for i, o := range m.Objects {
		if o.Name == name {
			return i
		}
	}
	return -1
}
