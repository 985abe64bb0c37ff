package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/durabletrain/durabletrain/testkit/faultproxy"
	"github.com/durabletrain/durabletrain/testkit/minio/miniotest"
)

// A real MinIO behind a proxy that can fail (503 SlowDown), hang or cut the
// requests a test picks: the faults of a real object store, on the path a
// worker takes to it.

// faultyS3 is a store on a real MinIO reached through a fault proxy.
func faultyS3(t *testing.T) (*Store, *faultproxy.Proxy) {
	t.Helper()
	p, via := miniotest.StartBehindFaults(t, "..", "faults")
	s, err := Open(context.Background(), via.BucketURL("faults", ""), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, p
}

// keyIs picks the requests for one object key (path-style: /bucket/key),
// with one of the methods given (none: any).
func keyIs(key string, methods ...string) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return strings.TrimPrefix(r.URL.Path, "/faults/") == key && (len(methods) == 0 || slices.Contains(methods, r.Method))
	}
}

func fault(f faultproxy.Fault, match func(*http.Request) bool) faultproxy.Rule {
	return func(r *http.Request) faultproxy.Fault {
		if match(r) {
			return f
		}
		return faultproxy.Pass
	}
}

func everything(*http.Request) bool { return true }

// A store that fails to answer, or answers with an error, says nothing about
// a checkpoint: a restore must not pass over the newest for an older one (or
// start afresh), and retention must not take it for an uncommitted leftover
// and delete it.
func TestAStoreThatFailsIsNotADamagedCheckpoint(t *testing.T) {
	s, p := faultyS3(t)
	ctx := context.Background()
	for e := 1; e <= 3; e++ {
		put(t, s, "r", e, map[string][]byte{"state.bin": []byte(fmt.Sprint("epoch ", e))}, nil)
	}
	newest := "r/" + ID(3, 0) + "/" + ManifestName
	middle := "r/" + ID(2, 0) + "/" + ManifestName
	for _, f := range []struct {
		name  string
		fault faultproxy.Fault
	}{{"503 SlowDown", faultproxy.Fail}, {"a cut connection", faultproxy.Cut}} {
		t.Run(f.name, func(t *testing.T) {
			p.Set(fault(f.fault, keyIs(newest, http.MethodGet, http.MethodHead)))
			loaded := ""
			c, err := s.RestoreLatest(ctx, "r", readState(ctx, &loaded))
			if err == nil || errors.Is(err, ErrNoCheckpoint) {
				t.Fatalf("RestoreLatest with the newest manifest unreadable: %v, %v (loaded %q); want the store's error", c, err, loaded)
			}
			if loaded != "" {
				t.Fatalf("RestoreLatest loaded %s while the newest manifest could not be read", loaded)
			}
			if c, err := s.LatestVerified(ctx, "r"); err == nil || errors.Is(err, ErrNoCheckpoint) {
				t.Fatalf("LatestVerified with the newest manifest unreadable: %v, %v; want the store's error", c, err)
			}
			// Retention with the middle one's manifest unreadable: it is
			// one of the last two, and must not go as a leftover.
			p.Set(fault(f.fault, keyIs(middle, http.MethodGet)))
			deleted, err := s.Prune(ctx, "r", Retention{KeepLast: 2})
			if err == nil || len(deleted) > 0 {
				t.Fatalf("Prune with a manifest unreadable deleted %v (%v); want nothing deleted and the store's error", deleted, err)
			}
			p.Set(nil)
			if ids, _ := s.IDs(ctx, "r"); !slices.Equal(ids, []string{ID(1, 0), ID(2, 0), ID(3, 0)}) {
				t.Fatalf("after the faults, the run has %v", ids)
			}
			if p.Faulted() == 0 {
				t.Fatal("the proxy faulted nothing: the test tested nothing")
			}
		})
	}
	p.Set(nil)
	c, err := s.RestoreLatest(ctx, "r", readState(ctx, nil))
	if err != nil || c.Manifest.ID != ID(3, 0) || len(c.Skipped) > 0 {
		t.Fatalf("with the store well again, RestoreLatest gave %v (%v)", c, err)
	}
	deleted, err := s.Prune(ctx, "r", Retention{KeepLast: 2})
	if err != nil || !slices.Equal(deleted, []string{ID(1, 0)}) {
		t.Fatalf("with the store well again, Prune deleted %v (%v); want epoch 1 only", deleted, err)
	}
}

// A connection cut while an object streams is the store's failure, not a
// short object: the restore fails with it and loads nothing older, and
// nothing is reported skipped.
func TestAConnectionCutMidObjectIsNotACorruptCheckpoint(t *testing.T) {
	s, p := faultyS3(t)
	ctx := context.Background()
	state := bytes.Repeat([]byte("durable"), 3<<20) // 21 MiB: several blocks, each a range read
	put(t, s, "r", 1, map[string][]byte{"state.bin": state}, nil)
	put(t, s, "r", 2, map[string][]byte{"state.bin": state}, nil)
	p.Set(fault(faultproxy.Truncate, keyIs("r/"+ID(2, 0)+"/state.bin", http.MethodGet)))
	loaded := ""
	c, err := s.RestoreLatest(ctx, "r", readState(ctx, &loaded))
	var corrupt *CorruptError
	if err == nil || errors.As(err, &corrupt) || loaded != ID(2, 0) {
		t.Fatalf("RestoreLatest with epoch 2's reads cut halfway: %v, %v (last loaded %s); want the store's error, epoch 2 tried and nothing older", c, err, loaded)
	}
	if _, err := s.LatestVerified(ctx, "r"); err == nil || errors.As(err, &corrupt) || errors.Is(err, ErrNoCheckpoint) {
		t.Fatalf("LatestVerified with epoch 2's reads cut halfway: %v; want the store's error", err)
	}
	t.Logf("cut halfway: %v", err)
	if p.Faulted() == 0 {
		t.Fatal("the proxy cut nothing: the test tested nothing")
	}
	p.Set(nil)
	if c, err := s.LatestVerified(ctx, "r"); err != nil || c.Manifest.ID != ID(2, 0) || len(c.Skipped) > 0 {
		t.Fatalf("with the store well again: %v, %v", c, err)
	}
}

