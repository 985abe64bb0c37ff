package spec

// Names shared by the workflows and the activities that serve them.
const (
	WorkflowTraining = "TrainingWorkflow"
	WorkflowTune     = "TuneWorkflow"

	ActivityWriteTuneResults = "WriteTuneResults" // the search's results table as CSV in blob storage
	ActivityWriteTuneRows    = "WriteTuneRows"    // a part of a big search's finished rows, out of its state
	ActivityCloneCheckpoint  = "CloneCheckpoint"  // PBT: a better trial's checkpoint copied, verified, into a run of the exploiting trial's
	SignalTrialReport        = "trial-report"     // a trial (child TrainingWorkflow) -> its search, after every epoch
	QueryResults             = "results"          // the search's TuneResults

	ActivityHoldSlot       = "HoldSlot"       // reserves one GPU slot for a gang and holds it
	ActivityRunEpoch       = "RunEpoch"       // one rank trains one epoch
	ActivitySaveCheckpoint = "SaveCheckpoint" // rank 0 checkpoints its warm replica now
	ActivityReleaseHold    = "ReleaseHold"    // a run -> a host's queue: free its hold now

	SignalSlotGranted = "slot-granted" // HoldSlot -> workflow: where the slot is
	SignalStop        = "stop"         // user -> workflow: finish the epoch, checkpoint, complete
	UpdateStop        = "stop"         // the same as an update, answered with StopResult once the run has ended
	// SignalCheckpointSkipped: rank 0 -> workflow, as soon as a restore passed
	// over damaged checkpoints (CheckpointsSkipped), so the reason is in the
	// run's history even if the epoch then fails.
	SignalCheckpointSkipped = "checkpoint-skipped"
	// SignalGangRestored: rank 0 -> workflow, as soon as a new gang agreed
	// on its state (GangRestored), so where it came from and what it cost
	// are in the run's progress even if the gang breaks before its first
	// epoch ends.
	SignalGangRestored = "gang-restored"
	// SignalStallHeard: a host -> workflow, when a rank of it heard its
	// ring neighbour declare it stalled (StallHeard): it was running and
	// could be reached, so the run may raise its stall timeout's default.
	SignalStallHeard = "stall-heard"
	QueryProgress    = "progress" // the run's Progress

	// Search attributes a run upserts when spec.search_attributes is on.
	SearchAttributeState = "DurabletrainState" // Keyword: forming-gang, training, ...
	SearchAttributeEpoch = "DurabletrainEpoch" // Int: epochs done

	// DefaultControlQueue is the task queue the workflows run on.
	DefaultControlQueue = "durabletrain"
)

// TrialReport is what a trial tells its search after an epoch.
type TrialReport struct {
	WorkflowID string         `json:"workflow_id"`
	Metrics    EpochMetrics   `json:"metrics"`
	Checkpoint *CheckpointRef `json:"checkpoint,omitempty"`
}

// StopResult answers the stop update once the run has ended.
type StopResult struct {
	State  string         `json:"state"` // "stopped", or "completed" if the last epoch ended first
	Epoch  int            `json:"epoch"` // epochs done
	Latest *CheckpointRef `json:"latest_checkpoint,omitempty"`
}

// Placement is where one host of a gang runs, as its hold reports it: the
// ranks Rank to Rank+LocalRanks()-1, one per slot, on one worker process.
type Placement struct {
	Rank       int    `json:"rank"`          // the host's first rank
	Worker     string `json:"worker"`        // the worker's identity
	HostQueue  string `json:"host_queue"`    // a task queue only that worker polls
	Collective string `json:"collective"`    // its collective listener address
	Slot       int    `json:"slot"`          // slot index on that worker (of the first rank)
	GPU        string `json:"gpu,omitempty"` // name and UUID of the first rank's GPU; empty for a CPU slot
	// Slots are the slot indices of the host's ranks, by local rank, when it
	// has more than one (scaling.workers_per_host); else Slot alone.
	Slots []int `json:"slots,omitempty"`
	// PublicKey is the X25519 key the slot's rank authenticates with in the
	// collective; its private half never leaves the worker.
	PublicKey []byte `json:"public_key,omitempty"`
	// Grant, on a worker with a pool key, is its HMAC over the workflow, the
	// collective address and PublicKey: ranks on workers of the same pool
	// refuse a gang with a placement it does not prove (a forged slot-granted).
	Grant []byte `json:"grant,omitempty"`
	// SmallAllReduce says the worker gathers small all-reduces when its
	// gang asks it to (EpochInput.SmallAllReduceBytes): a worker of an
	// earlier release never does, and a gang must agree.
	SmallAllReduce bool `json:"small_all_reduce,omitempty"`
	// GatherLinks says the worker gathers those small all-reduces over
	// links to the ranks 2, 4, 8, ... away as well as the ring when its
	// gang asks it to (EpochInput.GatherLinks).
	GatherLinks bool `json:"gather_links,omitempty"`
	// HostWindows says the worker reduces through host windows when its
	// gang asks it to (EpochInput.HostWindows).
	HostWindows bool `json:"host_windows,omitempty"`
}

