package spec

import (
	"strings"
	"testing"
)

func hostsOf(n, perHost int) []Placement {
	gang := make([]Placement, n)
	for i := range gang {
		gang[i] = Placement{Rank: i * perHost, Collective: string(rune('a'+i%26)) + ":1"}
		for l := range perHost {
			if perHost > 1 {
				gang[i].Slots = append(gang[i].Slots, l)
			}
		}
	}
	return gang
}

func TestRingHostsAreRankZeroAndTheNeighbours(t *testing.T) {
	for _, c := range []struct {
		n, host   int
		wantRanks []int
	}{
		{1, 0, []int{0}},
		{2, 1, []int{0, 8}},
		{3, 1, []int{0, 8, 16}},
		{512, 0, []int{0, 4088, 8}},
		{512, 300, []int{0, 2392, 2400, 2408}},
		{512, 511, []int{0, 4080, 4088}},
	} {
		hosts, self := RingHosts(hostsOf(c.n, 8), c.host, RingOnly)
		var ranks []int
		for _, h := range hosts {
			ranks = append(ranks, h.Rank)
		}
		if len(ranks) != len(c.wantRanks) || hosts[self].Rank != c.host*8 {
			t.Fatalf("%d hosts, host %d: placements of ranks %v, self %d; want %v", c.n, c.host, ranks, self, c.wantRanks)
		}
		for i := range ranks {
			if ranks[i] != c.wantRanks[i] {
				t.Fatalf("%d hosts, host %d: placements of ranks %v; want %v", c.n, c.host, ranks, c.wantRanks)
			}
		}
	}
}

// With skip links, a host's input names the hosts at the far ends of its
// ranks' links (ranks, or hosts in a hierarchical run, 2, 4, 8, ... away on
// both sides), so that each rank, expanded, knows every address its links
// need; the list grows with the log of the gang, within MaxRingHosts, and
// the far ends carry only what the collective needs.
func TestRingHostsNameTheFarEndsOfSkipLinks(t *testing.T) {
	for _, c := range []struct{ hosts, perHost int }{{3, 1}, {5, 1}, {8, 1}, {1000, 1}, {3, 2}, {7, 3}, {512, 8}, {128, 64}, {8192, 1}, {1024, 8}} {
		gang := hostsOf(c.hosts, c.perHost)
		for i := range gang {
			gang[i].Worker, gang[i].HostQueue = "w", "q"
		}
		world := c.hosts * c.perHost
		for _, links := range []RingLinks{RankSkipLinks, HostSkipLinks} {
			// every host of small gangs; a few of the large
			for _, host := range []int{0, 1, c.hosts / 2, c.hosts - 1} {
				hosts, self := RingHosts(gang, host, links)
				if len(hosts) > MaxRingHosts || hosts[self].Rank != gang[host].Rank {
					t.Fatalf("%d hosts of %d, host %d: %d placements, self %d", c.hosts, c.perHost, host, len(hosts), self)
				}
				if links == RankSkipLinks && c.perHost > 1 {
					continue // expanded below
				}
				members, member := c.hosts, host
				if links == RankSkipLinks {
					members, member = world, gang[host].Rank
				}
				known := map[int]bool{}
				for i, p := range hosts {
					known[p.Rank] = true
					if i >= 4 && (p.Worker != "" || p.HostQueue != "") {
						t.Fatalf("%d hosts, host %d: the far end %d carries its worker and queue", c.hosts, host, p.Rank)
					}
				}
				for d := 2; d < members; d *= 2 {
					for _, m := range []int{(member + d) % members, (member - d + members) % members} {
						if !known[m*c.perHost] && links == HostSkipLinks || links == RankSkipLinks && !known[m] {
							t.Fatalf("%d hosts of %d, host %d, %v: member %d, %d away, is not named", c.hosts, c.perHost, host, links, m, d)
						}
					}
				}
			}
		}
		if c.perHost == 1 {
			continue
		}
		// A flat ring of hosts of several ranks: every local rank, expanded,
		// knows the addresses of the ranks its links reach.
		for _, host := range []int{0, 1, c.hosts - 1} {
			hosts, self := RingHosts(gang, host, RankSkipLinks)
			ins, _, err := EpochInput{World: world, Hosts: hosts, Host: self}.RankInputs()
			if err != nil {
				t.Fatal(err)
			}
			for _, in := range ins {
				for d := 1; d < world; d *= 2 {
					for _, r := range []int{(in.Rank + d) % world, (in.Rank - d + world) % world} {
						if in.Peers[r] == "" {
							t.Fatalf("%d hosts of %d: rank %d does not know rank %d, %d away", c.hosts, c.perHost, in.Rank, r, d)
						}
					}
				}
			}
		}
	}
}

// A host input that does not add up is refused before any rank starts.
func TestRankInputsRefuseInputsThatDoNotAddUp(t *testing.T) {
	good := func() EpochInput {
		hosts, self := RingHosts(hostsOf(4, 2), 1, RingOnly)
		return EpochInput{World: 8, Hosts: hosts, Host: self}
	}
	if ins, places, err := good().RankInputs(); err != nil || len(ins) != 2 || ins[1].Rank != 3 || places[1].GroupRank != 1 || places[1].GroupWorld != 4 {
		t.Fatalf("a good input: %v, %v, %v", ins, places, err)
	}
	for name, bad := range map[string]func(*EpochInput){
		"negative world":     func(in *EpochInput) { in.World = -1 },
		"huge world":         func(in *EpochInput) { in.World = MaxWorkers + 1 },
		"host out of range":  func(in *EpochInput) { in.Host = 7 },
		"negative host":      func(in *EpochInput) { in.Host = -1 },
		"ranks past world":   func(in *EpochInput) { in.Hosts[0].Rank = 7 },
		"negative rank":      func(in *EpochInput) { in.Hosts[0].Rank = -2 },
		"uneven hosts":       func(in *EpochInput) { in.World = 7 },
		"too many hosts":     func(in *EpochInput) { in.Hosts = append(in.Hosts, make([]Placement, MaxRingHosts)...) },
		"too many local":     func(in *EpochInput) { in.Hosts[in.Host].Slots = make([]int, MaxWorkersPerHost+1) },
		"misaligned host":    func(in *EpochInput) { in.Hosts[in.Host].Rank = 1 },
		"host with no slots": func(in *EpochInput) { in.Hosts[in.Host].Slots = nil; in.Hosts[in.Host].Rank = 3 },
	} {
		in := good()
		bad(&in)
		if _, _, err := in.RankInputs(); err == nil || !strings.Contains(err.Error(), "epoch input") {
			t.Errorf("%s: got %v; want an error naming the epoch input", name, err)
		}
	}
}
