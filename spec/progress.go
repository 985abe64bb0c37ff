package spec

// Run states: Progress.State, the Temporal UI's details, and the
// DurabletrainState search attribute.
const (
	StateFormingGang = "forming-gang"
	StateTraining    = "training"
	StateRecovering  = "recovering"
	// StateCheckpointing: a stopped run's rank 0 saves its final checkpoint.
	StateCheckpointing = "checkpointing"
	StateCompleted     = "completed"
	StateStopped       = "stopped"
	StateFailed        = "failed"
	// StateCancelled: the workflow was cancelled (temporal workflow cancel,
	// or the search it belongs to ended); its checkpoints stay.
	StateCancelled = "cancelled"
)

// Incident kinds: Incident.Kind.
const (
	IncidentFailure           = "failure"            // an infrastructure failure, charged to failure.max_failures
	IncidentPreemption        = "preemption"         // a worker told to stop, charged to failure.max_preemptions
	IncidentGangTimeout       = "gang-timeout"       // not enough slots within scaling.gang_timeout
	IncidentCorruptCheckpoint = "corrupt-checkpoint" // a restore passed over a damaged checkpoint
	IncidentResized           = "resized"            // an elastic gang shrank or grew back
	IncidentForgedGrant       = "forged-grant"       // a rank refused a placement the pool key does not prove; not charged
	IncidentRestored          = "restored"           // a new gang took its state from a survivor or a checkpoint; not charged
	// IncidentFalseStall: a gang broke because its ring declared a rank
	// stalled that then heard the verdict, having been silent briefly (its
	// host starved it of CPU or paused it): not charged, and the run's stall
	// timeout raised (Progress.StallTimeout).
	IncidentFalseStall = "false-stall"
)

// Application error types: what a run's failure policy classifies errors by,
// and what a failed run's error says.
const (
	ErrUser            = "durabletrain.UserError"       // bad spec, missing data, diverged: fail the run
	ErrPreempted       = "durabletrain.Preempted"       // the worker is shutting down: its own budget
	ErrNoSlot          = "durabletrain.NoSlot"          // a worker asked for a slot had none free
	ErrBudgetExhausted = "durabletrain.BudgetExhausted" // more failures or preemptions than the spec allows
	ErrForgedGrant     = "durabletrain.ForgedGrant"     // a placement its worker's pool key does not prove
	ErrPeerFailed      = "durabletrain.PeerFailed"      // another host's rank broke the gang; details: BrokenBy
	// ErrStalledHeard: a rank of this host was declared stalled by another
	// host's, and heard it (details: StallHeard); an infrastructure failure
	// as any other, which the run may take back (IncidentFalseStall).
	ErrStalledHeard = "durabletrain.StalledHeard"
)

// BrokenBy is carried by the epoch error of a host whose ranks ended only
// because another host's rank failed: as the details of an ErrPeerFailed, or
// as the second detail of an ErrPreempted whose worker is not the one
// stopping. Such a host is alive and its hold good, so the run keeps it for
// its next gang instead of letting its slots go and asking again.
type BrokenBy struct {
	Rank   int    `json:"rank"`   // the first rank blamed (another host's); -1 when none is (another worker stopping)
	Reason string `json:"reason"` // what the ranks saw: "stalled", "connection closed", ...
	// Stalled: the rank was declared stalled (it sent nothing, not even a
	// keepalive, for the stall timeout), not found dead or lost.
	Stalled bool `json:"stalled,omitempty"`
}

