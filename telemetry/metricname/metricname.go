// Package metricname names durabletrain's metrics, for the code that records them
// (workflows, activities, the worker) and the dashboards that chart them.
package metricname

// The names of durabletrain's metrics as recorded through a
// client.MetricsHandler. The Prometheus exporter adds _total to counters and
// _seconds to timers: durabletrain_steps_total, durabletrain_step_latency_seconds.
// deploy/grafana/durabletrain.json charts them.
const (
	// A rank's position and pace (tags: run, rank).
	Epoch            = "durabletrain_epoch"              // gauge: the epoch being trained
	Step             = "durabletrain_step"               // gauge: the step within it
	Steps            = "durabletrain_steps"              // counter: training steps run
	Samples          = "durabletrain_samples"            // counter: training examples seen by this rank
	SamplesPerSecond = "durabletrain_samples_per_second" // gauge: the last epoch's, over all ranks
	StepLatency      = "durabletrain_step_latency"       // timer: one training step, all-reduce included
	// RankHeartbeat is the Unix time of the rank's latest heartbeat on this
	// worker (every few seconds while an epoch runs): time() minus it is how
	// long ago the rank last showed signs of life here.
	RankHeartbeat = "durabletrain_rank_heartbeat_timestamp_seconds"
	// ReportedMetric is every metric an epoch reports (tag name: train_loss,
	// test_loss, test_accuracy, loss for the latest step, and any other).
	ReportedMetric = "durabletrain_metric"

	// The collective (tags: run, rank). Where backward's own thread drives
	// a step's bucket all-reduces (a host whose ranks fill its cores), one
	// latency is recorded per step: the time the rank spent inside the
	// collective for all of them, not the time from a bucket's start.
	AllReduceLatency = "durabletrain_allreduce_latency" // timer
	AllReduceBytes   = "durabletrain_allreduce_bytes"   // counter: bytes of the buffers reduced
	// AllReduceBusBandwidth is NCCL's bus bandwidth of the latest all-reduce
	// of at least 64 KiB: 2(n-1)/n × bytes / seconds.
	AllReduceBusBandwidth = "durabletrain_allreduce_bus_bandwidth_bytes_per_second"

	// Checkpoints (tags: run, op save or restore).
	CheckpointBytes   = "durabletrain_checkpoint_bytes"   // counter
	CheckpointLatency = "durabletrain_checkpoint_latency" // timer

	// The run, from its workflow (the SDK's workflow tags).
	GangFormationLatency = "durabletrain_gang_formation_latency" // timer: from asking for slots to a formed gang
	Failures             = "durabletrain_failures"               // counter (tag kind: the incident kind)
	// StallsTakenBack counts failures a run charged for a stall and took
	// back: the rank declared stalled heard its verdict, silent for a
	// moment only (starved of CPU or paused), and the run raised its ring's
	// stall timeout. Each was counted in Failures (kind failure) when charged.
	StallsTakenBack = "durabletrain_stalls_taken_back" // counter
	Preemptions     = "durabletrain_preemptions"       // counter
	RunsEnded       = "durabletrain_runs_ended"        // counter (tag state: completed, stopped, failed, cancelled)
	// SlotsWanted is the GPU queue's backlog of slot requests no agent has
	// taken (tag task_queue), read from Temporal by the workflow workers.
	SlotsWanted = "durabletrain_slots_wanted"

	// The worker's slots and GPUs (tags: worker; gpu for a GPU's).
	Slots             = "durabletrain_slots" // gauge (tag state: free, held, or withdrawn: its GPU unhealthy)
	GPUUtilization    = "durabletrain_gpu_utilization_percent"
	GPUMemoryUsed     = "durabletrain_gpu_memory_used_bytes"
	GPUMemoryTotal    = "durabletrain_gpu_memory_total_bytes"
	GPUTemperature    = "durabletrain_gpu_temperature_celsius"
	GPUPowerWatts     = "durabletrain_gpu_power_watts"
	WorkerInfo        = "durabletrain_worker_info" // gauge 1 (tags: version, build_id)
	busBandwidthFloor = 64 << 10
)

// BusBandwidthFloor is the smallest all-reduce whose bandwidth is reported:
// below it the latency, not the bandwidth, is what is measured.
const BusBandwidthFloor = busBandwidthFloor

// PerRank are the names recorded per rank (tags run and rank). A worker
// keeps a run's series while the run trains on it and forgets them once
// none was updated for its -metrics-run-retention (package telemetry).
var PerRank = []string{Epoch, Step, Steps, Samples, SamplesPerSecond, StepLatency, RankHeartbeat, ReportedMetric,
	AllReduceLatency, AllReduceBytes, AllReduceBusBandwidth, CheckpointBytes, CheckpointLatency}

// All is every name above, for the checks that dashboards and alerts chart
// only what is recorded.
var All = []string{Epoch, Step, Steps, Samples, SamplesPerSecond, StepLatency, RankHeartbeat, ReportedMetric,
	AllReduceLatency, AllReduceBytes, AllReduceBusBandwidth, CheckpointBytes, CheckpointLatency,
	GangFormationLatency, Failures, StallsTakenBack, Preemptions, RunsEnded, SlotsWanted,
	Slots, GPUUtilization, GPUMemoryUsed, GPUMemoryTotal, GPUTemperature, GPUPowerWatts, WorkerInfo}