// LocalRanks is how many ranks the host runs.
func (p Placement) LocalRanks() int { return max(1, len(p.Slots)) }

// SlotOf is the slot of the host's local rank.
func (p Placement) SlotOf(local int) int {
	if len(p.Slots) == 0 {
		return p.Slot
	}
	return p.Slots[local]
}

// HoldSlotInput asks a GPU agent for one host of a gang: Slots slots on
// the same worker, all or none.
type HoldSlotInput struct {
	WorkflowID string `json:"workflow_id"`
	RunID      string `json:"run_id"`
	Generation int    `json:"generation"`
	Request    int    `json:"request"`         // which of the gang's hosts this is
	Slots      int    `json:"slots,omitempty"` // slots to hold together; 0 is 1
	// Attempt counts the times this request was asked for before (a hold
	// lost before its grant is asked for again); the grant echoes it, so a
	// late grant of a lost hold is not taken for the new one's.
	Attempt int `json:"attempt,omitempty"`
	// KeepFor is how long the hold outlives its run if the run continues
	// as new, waiting for the next run to take it over (the run's
	// scaling.gang_timeout); 0 is a minute. Agents keep it at most 10 minutes.
	KeepFor Duration `json:"keep_for,omitempty"`
	// Handover, set by a run that continued as new, asks the host's worker
	// (on its host queue) for the hold the previous run of the workflow
	// kept for this generation and request, instead of for new slots: the
	// gang, its collective and its warm replicas cross the boundary.
	Handover *Handover `json:"handover,omitempty"`
}

// Handover names the run whose hold the asking run takes over. The worker
// hands it over only to the run that one continued as, as its history says.
type Handover struct {
	PreviousRunID string `json:"previous_run_id"`
}

// ReleaseHoldInput asks a host's worker, on its host queue, to free a hold
// of the asking workflow at once, rather than when the cancellation of the
// HoldSlot activity reaches it with its next heartbeat (up to most of the
// heartbeat timeout later). The hold is freed only if one of RunIDs holds
// it: the asking run, or the run it continued from (a gang that did not
// cross continue-as-new).
type ReleaseHoldInput struct {
	Generation int      `json:"generation"`
	Request    int      `json:"request"`
	RunIDs     []string `json:"run_ids"`
}

// SlotGranted is the signal a held slot sends its workflow.
type SlotGranted struct {
	Generation int       `json:"generation"`
	Request    int       `json:"request"`
	Attempt    int       `json:"attempt,omitempty"` // HoldSlotInput.Attempt
	Placement  Placement `json:"placement"`
	// RunID is the run that asked for the hold (HoldSlotInput.RunID). A
	// reset run receives again the signals of the run it was reset from;
	// their grants name that run, and are not taken for its own holds of
	// the same generation and request. Empty from workers before it.
	RunID string `json:"run_id,omitempty"`
}

// CheckpointRef points at a committed checkpoint; only references travel through Temporal.
type CheckpointRef struct {
	URL   string `json:"url"`
	Run   string `json:"run"`
	ID    string `json:"id"`
	Epoch int    `json:"epoch"` // the cursor it resumes at
	Step  int    `json:"step"`
}

