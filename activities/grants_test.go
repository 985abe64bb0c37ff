package activities

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.temporal.io/sdk/temporal"

	"github.com/durabletrain/durabletrain/spec"
)

// TestGrantsProveTheirWorkerIsOfThePool: a placement signed with the pool key
// passes; one made up outside the pool (no grant, another key's grant, a
// grant moved to another address or key, or for another workflow) is refused
// as a forged grant that names the rank.
func TestGrantsProveTheirWorkerIsOfThePool(t *testing.T) {
	pool := []byte("pool-key-of-at-least-thirty-two-bytes!!")
	a := &Agent{PoolKey: pool}
	k0, _ := newSlotKey("wf")
	k1, _ := newSlotKey("wf")
	pub0, pub1 := k0.private.PublicKey().Bytes(), k1.private.PublicKey().Bytes()
	valid := func() spec.EpochInput {
		return spec.EpochInput{
			Peers:      []string{"10.0.0.1:7070", "10.0.0.2:7070"},
			PublicKeys: [][]byte{pub0, pub1},
			Grants:     [][]byte{grantMAC(pool, "wf", "10.0.0.1:7070", pub0), grantMAC(pool, "wf", "10.0.0.2:7070", pub1)},
		}
	}
	if err := a.verifyGrants("wf", valid()); err != nil {
		t.Fatalf("the pool's own grants: %v", err)
	}
	for name, forge := range map[string]func(*spec.EpochInput){
		"no grant":       func(in *spec.EpochInput) { in.Grants[1] = nil },
		"grants missing": func(in *spec.EpochInput) { in.Grants = in.Grants[:1] },
		"another pool's key": func(in *spec.EpochInput) {
			in.Grants[1] = grantMAC([]byte("another-pool-key-of-thirty-two-bytes"), "wf", in.Peers[1], pub1)
		},
		"address moved": func(in *spec.EpochInput) { in.Peers[1] = "203.0.113.9:7070" },
		"key replaced":  func(in *spec.EpochInput) { in.PublicKeys[1] = pub0 },
	} {
		in := valid()
		forge(&in)
		err := a.verifyGrants("wf", in)
		var app *temporal.ApplicationError
		if !errors.As(err, &app) || app.Type() != spec.ErrForgedGrant || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("%s: %v; want a %s error naming rank 1", name, err, spec.ErrForgedGrant)
		}
	}
	if err := a.verifyGrants("another-workflow", valid()); err == nil {
		t.Error("grants of one workflow were accepted for another")
	}
	// A worker without a pool key trusts grants, but still wants a key per peer.
	if err := (&Agent{}).verifyGrants("wf", spec.EpochInput{Peers: []string{"a", "b"}, PublicKeys: [][]byte{pub0}}); err == nil {
		t.Error("an input with fewer public keys than peers was accepted")
	}
}

// TestSlotKeysBelongToTheirHold: a slot's key is found only for the workflow
// whose hold made it, and is forgotten when the slot is freed.
func TestSlotKeysBelongToTheirHold(t *testing.T) {
	var st slotTable
	st.init([]Slot{{Index: 0}})
	s, _ := st.take(1)
	k, _ := newSlotKey("wf-a")
	st.setKey(s[0].Index, k)
	if st.key(0, "wf-a") != k || st.key(0, "wf-b") != nil {
		t.Fatal("a slot's key was not bound to its workflow")
	}
	st.free(0)
	if st.key(0, "wf-a") != nil {
		t.Fatal("a freed slot kept its key")
	}
}

// TestDataCacheIsBounded: a worker asked for ever new data sets keeps at most
// two per slot, the most recently used.
func TestDataCacheIsBounded(t *testing.T) {
	var c dataCache
	c.m = map[spec.Dataset]*loadedData{}
	set := func(i int) spec.Dataset { return spec.Dataset{URL: fmt.Sprintf("mem://set-%d", i)} }
	ask := func(i int) {
		if c.m[set(i)] == nil {
			c.m[set(i)] = &loadedData{}
		}
		c.tick++
		c.m[set(i)].used = c.tick
		c.evictLocked(maxCachedDatasets(1))
	}
	ask(0)
	ask(1)
	ask(0) // used again: set-1 is now the least recent
	ask(2)
	if len(c.m) != 2 || c.m[set(0)] == nil || c.m[set(2)] == nil {
		t.Fatalf("cache holds %v; want set-0 and set-2", c.m)
	}
	for i := 3; i < 100; i++ {
		ask(i)
	}
	if len(c.m) != 2 || c.m[set(98)] == nil || c.m[set(99)] == nil {
		t.Fatalf("cache holds %d sets; want the last two", len(c.m))
	}
}

// TestHostHoldsAreAllOrNone: a host's slots are taken together or not at
// all, so two gangs asking for more than a worker has cannot split it.
func TestHostHoldsAreAllOrNone(t *testing.T) {
	var st slotTable
	st.init([]Slot{{Index: 0}, {Index: 1}, {Index: 2}})
	if got, ok := st.take(2); !ok || len(got) != 2 || got[0].Index != 0 || got[1].Index != 1 {
		t.Fatalf("take(2) of 3 free slots = %v, %v; want slots 0 and 1", got, ok)
	}
	if got, ok := st.take(2); ok {
		t.Fatalf("take(2) with 1 slot free = %v; want none taken", got)
	}
	if got, ok := st.take(1); !ok || got[0].Index != 2 {
		t.Fatalf("take(1) after a refused take(2) = %v, %v; want slot 2, still free", got, ok)
	}
}
