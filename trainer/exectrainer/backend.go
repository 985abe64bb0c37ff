package exectrainer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"

	"github.com/durabletrain/durabletrain/internal/netport"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Name is the backend's name in a spec's "trainer".
const Name = spec.TrainerExec

func init() { trainer.Register(Name, trainer.BackendFunc(NewRank)) }

// NewRank is the exec backend: the spec's exec.command as this rank, with
// torchrun's environment. Rank 0 picks a free port on its host for
// torch.distributed's rendezvous and broadcasts it over the gang, so every
// rank starts with the same MASTER_ADDR and MASTER_PORT.
func NewRank(ctx context.Context, r trainer.Rank) (trainer.Trainer, error) {
	x := r.Spec.Exec
	if x == nil {
		return nil, trainer.UserError(errors.New(`exec trainer: the spec has no exec section; want "exec": {"command": [...]}`))
	}
	masterHost, _, _ := net.SplitHostPort(r.Peers[0])
	port := []float32{0}
	if r.Rank == 0 {
		port[0] = float32(RendezvousPort(masterHost))
	}
	if err := r.Comm.Broadcast(ctx, port, 0); err != nil {
		return nil, fmt.Errorf("the gang broke while agreeing on MASTER_PORT: %w", err)
	}
	if port[0] == 0 {
		return nil, fmt.Errorf("rank 0 found no free port for MASTER_PORT on %s", masterHost)
	}
	log := r.Log
	if log != nil {
		log = log.Named("exec")
	}
	local := r.Local
	if local.LocalWorld == 0 { // a caller that does not say: one rank per host, as the addresses tell
		local = spec.LocalPlace{LocalRank: LocalRank(r.Peers, r.Rank), LocalWorld: 1, GroupRank: r.Rank, GroupWorld: len(r.Peers)}
	}
	t, err := New(Config{Command: x.Command, Dir: x.Dir, Env: x.Env, Rank: r.Rank, World: len(r.Peers),
		LocalRank: local.LocalRank, LocalWorld: local.LocalWorld, GroupRank: local.GroupRank, GroupWorld: local.GroupWorld,
		RunID: r.Run, Restarts: max(0, r.Generation-1),
		MasterAddr: masterHost, MasterPort: int(port[0]), Devices: r.Device,
		Epochs: r.Spec.Hyper.Epochs, Hyper: r.Spec.Config.JSON(), Scratch: filepath.Join(r.Scratch, "rank"), PythonPath: r.PythonPath,
		Log: log, Saves: r.Rank == 0 || r.Spec.Checkpoint.Sharded, Environ: r.Environ, Comm: r.Comm,
		StallTimeout: r.Spec.Failure.RingStallTimeout(), Spare: x.WarmSpare})
	if err != nil {
		return nil, trainer.UserError(err)
	}
	return t, nil
}

// RendezvousPort is a port free now on every address of this host, for
// torch.distributed's rendezvous, drawn outside the ephemeral range (see
// netport.Free), or 0.
func RendezvousPort(host string) int { return netport.Free(host) }

// LocalRank is torchrun's LOCAL_RANK: the ranks of the gang on the same host
// as rank, before it.
func LocalRank(peers []string, rank int) int {
	myHost, _, _ := net.SplitHostPort(peers[rank])
	local := 0
	for _, p := range peers[:rank] {
		if h, _, _ := net.SplitHostPort(p); h == myHost {
			local++
		}
	}
	return local
}
