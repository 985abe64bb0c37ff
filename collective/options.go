package collective

import (
	"crypto/ecdh"
	"time"

	"go.uber.org/zap"
)

// Options tune a group. The zero value of each field picks its default.
type Options struct {
	// Identity is this rank's X25519 private key; its public key is
	// Gang.PublicKeys[rank]. Each pair of neighbours then authenticates with a
	// key derived from their Diffie-Hellman secret, so no shared secret needs
	// to travel: the public keys may be read by anyone. Secret is then unused.
	Identity *ecdh.PrivateKey
	// Secret authenticates every connection of the run when there is no
	// Identity; at least 16 bytes, the same on every rank.
	Secret []byte
	// StallTimeout is how long a rank waits without any frame (data or keepalive)
	// from its left neighbour before it declares that neighbour stalled (after
	// between 3/4 and all of it). Default 5s.
	StallTimeout time.Duration
	// KeepaliveInterval is how often an idle rank tells its right neighbour it is alive.
	// Default StallTimeout/5.
	KeepaliveInterval time.Duration
	// ChunkBytes is the pipelining unit over TCP: segments are cut into chunks of this
	// size so that sending, receiving and summing overlap. Default 1 MiB.
	ChunkBytes int
	// ShmChunkBytes is the pipelining unit over shared memory, where each chunk
	// is copied into a slot of the neighbour's ring and summed out of it while the
	// next one is copied in: at most ChunkBytes. Default 128 KiB (measured, 2 ranks
	// on 2 cores: a 16 MiB all-reduce took 1.1 ms in 128 KiB chunks, 2.0 ms in 1 MiB
	// ones; BENCHMARKS.md).
	ShmChunkBytes int
	// ShmRingBytes is what the shared-memory ring this rank offers its left
	// neighbour holds: how far that neighbour may send ahead of this rank's
	// reading, in slots of ShmChunkBytes (at least 4, at most 224). Default
	// 4 MiB (measured with a CPU-bound process per core beside 4 ranks: rings
	// of 4 slots of 128 KiB made 16 and 64 MiB all-reduces about twice as slow
	// as rings of 32; BENCHMARKS.md). `bench allreduce -shm-ring` sweeps it.
	ShmRingBytes int
	// SpinWindow is how long a rank in a small operation (at most SpinMaxBytes)
	// busy-polls for its left neighbour's next frame before it sleeps. Waking a
	// sleeping process costs more than a small step. A larger operation over
	// TCP polls too where every rank on the host has a core, until the system
	// takes the core from the rank for other work (a loaded host), and then
	// sleeps at once for a while (measured, 2 ranks on 2 cores: 1 MiB 11% and
	// 16 MiB 30% faster idle, 18% and 7% loaded; BENCHMARKS.md). Default
	// 200µs; negative never spins.
	SpinWindow time.Duration
	// SpinMaxBytes is the largest operation that spins at any time. Default 256 KiB.
	SpinMaxBytes int
	// GatherBytes enables the small all-reduce: while a rank would receive at
	// most this many bytes by gathering every other rank's whole buffer
	// (bytes × (world-1)), AllReduce gathers them in world-1 ring steps and
	// every rank sums the buffers, instead of the 2(world-1) steps of
	// reduce-scatter and all-gather (MPI's small-message trade). The sums are
	// the ring's, bit for bit: each segment is added in the ring's order.
	// Off by default (0 or negative): every rank must use the same value, and
	// ranks that disagree (a gang with ranks of an earlier release, which
	// never gathers) fail the operation with a protocol error. Gather only
	// small buffers: 4 KiB takes about half the ring's time, 64 KiB with 2
	// ranks several times longer (BENCHMARKS.md).
	GatherBytes int
	// GatherLinks gathers those small all-reduces of 3 ranks or more over
	// links to the ranks 2, 4, 8, ... away as well as the ring, in
	// ceil(log2(world)) steps instead of world-1, with the same sums
	// (skiplinks.go). Join connects those links, and needs the addresses of
	// those ranks in Gang.Peers. Set it where the ring is not shared memory
	// all the way round: a gang over TCP, or spread over hosts; on one host
	// with shared memory a step around the ring costs microseconds and a
	// link is loopback TCP. Every rank must set the same value; Join fails
	// naming a neighbour that differs. Ranks of releases before it never
	// gather over links.
	GatherLinks bool
	// RefusedTimeout is how long the right neighbour's address may refuse
	// connections (nothing listens there) before Join gives up on it with a
	// *PeerError naming it. Zero waits until ctx ends: a listener may still be
	// starting, as a rank process's does. Set it where every peer's listener
	// was up before the gang formed (a worker listens before it grants a
	// slot): there a refusal means the peer's process is gone, and waiting on
	// would leave the gang to find out at a heartbeat timeout.
	RefusedTimeout time.Duration
	// UnreachableTimeout is how long one attempt to connect to the right
	// neighbour's address may go unanswered, neither accepted nor refused
	// (the host is cut off, or gone from the network), or fail as
	// unreachable, before Join gives up on it with a *PeerError naming it.
	// A listener that is up answers within a round trip even when its
	// process is stopped: the kernel completes the connection. Zero waits
	// until ctx ends (the operating system's own retries, about two minutes
	// on Linux). Keep it above the network's worst round trip and a lost
	// SYN's retransmission (1 s on Linux).
	UnreachableTimeout time.Duration
	// Transport is TransportAuto (shared memory with neighbours on the same
	// host, TCP otherwise), TransportTCP or TransportSameIP.
	Transport string
	// HostWindows, where every rank of the gang is on one host (both of
	// every rank's links shared memory), has each rank expose a window of
	// shared memory that every other maps, and runs AllReduce, Broadcast and
	// Barrier through the windows: two barriers per piece instead of the
	// ring's 2(world-1) steps, the same sums bit for bit (windows.go).
	// Measured on 2 cores, 1 MiB, against OpenMPI's shared memory, two
	// sittings: 1.72-1.73x its bus bandwidth with 2 ranks and 1.23-1.44x
	// with 4, where the ring gave 1.40x and 0.82-0.84x (BENCHMARKS.md).
	// Join falls back to the ring, quietly, where any rank cannot map every
	// window (a gang spread over hosts, a full /dev/shm). Every rank must set the same value; Join
	// fails naming a neighbour that differs. Ranks of releases before it
	// never use windows. Operations that StartAllReduce leaves to the
	// caller (CallerDriven) still run around the ring, moved by the
	// caller's own thread: training 2 ranks on 2 cores, buckets so moved
	// gave 90.7% of twice one rank's throughput, through windows (each
	// bucket's all-reduce on a goroutine) 79.6% (BENCHMARKS.md). Every
	// rank must make the same calls, as always: a rank that started an
	// operation where another called AllReduce waits for it.
	HostWindows bool
	// WindowBytes is each half of a rank's window: an all-reduce moves at
	// most this much per rank between two barriers. Default 1 MiB; at least
	// 4 KiB, and the same on every rank (else no windows).
	WindowBytes int
	// WindowMaxBytes is the largest all-reduce or broadcast that goes
	// through the windows; a larger one runs around the ring, after one
	// barrier through the windows that checks every rank began the same
	// operation. Default 4 MiB: beside a CPU-bound process per core the
	// ring was faster from 8 MiB up (BENCHMARKS.md). Every rank must use
	// the same value: where they differ, the operation fails with a
	// protocol error.
	WindowMaxBytes int
	// Progress says who moves an operation started by StartAllReduce:
	// ProgressAuto (default), ProgressCaller or ProgressNever (driven.go).
	Progress string
	// Logger receives one line per connection refused and per group failure,
	// and at debug level one per join (transports, skip links). Default: none.
	Logger *zap.Logger
	// OnFailure, if set, is called once, in a goroutine of its own, with
	// the group's error when the group fails (not when its own rank closes
	// it), whether or not an operation is running: a rank off its cores
	// between operations learns of a failure only when it runs again.
	OnFailure func(error)

	// hostCores is the cores Join counts on this host; 0: runtime.NumCPU().
	// Tests set it to take the paths of a host with more ranks than cores,
	// or fewer, whatever this machine has.
	hostCores int
}