// EpochInput is one host's work for one epoch: its ranks train together
// in one activity. The gang is described by World and Hosts, which hold
// only the placements a host's ranks talk to (rank 0's host and the ring
// neighbours), so the input stays small however many hosts there are.
// Inputs of runs recorded before hosts carry Peers, PublicKeys and Grants
// for every rank instead, and one rank each.
type EpochInput struct {
	Run        string `json:"run"` // checkpoint run name
	Generation int    `json:"generation"`
	Rank       int    `json:"rank"` // the host's first rank
	// World is the gang's ranks, when Hosts describes the gang.
	World int `json:"world,omitempty"`
	// Hosts are the placements of this host, of rank 0's host, of the
	// hosts before and after it in the ring and, with GatherLinks, of the
	// hosts at the far ends of its skip links (RingHosts).
	Hosts []Placement `json:"hosts,omitempty"`
	// Host is the index of this host's placement in Hosts.
	Host  int      `json:"host,omitempty"`
	Peers []string `json:"peers,omitempty"` // collective addresses by rank
	// PublicKeys and Grants come from the ranks' placements, by rank: each
	// rank authenticates its neighbours with them (no secret in history).
	PublicKeys [][]byte `json:"public_keys,omitempty"`
	Grants     [][]byte `json:"grants,omitempty"`
	// Secret is the shared gang secret of runs that began before per-rank keys.
	Secret []byte   `json:"secret,omitempty"`
	Epoch  int      `json:"epoch"`
	Spec   Training `json:"spec"`
	// Restore: where to start if the rank's warm replica is not at (Epoch, 0).
	// Nil with a cold replica means a fresh start (or spec.ResumeFrom).
	Restore *CheckpointRef `json:"restore,omitempty"`
	// Resume: the run has trained before (a gang may have committed a
	// mid-epoch checkpoint the workflow has not heard of): restore the run's
	// latest verified checkpoint if there is one.
	Resume bool `json:"resume,omitempty"`
	// Checkpoint: rank 0 commits a checkpoint after the epoch.
	Checkpoint bool `json:"checkpoint"`
	// Owner, when set, is the workflow that claims Run in the checkpoint
	// store: a run name another workflow owns fails the run (checkpoint.Store.Claim).
	Owner string `json:"owner,omitempty"`
	// Slot is the index, on the rank's worker, of the slot its gang holds
	// (of the first rank: Hosts[Host].Slots has every local rank's).
	Slot int `json:"slot"`
	// BatchSize is the rank's batch: hyper.batch_size, scaled up when the gang
	// runs with fewer ranks than scaling.workers so the global batch stays.
	BatchSize int `json:"batch_size,omitempty"`
	// SmallAllReduceBytes: an all-reduce of at most this many bytes per rank
	// gathers every rank's buffer instead of running the ring (the same sums,
	// in fewer steps: collective.Options.GatherBytes). The run sets it only
	// when every placement of the gang says SmallAllReduce; 0: the ring only.
	SmallAllReduceBytes int `json:"small_all_reduce_bytes,omitempty"`
	// GatherLinks: those small all-reduces gather over links to the ranks
	// (in a hierarchical run, the hosts) 2, 4, 8, ... away as well as the
	// ring, in log2(world) steps instead of world-1
	// (collective.Options.GatherLinks); Hosts then has the placements at
	// the links' far ends. The run sets it only when every placement of
	// the gang says GatherLinks, the ring has 3 members or more, and the
	// placements are on more than one machine (on one, the ring is shared
	// memory all round and a link would be loopback TCP).
	GatherLinks bool `json:"gather_links,omitempty"`
	// HostWindows: the ranks, all on one machine, reduce through windows of
	// shared memory that each maps of every other
	// (collective.Options.HostWindows): two barriers per piece instead of
	// the ring's 2(world-1) steps, the ring's sums bit for bit. The run
	// sets it only when every placement of the gang says HostWindows, the
	// gang runs one rank per slot (not hierarchically), and every
	// placement's collective address is on one machine.
	HostWindows bool `json:"host_windows,omitempty"`
}

// EpochResult is what a rank reports; rank 0's carries the checkpoint.
type EpochResult struct {
	Rank       int            `json:"rank"`
	Metrics    EpochMetrics   `json:"metrics"`
	Checkpoint *CheckpointRef `json:"checkpoint,omitempty"`
	Restored   *RestoreReport `json:"restored,omitempty"`
	// Finished: the rank's program ended its training before this epoch
	// (Metrics.Epoch, untrained), as a Ray-style training function does when
	// it returns: the run ends there, completed, with Epochs set to it.
	Finished bool `json:"finished,omitempty"`
}

