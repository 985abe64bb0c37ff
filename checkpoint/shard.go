package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
)

// Sharded checkpoints: every rank of a gang writes its own objects (a
// program that holds a part of the state on each rank, as FSDP or ZeRO
// do), and one manifest covers them all. Rank r's objects are named
// shards/<r>/<name>. Each rank writes its part through a ShardWriter,
// which ends with a list of what it wrote; rank 0 then adopts every rank's
// list into its Writer (AdoptShards) and commits. A rank reads its part
// back through Checkpoint.Shard, verified as any object is.

// MaxShardRank is the highest rank whose part a sharded checkpoint holds.
const MaxShardRank = 99999

// MetaShards is the manifest's Meta key that says how a sharded
// checkpoint is restored: ShardsMerged, every rank from every part merged
// into one (checkpoint.merge_shards); absent, each rank from its own part.
const (
	MetaShards   = "shards"
	ShardsMerged = "merged"
)

// ShardPrefix is where rank's objects sit in a sharded checkpoint.
func ShardPrefix(rank int) string { return fmt.Sprintf("shards/%d/", rank) }

func shardListName(rank int) string { return fmt.Sprintf("shards/%d.list", rank) }

// ShardWriter writes one rank's part of a sharded checkpoint.
type ShardWriter struct {
	w    *Writer
	rank int
}

// BeginShard starts rank's part of the checkpoint of run at cursor (epoch,
// step). Like Begin, it uncommits a checkpoint already committed at that
// cursor first: every rank does, before it overwrites anything.
func (s *Store) BeginShard(ctx context.Context, run string, epoch, step, rank int) (*ShardWriter, error) {
	if rank < 0 || rank > MaxShardRank {
		return nil, fmt.Errorf("checkpoint: shard of rank %d; want 0 to %d", rank, MaxShardRank)
	}
	w, err := s.Begin(ctx, run, epoch, step)
	if err != nil {
		return nil, err
	}
	return &ShardWriter{w: w, rank: rank}, nil
}

// Create starts one object of the rank's part, under its own name.
func (sw *ShardWriter) Create(ctx context.Context, name string) (io.WriteCloser, error) {
	return sw.w.Create(ctx, ShardPrefix(sw.rank)+name)
}

// Close writes the list of the rank's objects, once every one is closed:
// rank 0 may then adopt it.
func (sw *ShardWriter) Close(ctx context.Context) error {
	w := sw.w
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.failed != nil:
		return fmt.Errorf("checkpoint: shard %d of %s/%s: %w", sw.rank, w.run, w.id, w.failed)
	case w.open > 0:
		return fmt.Errorf("checkpoint: shard %d of %s/%s: %d objects still open", sw.rank, w.run, w.id, w.open)
	case len(w.objects) == 0:
		return fmt.Errorf("checkpoint: shard %d of %s/%s: no objects were written", sw.rank, w.run, w.id)
	}
	list := make([]Object, 0, len(w.objects))
	for _, o := range w.objects {
		list = append(list, *o)
	}
	data, _ := json.Marshal(list)
	out, err := w.s.newSyncedWriter(ctx, prefix(w.run, w.id)+shardListName(sw.rank), false)
	if err == nil {
		_, err = out.Write(data)
		err = out.Close(err)
	}
	if err != nil {
		return fmt.Errorf("checkpoint: listing shard %d of %s/%s: %w", sw.rank, w.run, w.id, err)
	}
	return nil
}

// Abort removes the rank's part (its objects and its list), for a
// checkpoint that will not be committed; see Writer.Abort.
func (sw *ShardWriter) Abort(ctx context.Context) error {
	return errors.Join(sw.w.Abort(ctx), sw.w.s.deleteKeys(ctx, []string{prefix(sw.w.run, sw.w.id) + shardListName(sw.rank)}))
}

// AdoptShards adds the parts ranks 0 to world-1 wrote at this writer's
// cursor (their lists, and each listed object's size as stored) to what
// Commit covers. A part that is missing, or an object whose stored size
// is not the listed one, fails it: the checkpoint is then never committed.
func (w *Writer) AdoptShards(ctx context.Context, world int) error {
	for r := range world {
		data, err := w.s.bucket.ReadAll(ctx, prefix(w.run, w.id)+shardListName(r), MaxManifestBytes)
		if err != nil {
			return fmt.Errorf("checkpoint: shard %d of %s/%s: %w", r, w.run, w.id, err)
		}
		var list []Object
		if err := json.Unmarshal(data, &list); err != nil || len(list) == 0 {
			return fmt.Errorf("checkpoint: shard %d of %s/%s: its list is unreadable or empty", r, w.run, w.id)
		}
		for _, o := range list {
			if !o.hashIs(w.algo()) {
				return fmt.Errorf("checkpoint: shard %d of %s/%s lists %s without a %s hash: it was written by another version", r, w.run, w.id, o.Name, w.algo())
			}
			if o.lacksMAC(w.algo(), w.s.key) {
				return fmt.Errorf("checkpoint: shard %d of %s/%s lists %s without a MAC: it was written without the pool key", r, w.run, w.id, o.Name)
			}
			if !strings.HasPrefix(o.Name, ShardPrefix(r)) || !ValidObjectName(o.Name) {
				return fmt.Errorf("checkpoint: shard %d of %s/%s lists %q, outside %s", r, w.run, w.id, o.Name, ShardPrefix(r))
			}
			attrs, err := w.s.bucket.Attributes(ctx, prefix(w.run, w.id)+o.Name)
			if err != nil {
				return fmt.Errorf("checkpoint: shard %d of %s/%s: object %s: %w", r, w.run, w.id, o.Name, err)
			}
			if attrs.Size != o.Size {
				return fmt.Errorf("checkpoint: shard %d of %s/%s: object %s is %d bytes, listed as %d", r, w.run, w.id, o.Name, attrs.Size, o.Size)
			}
			w.mu.Lock()
			if _, dup := w.objects[o.Name]; dup {
				w.mu.Unlock()
				return fmt.Errorf("checkpoint: object %q adopted twice", o.Name)
			}
			w.objects[o.Name] = &o
			w.mu.Unlock()
		}
	}
	w.mu.Lock()
	w.shards = world
	w.mu.Unlock()
	return nil
}

// Shard is rank's part of a sharded checkpoint, opened by the names the
// rank wrote (its objects, verified as they are read).
func (c *Checkpoint) Shard(rank int) *ShardReader { return &ShardReader{c: c, rank: rank} }

// ShardReader reads one rank's part of a sharded checkpoint.
type ShardReader struct {
	c    *Checkpoint
	rank int
}

func (r *ShardReader) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	return r.c.Open(ctx, ShardPrefix(r.rank)+name)
}

// Committed opens checkpoint id of run by its manifest alone (checksum,
// signature): its objects are verified as they are read. For reading one
// rank's part of a sharded checkpoint without reading every rank's.
func (s *Store) Committed(ctx context.Context, run, id string) (*Checkpoint, error) {
	if err := checkRun(run); err != nil {
		return nil, err
	}
	read := new(atomic.Int64)
	m, err := s.readManifest(ctx, run, id, read)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s/%s: %w", run, id, err)
	}
	return &Checkpoint{Manifest: m, s: s, read: read}, nil
}