// Progress is a run as the progress query shows it; it is also the state
// that continue-as-new carries and the workflow's result.
type Progress struct {
	State      string      `json:"state"`
	Run        string      `json:"run"`   // checkpoint run name
	Epoch      int         `json:"epoch"` // epochs done
	Epochs     int         `json:"epochs"`
	Generation int         `json:"generation"` // gangs formed so far
	Workers    int         `json:"workers"`    // ranks asked for (scaling.workers)
	World      int         `json:"world"`      // ranks of the current gang: fewer while degraded (scaling.min_workers)
	Attempts   int         `json:"attempts"`   // epochs started, failed ones included
	Gang       []Placement `json:"gang,omitempty"`
	// Metrics are the newest MaxMetrics epochs' (AddMetrics); every epoch's
	// are in the run's TensorBoard event files (starter plot draws them).
	Metrics []EpochMetrics `json:"metrics,omitempty"`
	// MetricsDropped counts the oldest epochs' metrics let go.
	MetricsDropped int        `json:"metrics_dropped,omitempty"`
	Failures       int        `json:"failures"`
	Preemptions    int        `json:"preemptions"`
	Incidents      []Incident `json:"incidents,omitempty"` // the newest MaxIncidents (AddIncident)
	// IncidentsDropped counts the oldest incidents let go to keep the list bounded.
	IncidentsDropped int            `json:"incidents_dropped,omitempty"`
	Latest           *CheckpointRef `json:"latest_checkpoint,omitempty"`
	Stopping         bool           `json:"stopping,omitempty"`
	// StallTimeout is the ring's stall timeout the run's gangs use where its
	// spec leaves failure.stall_timeout out: the default at first, raised
	// after each stall that proved false (IncidentFalseStall), up to half
	// of failure.heartbeat_timeout. Absent where the spec sets it.
	StallTimeout Duration `json:"stall_timeout,omitempty"`
	// Waiting says what a run that is not training waits for: slots on which
	// task queue, how many granted, until when; a gang that did not form and
	// when the next try is.
	Waiting string `json:"waiting,omitempty"`
	// MLflow is where the run's MLflow logging stands, when its spec names a server.
	MLflow *TrackerProgress `json:"mlflow,omitempty"`
}

// Incident records a failure, a preemption, a gang that did not form, a
// resize, a checkpoint skipped as corrupt, or where a new gang's state came
// from (IncidentRestored: not trouble itself, the cost of the one before).
type Incident struct {
	Generation int    `json:"generation"`
	Epoch      int    `json:"epoch"`
	Kind       string `json:"kind"` // one of the Incident* constants
	Detail     string `json:"detail"`
	// Repeats counts the same incident again, straight after: a gang that
	// keeps not forming is one line, not one per try.
	Repeats int `json:"repeats,omitempty"`
	// Restore is what a "restored" incident's gang restored.
	Restore *RestoreReport `json:"restore,omitempty"`
}

// MaxIncidents bounds Progress.Incidents: the progress query, the result and
// the state carried through continue-as-new stay small however long a run is.
const MaxIncidents = 100

// AddIncident records an incident: one that repeats the last one's kind of
// gang timeout is counted on it, and past MaxIncidents the oldest goes.
func (p *Progress) AddIncident(inc Incident) {
	if n := len(p.Incidents); n > 0 && inc.Kind == IncidentGangTimeout && p.Incidents[n-1].Kind == IncidentGangTimeout {
		last := &p.Incidents[n-1]
		last.Repeats++
		last.Generation, last.Epoch, last.Detail = inc.Generation, inc.Epoch, inc.Detail
		return
	}
	p.Incidents = append(p.Incidents, inc)
	if over := len(p.Incidents) - MaxIncidents; over > 0 {
		p.Incidents = append(p.Incidents[:0:0], p.Incidents[over:]...)
		p.IncidentsDropped += over
	}
}

// MaxMetrics bounds Progress.Metrics, for the same reason as MaxIncidents.
const MaxMetrics = 200

// AddMetrics records an epoch's metrics; past MaxMetrics the oldest go.
func (p *Progress) AddMetrics(m EpochMetrics) {
	p.Metrics = append(p.Metrics, m)
	if over := len(p.Metrics) - MaxMetrics; over > 0 {
		p.Metrics = append(p.Metrics[:0:0], p.Metrics[over:]...)
		p.MetricsDropped += over
	}
}

// LastMetrics is the latest epoch's metrics, if any epoch has finished.
func (p *Progress) LastMetrics() (EpochMetrics, bool) {
	if len(p.Metrics) == 0 {
		return EpochMetrics{}, false
	}
	return p.Metrics[len(p.Metrics)-1], true
}