// EpochMetrics is one epoch's record in the run's history.
type EpochMetrics struct {
	Epoch            int     `json:"epoch"`
	Steps            int     `json:"steps"`
	TrainLoss        float64 `json:"train_loss"`
	TestLoss         float64 `json:"test_loss"`
	TestAccuracy     float64 `json:"test_accuracy"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	Seconds          float64 `json:"seconds"`
	// Other holds what else the epoch reported, by name (an exec program's
	// report beyond the three above: any metric), at most MaxOtherMetrics.
	Other map[string]float64 `json:"other,omitempty"`
	// Absent names the three above that the epoch did not report (an exec
	// program's own choice): their fields are 0, and Value says so.
	Absent []string `json:"absent,omitempty"`
}

// CheckpointsSkipped is what SignalCheckpointSkipped carries.
type CheckpointsSkipped struct {
	Generation int                 `json:"generation"`
	Epoch      int                 `json:"epoch"` // the cursor restored instead
	Step       int                 `json:"step"`
	Skipped    []SkippedCheckpoint `json:"skipped"`
}

// GangRestored is what SignalGangRestored carries.
type GangRestored struct {
	Generation int           `json:"generation"`
	Epoch      int           `json:"epoch"` // the epoch the gang trains
	Report     RestoreReport `json:"report"`
	// RunID is the run whose gang restored (SlotGranted.RunID says why).
	RunID string `json:"run_id,omitempty"`
}

// StallHeard is what SignalStallHeard carries.
type StallHeard struct {
	RunID      string `json:"run_id"`
	Generation int    `json:"generation"`
	Rank       int    `json:"rank"`     // the rank declared stalled, of the sending host
	Reporter   int    `json:"reporter"` // the rank that declared it, its right neighbour
	// Silence is how long the rank had sent the reporter nothing when the
	// verdict reached it (collective.PeerError.Silence).
	Silence Duration `json:"silence"`
}

// RestoreReport says where a rank's state came from, and which newer
// checkpoints were skipped as corrupt (visible in the workflow's history).
type RestoreReport struct {
	From    CheckpointRef       `json:"from"`
	Skipped []SkippedCheckpoint `json:"skipped,omitempty"`
	// Peer, when set, says the gang took its state from a survivor of the
	// gang before, over its collective, and read nothing from storage
	// (From is then empty).
	Peer *PeerRestore `json:"peer,omitempty"`
	// Bytes is what the reporting rank read from storage to find and load
	// its state: manifests and objects, those of newer checkpoints it passed
	// over as damaged included, and only its own part of a sharded one (0
	// from a peer).
	Bytes int64 `json:"bytes,omitempty"`
	// SurvivorsAt, when a rank of the gang survived the gang before, is
	// the newest position any such rank had reached: the steps from the
	// restored position to it were trained again.
	SurvivorsAt *Position `json:"survivors_at,omitempty"`
}

// Position is a point in training: Step steps of Epoch are done.
type Position struct {
	Epoch int `json:"epoch"`
	Step  int `json:"step"`
}

// Restored is where the state came from: the survivor's position, or the checkpoint's.
func (r RestoreReport) Restored() Position {
	if r.Peer != nil {
		return Position{r.Peer.Epoch, r.Peer.Step}
	}
	return Position{r.From.Epoch, r.From.Step}
}

// PeerRestore is a state a new gang took from a survivor's memory.
type PeerRestore struct {
	Rank  int   `json:"rank"` // the rank of the new gang that held it
	Epoch int   `json:"epoch"`
	Step  int   `json:"step"`
	Bytes int64 `json:"bytes"`
}

type SkippedCheckpoint struct {
	ID     string `json:"id"`
	Reason string `json:"reason"`
}

// SaveCheckpointInput asks rank 0 to checkpoint its warm replica.
type SaveCheckpointInput struct {
	Run        string       `json:"run"`
	Generation int          `json:"generation"`
	Spec       Training     `json:"spec"`
	Metrics    EpochMetrics `json:"metrics"` // the last epoch's, recorded in the manifest for retention
}