// readState is a RestoreLatest load that reads the checkpoint's state.bin
// to its end (verifying it), noting in loaded, if not nil, the checkpoint
// it tried last.
func readState(ctx context.Context, loaded *string) func(*Checkpoint) error {
	return func(c *Checkpoint) error {
		if loaded != nil {
			*loaded = c.Manifest.ID
		}
		r, err := c.Open(ctx, "state.bin")
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(io.Discard, r)
		return err
	}
}

// A store that stops answering fails the call that waits on it, within the
// stall timeout, with a *StallError: without the watch, a save or a restore
// waited for ever (and the worker's heartbeat hid it from Temporal).
func TestAHungStoreFailsTheCallWithinTheStallTimeout(t *testing.T) {
	s, p := faultyS3(t)
	const stall = 2 * time.Second
	s.SetStallTimeout(stall)
	ctx := context.Background()
	state := bytes.Repeat([]byte("durable"), 3<<20) // 21 MiB: a multipart upload, and several blocks
	put(t, s, "r", 1, map[string][]byte{"state.bin": state}, nil)
	save := func() error {
		w, err := s.Begin(ctx, "r", 2, 0)
		if err != nil {
			return err
		}
		ow, err := w.Create(ctx, "state.bin")
		if err != nil {
			return err
		}
		if _, err := ow.Write(state); err != nil {
			ow.Close()
			w.Abort(ctx)
			return err
		}
		if err := ow.Close(); err != nil {
			w.Abort(ctx)
			return err
		}
		_, err = w.Commit(ctx, Info{WorldSize: 1})
		return err
	}
	restore := func() error {
		_, err := s.RestoreLatest(ctx, "r", readState(ctx, nil))
		return err
	}
	uploads := func(r *http.Request) bool { return r.Method == http.MethodPut || r.Method == http.MethodPost }
	objectReads := func(r *http.Request) bool {
		return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/state.bin")
	}
	listings := func(r *http.Request) bool { return r.Method == http.MethodGet && r.URL.Query().Has("list-type") }
	for _, c := range []struct {
		name string
		hang func(*http.Request) bool
		call func() error
	}{
		{"a save whose uploads hang", uploads, save},
		{"a save whose every request hangs", everything, save},
		{"a restore whose object reads hang", objectReads, restore},
		{"a restore whose manifest reads hang", func(r *http.Request) bool { return strings.HasSuffix(r.URL.Path, "/"+ManifestName) }, restore},
		{"a restore whose listing hangs", listings, restore},
		{"a restore whose every request hangs", everything, restore},
		{"a retention pass whose listing hangs", listings, func() error {
			_, err := s.Prune(ctx, "r", Retention{KeepLast: 1})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p.Set(fault(faultproxy.Hang, c.hang))
			defer p.Set(nil)
			done := make(chan error, 1)
			start := time.Now()
			go func() { done <- c.call() }()
			select {
			case err := <-done:
				var st *StallError
				if !errors.As(err, &st) {
					t.Fatalf("after %v: %v; want a *StallError", time.Since(start).Round(time.Millisecond), err)
				}
				if st.After != stall || !strings.Contains(err.Error(), "hung or unreachable") {
					t.Fatalf("the stall says %q", err)
				}
				t.Logf("failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
			case <-time.After(20 * stall):
				t.Fatalf("still waiting on a hung store after %v (stall timeout %v)", 20*stall, stall)
			}
		})
	}
	// The faults cost nothing that was committed: epoch 1 loads whole.
	c, err := s.LatestVerified(ctx, "r")
	if err != nil || c.Manifest.ID != ID(1, 0) {
		t.Fatalf("after the hangs, the latest verified checkpoint is %v (%v); want epoch 1", c, err)
	}
	if got := readObject(t, c, "state.bin"); !bytes.Equal(got, state) {
		t.Fatalf("epoch 1's state read back as %d bytes, want %d", len(got), len(state))
	}
}

// A slow store is not a hung one: a call that keeps moving bytes, however
// long it takes in all, is not failed by the watch, nor is a writer whose
// caller takes longer than the stall timeout between two writes.
func TestASlowCallerOrAStoreThatMovesIsNotAStall(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, _ string) {
		const stall = 100 * time.Millisecond
		s.SetStallTimeout(stall)
		ctx := context.Background()
		w, err := s.Begin(ctx, "r", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		ow, err := w.Create(ctx, "state.bin")
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := ow.Write([]byte("a piece, then a pause")); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * stall)
		}
		if err := ow.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := w.Commit(ctx, Info{WorldSize: 1}); err != nil {
			t.Fatal(err)
		}
		c, err := s.LatestVerified(ctx, "r")
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.Open(ctx, "state.bin")
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		got, err := io.ReadAll(iotestSlowReader{r, 2 * stall})
		if err != nil || string(got) != strings.Repeat("a piece, then a pause", 3) {
			t.Fatalf("read back %q, %v", got, err)
		}
	})
}

// iotestSlowReader pauses before each read, as a caller busy elsewhere does.
type iotestSlowReader struct {
	r     io.Reader
	pause time.Duration
}

func (s iotestSlowReader) Read(p []byte) (int, error) {
	time.Sleep(s.pause)
	return s.r.Read(p[:min(len(p), 16)])
}
