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
		hosts, self := RingHosts(hostsOf(c.n, 8), c.host)
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

// A host input that does not add up is refused before any rank starts.
func TestRankInputsRefuseInputsThatDoNotAddUp(t *testing.T) {
	good := func() EpochInput {
		hosts, self := RingHosts(hostsOf(4, 2), 1)
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
		"too many hosts":     func(in *EpochInput) { in.Hosts = append(in.Hosts, in.Hosts...) },
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
