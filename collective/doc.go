// Package collective owns the communication between the ranks of one gang:
// ring all-reduce (reduce-scatter, then all-gather), broadcast and barrier of
// float32 buffers over TCP, and over shared memory between neighbours on one
// host (shmlink.go: the data and its signal both cross the ring; TCP carries
// the keepalives and aborts). Each link cuts the segments it carries into
// chunks of its own length, so that copying, sending and summing overlap:
// Options.ChunkBytes over TCP, the smaller Options.ShmChunkBytes over shared
// memory; a rank forwards a chunk once the receipts that complete it are in,
// whatever lengths its two links use (ops.go, sendItem.after). On a host
// with more ranks than cores, a rank reads its left TCP link outside the Go
// runtime's network poller (fdconn_linux.go), so that each arrival wakes
// one thread, not two. An operation over TCP runs in the caller's goroutine: a small one reads its
// frames and forwards them as they arrive (leftlink.go, serveLeft); a larger one
// runs a progress loop that reads and writes both links without blocking and
// sleeps in poll(2) on both when neither moves (progress.go), as MPI's
// progress engine does. A readLeft goroutine reads between operations
// (keepalives, aborts, silence), and for a larger operation where the
// platform has no progress loop. Where a host's ranks fill its cores and
// both links are shared memory, an all-reduce can also be started
// (StartAllReduce) and moved along by the caller between pieces of its
// own computation (Progress, Wait): no thread beside the caller's
// (driven.go). A small all-reduce (Options.GatherBytes) gathers every
// rank's buffer and sums them in the ring's order; where the gang asks
// (Options.GatherLinks: for rings that are not shared memory all round), it
// gathers over links to the ranks 2, 4, 8, ... away as well as the ring,
// in ceil(log2(world)) steps instead of world-1 (skiplinks.go).
// Where every rank is on one host and the gang asks (Options.HostWindows),
// each rank maps every other's window of shared memory, and AllReduce,
// Broadcast and Barrier read peers' data where it lies, two barriers per
// piece, with the ring's sums bit for bit (windows.go).
//
// A gang is described by a Gang value (run, generation, one listener address
// per rank). Every rank calls Join with the same Gang and its own rank; Join
// dials the rank's right neighbour and accepts its left neighbour through a
// Listener, which a worker process shares between all the ranks it hosts.
// Each connection is authenticated by a mutual HMAC-SHA256 challenge bound to
// the run, the generation, both ranks and the world size, keyed by a per-run
// secret; a connection that fails it is logged and closed, never summed in.
//
// Liveness is part of the protocol: every rank sends keepalive frames to its
// right neighbour while the group lives, so a rank that stops (SIGSTOP, a hung
// process) is told apart from one that is merely slow, within
// Options.StallTimeout. A rank counts silence only while it runs on its
// cores: a deadline that passed while its own process was off them (the
// neighbour's frames waiting unread, or its keepalive timer late) is looked
// at again, not blamed on the neighbour. When any rank detects a failure it
// sends an abort frame naming the culprit in both directions around the ring and closes its
// connections, so every other rank returns a *PeerError naming the same peer
// instead of waiting out a deadline. A failed group stays failed: the caller
// forms a new gang with a new generation.
//
// Every blocking call takes a context; cancelling it aborts the operation and
// the group. The package knows nothing of Temporal.
//
// The files: group.go (Join, Close, the Group), frames.go (the wire frames,
// keepalives, the reverse direction), failure.go (PeerError and how a group
// fails), leftlink.go (the turns at reading the left link), ops.go (the
// operations and their plans), progress.go (the progress loop), driven.go
// (operations the caller drives), shmlink.go and shm_linux.go (shared
// memory), transport.go (choosing it), listener.go and handshake.go
// (accepting and authenticating neighbours), windows.go (host windows).
package collective
