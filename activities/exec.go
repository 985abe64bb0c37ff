package activities

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer/exectrainer"
)

var errGangBroken = errors.New("the gang broke while agreeing on MASTER_PORT")

// execTrainer makes a rank of an exec run: rank 0 picks a free port on its
// host for torch.distributed's rendezvous and broadcasts it over the gang, so
// every rank starts with the same MASTER_ADDR and MASTER_PORT.
func (a *Agent) execTrainer(ctx context.Context, rep *replica, in spec.EpochInput) (*exectrainer.Trainer, error) {
	port := []float32{0}
	if in.Rank == 0 {
		host, _, _ := net.SplitHostPort(in.Peers[0])
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			ln, err = net.Listen("tcp", ":0")
		}
		if err == nil {
			port[0] = float32(ln.Addr().(*net.TCPAddr).Port)
			ln.Close()
		}
	}
	if err := rep.group.Broadcast(ctx, port, 0); err != nil {
		return nil, fmt.Errorf("%w: %v", errGangBroken, err)
	}
	if port[0] == 0 {
		return nil, fmt.Errorf("%w: rank 0 found no free port", errGangBroken)
	}
	masterHost, _, _ := net.SplitHostPort(in.Peers[0])
	myHost, _, _ := net.SplitHostPort(in.Peers[in.Rank])
	local := 0 // LOCAL_RANK: ranks of this gang on this host before this one
	for r := range in.Rank {
		if h, _, _ := net.SplitHostPort(in.Peers[r]); h == myHost {
			local++
		}
	}
	device := ""
	for _, s := range a.Slots {
		if s.Index == in.Slot {
			device = s.Device
		}
	}
	scratch, err := os.MkdirTemp("", fmt.Sprintf("durabletrain-%s-g%d-r%d-", in.Run, in.Generation, in.Rank))
	if err != nil {
		return nil, err
	}
	rep.scratch = scratch
	x := in.Spec.Exec
	return exectrainer.New(exectrainer.Config{Command: x.Command, Dir: x.Dir, Env: x.Env, Rank: in.Rank, World: len(in.Peers),
		LocalRank: local, MasterAddr: masterHost, MasterPort: int(port[0]), Devices: device, Epochs: in.Spec.Hyper.Epochs,
		Scratch: filepath.Join(scratch, "rank"), PythonPath: a.PythonPath, Log: a.Log.Named("exec"), Saves: in.Rank == 0})
}
