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

// RingHosts are the placements a host's ranks talk to: rank 0's host (the
// rendezvous of exec programs), the host itself, and its neighbours in the
// ring; self is the host's index among them. The list has at most four
// entries however large the gang: an epoch's input does not grow with it.
func RingHosts(gang []Placement, host int) (hosts []Placement, self int) {
	n := len(gang)
	for _, h := range []int{0, (host + n - 1) % n, host, (host + 1) % n} {
		seen := false
		for _, p := range hosts {
			seen = seen || p.Rank == gang[h].Rank
		}
		if !seen {
			hosts = append(hosts, gang[h])
		}
		if h == host {
			for i, p := range hosts {
				if p.Rank == gang[h].Rank {
					self = i
				}
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
	if in.Host < 0 || in.Host >= len(in.Hosts) || len(in.Hosts) > 4 {
		return nil, nil, fmt.Errorf("epoch input: host %d of %d placements; want one of at most 4", in.Host, len(in.Hosts))
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
