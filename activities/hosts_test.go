package activities

import (
	"testing"
	"time"
)

// The local ranks of a host share one collective.Host; a rank that joins the
// same generation again (its replica rebuilt) gets a new one, and a host
// whose ranks have all closed leaves the table.
func TestHostTableSharesAHostBetweenItsRanks(t *testing.T) {
	var tab hostTable
	k := hostKey{"wf", 1, 4}
	h0, v0, err := tab.view(k, 0, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	h1, v1, err := tab.view(k, 1, 2, 8)
	if err != nil {
		t.Fatal(err)
	}
	if h0 != h1 || v0.Rank() != 4 || v1.Rank() != 5 || v1.World() != 8 {
		t.Fatalf("ranks 4 and 5 got hosts %p and %p, ranks %d and %d", h0, h1, v0.Rank(), v1.Rank())
	}
	again, va, err := tab.view(k, 0, 2, 8)
	if err != nil || again == h0 {
		t.Fatalf("rank 4 joining again got the host it had already taken its view of (%v)", err)
	}
	if _, _, err := tab.view(hostKey{"wf", 1, 3}, 0, 2, 8); err == nil {
		t.Fatal("a host starting at rank 3 in hosts of 2 was accepted")
	}
	select {
	case <-again.Done():
		t.Fatal("the new host is done while its rank 4 is open")
	default:
	}
	v1.Close() // a rank that closes ends its host
	<-h0.Done()
	if err := v0.AllReduce(t.Context(), []float32{1}); err == nil {
		t.Fatal("rank 4 reduced on a host whose rank 5 had closed")
	}
	va.Close()
	for range 1000 {
		tab.mu.Lock()
		n := len(tab.m)
		tab.mu.Unlock()
		if n == 0 {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("a host whose ranks closed stayed in the table")
}
