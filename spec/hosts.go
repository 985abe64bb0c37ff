package spec

import "fmt"

// LocalPlace is where a rank sits among the hosts of its gang, in torchrun's
// terms: LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and GROUP_WORLD_SIZE.
type LocalPlace struct {
	LocalRank  int
	LocalWorld int
	GroupRank  int
	GroupWorld int
}

// RingLinks says which ranks a host's ranks connect to beyond their ring
// neighbours, and so which placements its epoch input carries.
type RingLinks int

const (
	// RingOnly: the neighbours in the ring.
	RingOnly RingLinks = iota
	// RankSkipLinks: a ring of ranks whose small all-reduces gather over
	// links to the ranks 2, 4, 8, ... away on both sides (EpochInput.GatherLinks).
	RankSkipLinks
	// HostSkipLinks: a ring of hosts (a hierarchical run) whose small
	// all-reduces gather over links to the hosts 2, 4, 8, ... away.
	HostSkipLinks
)

// MaxRingHosts bounds RingHosts: rank 0's host, the host and its two
// neighbours, and for each distance of a skip link (2, 4, ..., 4096 in the
// largest gang) the hosts of the ranks that far away on either side: two
// per side where a host's ranks straddle two hosts there.
const MaxRingHosts = 4 + 4*12

// RingHosts are the placements a host's ranks talk to: rank 0's host (the
// rendezvous of exec programs), the host itself, its neighbours in the
// ring and, with skip links, the hosts at their far ends; self is the
// host's index among them. Without skip links the list has at most four
// entries however large the gang; with them it grows with the log of the
// gang (MaxRingHosts), and the far ends' entries carry what the collective
// needs only (ranks, address, key and grant), so that an epoch's input
// stays small.
func RingHosts(gang []Placement, host int, links RingLinks) (hosts []Placement, self int) {
	n := len(gang)
	add := func(h int, whole bool) {
		for _, p := range hosts {
			if p.Rank == gang[h].Rank {
				return
			}
		}
		p := gang[h]
		if !whole {
			p = Placement{Rank: p.Rank, Collective: p.Collective, Slot: p.Slot, Slots: p.Slots, PublicKey: p.PublicKey, Grant: p.Grant}
		}
		hosts = append(hosts, p)
	}
	for _, h := range []int{0, (host + n - 1) % n, host, (host + 1) % n} {
		add(h, true)
	}
	for i, p := range hosts {
		if p.Rank == gang[host].Rank {
			self = i
		}
	}
	switch links {
	case HostSkipLinks:
		for d := 2; d < n; d *= 2 {
			add((host+d)%n, false)
			add((host-d+n)%n, false)
		}
	case RankSkipLinks:
		// The host's ranks, d away, are per consecutive ranks: on the
		// hosts of the first and the last of them.
		per := gang[host].LocalRanks()
		world := n * per
		for d := 2; d < world; d *= 2 {
			for _, r := range []int{gang[host].Rank, gang[host].Rank + per - 1} {
				add((r+d)%world/per, false)
				add((r-d+world)%world/per, false)
			}
		}
	}
	return hosts, self
}

// RankInputs expands a host's epoch input into one per local rank, each in
// the per-rank form the collective joins with: Peers, PublicKeys and Grants
// indexed by rank, known for the ranks of Hosts and empty for the others
// (a ring needs only its neighbours). The local ranks share those slices:
// they must not be written to. An input of the per-rank form (World 0)
// comes back as it is, as its own host.
func (in EpochInput) RankInputs() ([]EpochInput, []LocalPlace, error) {
	if in.World == 0 {
		return []EpochInput{in}, []LocalPlace{{LocalRank: 0, LocalWorld: 1, GroupRank: in.Rank, GroupWorld: len(in.Peers)}}, nil
	}
	if in.World < 0 || in.World > MaxWorkers {
		return nil, nil, fmt.Errorf("epoch input: world is %d; want 1 to %d ranks", in.World, MaxWorkers)
	}
	if in.Host < 0 || in.Host >= len(in.Hosts) || len(in.Hosts) > MaxRingHosts {
		return nil, nil, fmt.Errorf("epoch input: host %d of %d placements; want one of at most %d", in.Host, len(in.Hosts), MaxRingHosts)
	}
	peers := make([]string, in.World)
	keys := make([][]byte, in.World)
	grants := make([][]byte, in.World)
	for i, p := range in.Hosts {
		n := p.LocalRanks()
		if p.Rank < 0 || n > MaxWorkersPerHost || p.Rank+n > in.World {
			return nil, nil, fmt.Errorf("epoch input: hosts[%d] has ranks %d to %d; want ranks within 0 to %d", i, p.Rank, p.Rank+n-1, in.World-1)
		}
		for r := p.Rank; r < p.Rank+n; r++ {
			peers[r], keys[r], grants[r] = p.Collective, p.PublicKey, p.Grant
		}
	}
	self := in.Hosts[in.Host]
	n := self.LocalRanks()
	for i, p := range in.Hosts {
		if p.LocalRanks() != n {
			return nil, nil, fmt.Errorf("epoch input: hosts[%d] has %d ranks and this host %d; want hosts of equal size", i, p.LocalRanks(), n)
		}
	}
	if in.World%n != 0 || self.Rank%n != 0 {
		return nil, nil, fmt.Errorf("epoch input: this host has %d ranks from rank %d in a world of %d; want hosts of equal size", n, self.Rank, in.World)
	}
	ins := make([]EpochInput, n)
	places := make([]LocalPlace, n)
	for l := range n {
		r := in
		r.Rank, r.Slot = self.Rank+l, self.SlotOf(l)
		r.Peers, r.PublicKeys, r.Grants = peers, keys, grants
		r.World, r.Hosts, r.Host = 0, nil, 0
		ins[l] = r
		places[l] = LocalPlace{LocalRank: l, LocalWorld: n, GroupRank: self.Rank / n, GroupWorld: in.World / n}
	}
	return ins, places, nil
}