const (
	minSecretLen       = 16
	defaultStall       = 5 * time.Second
	defaultChunkBytes  = 1 << 20
	defaultShmChunk    = 128 << 10
	abortWriteTimeout  = 250 * time.Millisecond
	culpritGracePeriod = 100 * time.Millisecond
)

func (o Options) withDefaults() Options {
	if o.StallTimeout <= 0 {
		o.StallTimeout = defaultStall
	}
	if o.KeepaliveInterval <= 0 {
		o.KeepaliveInterval = o.StallTimeout / 5
	}
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = defaultChunkBytes
	}
	o.ChunkBytes &^= 3 // whole float32s
	if o.ChunkBytes == 0 {
		o.ChunkBytes = 4
	}
	if o.ShmChunkBytes <= 0 {
		o.ShmChunkBytes = defaultShmChunk
	}
	o.ShmChunkBytes = max(4, min(o.ShmChunkBytes&^3, o.ChunkBytes))
	if o.SpinWindow == 0 {
		o.SpinWindow = 200 * time.Microsecond
	}
	if o.SpinMaxBytes == 0 {
		o.SpinMaxBytes = 256 << 10
	}
	if o.WindowBytes <= 0 {
		o.WindowBytes = defaultWindowBytes
	}
	if o.WindowMaxBytes <= 0 {
		o.WindowMaxBytes = defaultWindowMaxBytes
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}
