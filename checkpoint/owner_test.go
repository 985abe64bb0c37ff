package checkpoint

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
)

// TestOneOwnerPerRunName: the first claim wins, even among claims made at
// once; the owner may claim again (a new gang of the same run); anyone else
// is refused with the owner named.
func TestOneOwnerPerRunName(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, url string) {
		ctx := context.Background()
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() { errs[i] = s.Claim(ctx, "shared", "wf-"+string(rune('a'+i))) })
		}
		wg.Wait()
		won := -1
		for i, err := range errs {
			if err == nil {
				if won >= 0 {
					t.Fatalf("claims %d and %d both won", won, i)
				}
				won = i
			} else if !errors.Is(err, ErrOwned) {
				t.Fatalf("claim %d: %v", i, err)
			}
		}
		if won < 0 {
			t.Fatal("no claim won")
		}
		owner := "wf-" + string(rune('a'+won))
		if err := s.Claim(ctx, "shared", owner); err != nil {
			t.Fatalf("the owner's second claim: %v", err)
		}
		if err := s.Claim(ctx, "shared", "intruder"); !errors.Is(err, ErrOwned) || !strings.Contains(err.Error(), owner) {
			t.Fatalf("another run's claim: %v; want ErrOwned naming %s", err, owner)
		}
		// The owner record is not a checkpoint.
		put(t, s, "shared", 1, map[string][]byte{"x": []byte("y")}, nil)
		if ids, _ := s.IDs(ctx, "shared"); len(ids) != 1 {
			t.Fatalf("IDs %v", ids)
		}
	})
}

// An owner record planted by whoever can write the bucket, of any size, is
// refused from its size, not read into memory.
func TestAHugeOwnerRecordIsRefusedUnread(t *testing.T) {
	stores(t, func(t *testing.T, s *Store, url string) {
		ctx := context.Background()
		if err := s.bucket.WriteAll(ctx, "r/"+OwnerName, make([]byte, maxOwnerBytes+1), nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Claim(ctx, "r", "wf"); err == nil || !strings.Contains(err.Error(), "at most") {
			t.Fatalf("a claim over a %d-byte owner record: %v; want it refused by its size", maxOwnerBytes+1, err)
		}
	})
}
