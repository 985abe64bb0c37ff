package gpuworker_test

import (
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/durabletrain/durabletrain/activities"
	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/gpuworker"
	"github.com/durabletrain/durabletrain/policy"
	"github.com/durabletrain/durabletrain/spec"

	// The backends and blob drivers your workers offer: a spec's "trainer"
	// and URLs pick among what is imported (blobdrivers registers every
	// scheme a spec accepts; this host reads file:// and s3:// alone).
	_ "github.com/durabletrain/durabletrain/blobdrivers/s3"
	_ "github.com/durabletrain/durabletrain/trainer/native"
	_ "gocloud.dev/blob/fileblob"
)

// Register durabletrain on workers you already run: the workflow on your
// control queue, and the GPU agent's activities where your GPUs are.
func Example_embedding() {
	var c client.Client // your client.Dial(...)
	if c == nil {
		return // (this example only compiles)
	}
	// Where workflows run:
	w := worker.New(c, "my-control-queue", worker.Options{})
	gpuworker.RegisterWorkflows(w, policy.Policy{}) // results.csv only under policy.DefaultStorageRoots

	// On a GPU host: slots, a collective listener, and two workers.
	ln, _ := collective.Listen(":7070", nil)
	found, gpus := gpuworker.DiscoverSlots(1, nil) // NVML's GPUs, or one CPU slot
	defer gpus.Close()
	agent := &activities.Agent{Identity: "gpu-host-1", HostQueue: "durabletrain-gpu@gpu-host-1", Listener: ln,
		Advertise: "gpu-host-1:7070", Slots: found, Devices: gpus,
		// What specs may make this host do: here, also read data from one
		// bucket, and run one Python interpreter for "exec" runs.
		Policy: policy.Policy{Exec: []string{"/usr/bin/python3"},
			StorageRoots: append([]string{"s3://my-bucket?region=us-east-1"}, policy.DefaultStorageRoots...)}}
	tuner, err := gpuworker.HoldTuner(agent)
	if err != nil {
		panic(err)
	}
	slots := worker.New(c, spec.DefaultTaskQueue, worker.Options{Tuner: tuner})
	ranks := worker.New(c, agent.HostQueue, worker.Options{})
	gpuworker.RegisterAgent(slots, ranks, agent)
	// Then w.Start(), slots.Start(), ranks.Start() — or let gpuworker.Run do all of this.
	// Once slots and ranks have stopped, agent.Close() removes the ranks' scratch.
}
