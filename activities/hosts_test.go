package activities

import (
	"errors"
	"sync"
	"testing"
	"time"

	"go.temporal.io/sdk/testsuite"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/testkit/testdata"
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

// A hierarchical run of 3 hosts of 2 ranks over TCP: the host ring
// gathers its small all-reduces, around the ring or over skip links, to
// the weights of the run that never gathers, bit for bit, and the links
// are there when the input asks for them. Each host is told what the
// workflow tells it: its own placement, rank 0's, its neighbours' and the
// far ends of its links (spec.RingHosts), nothing more.
func TestHostRingGathersOverSkipLinks(t *testing.T) {
	const hosts, perHost = 3, 2
	hashes := map[string]string{}
	for _, c := range []struct {
		name  string
		small int
		links spec.RingLinks
	}{{"ring", 0, spec.RingOnly}, {"gathered", 4096, spec.RingOnly}, {"gathered over links", 4096, spec.HostSkipLinks}} {
		s := spec.Training{
			Model:      spec.Model{Hidden: []int{32}},
			Dataset:    spec.Dataset{URL: testdata.FashionMNISTSmall()},
			Hyper:      spec.Hyper{Epochs: 1, BatchSize: 16},
			Scaling:    spec.Scaling{Workers: hosts * perHost, WorkersPerHost: perHost, BucketBytes: 4096},
			Checkpoint: spec.Checkpoint{URL: bloburl.FromPath(t.TempDir()) + "?metadata=skip", KeepLast: spec.Int(0)},
		}.WithDefaults()
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
		agents, peers := newAgents(t, hosts)
		core, logs := observer.New(zap.DebugLevel)
		placements := make([]spec.Placement, hosts)
		for i, a := range agents {
			a.Slots = []Slot{{Index: 0}, {Index: 1}}
			a.Transport = collective.TransportTCP
			a.Log = zap.New(core)
			placements[i] = spec.Placement{Rank: i * perHost, Collective: peers[i], Slots: []int{0, 1}}
		}
		var suite testsuite.WorkflowTestSuite
		errs := make([]error, hosts)
		var wg sync.WaitGroup
		for h, a := range agents {
			wg.Go(func() {
				ring, self := spec.RingHosts(placements, h, c.links)
				in := spec.EpochInput{Run: "host-links", Generation: 1, Rank: h * perHost, World: hosts * perHost, Hosts: ring, Host: self,
					Secret: []byte("0123456789abcdef0123456789abcdef"), Spec: s, SmallAllReduceBytes: c.small, GatherLinks: c.links != spec.RingOnly}
				env := suite.NewTestActivityEnvironment()
				env.RegisterActivity(a.RunEpoch)
				_, errs[h] = env.ExecuteActivity(a.RunEpoch, in)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		joins := logs.FilterMessage("joined the gang").All()
		links := 0
		for _, e := range joins {
			if e.ContextMap()["send"] != "tcp" {
				t.Fatalf("%s: a host ring link over %v; want tcp", c.name, e.ContextMap()["send"])
			}
			links += int(e.ContextMap()["skip_links"].(int64))
		}
		if want := map[spec.RingLinks]int{spec.RingOnly: 0, spec.HostSkipLinks: hosts}[c.links]; len(joins) != hosts || links != want {
			t.Fatalf("%s: %d hosts joined the host ring with %d skip links in all; want %d with %d", c.name, len(joins), links, hosts, want)
		}
		hashes[c.name] = finalStateHash(t, s, "host-links")
	}
	for name, h := range hashes {
		if h != hashes["ring"] {
			t.Errorf("%s: weights %s; the ring's %s", name, h, hashes["ring"])
		}
	}
}
