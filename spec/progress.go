package spec

// Run states: Progress.State, the Temporal UI's details, and the
// DurabletrainState search attribute.
const (
	StateFormingGang = "forming-gang"
	StateTraining    = "training"
	StateRecovering  = "recovering"
	StateCompleted   = "completed"
	StateStopped     = "stopped"
	StateFailed      = "failed"
)

// Incident kinds: Incident.Kind.
const (
	IncidentFailure           = "failure"            // an infrastructure failure, charged to failure.max_failures
	IncidentPreemption        = "preemption"         // a worker told to stop, charged to failure.max_preemptions
	IncidentGangTimeout       = "gang-timeout"       // not enough slots within scaling.gang_timeout
	IncidentCorruptCheckpoint = "corrupt-checkpoint" // a restore passed over a damaged checkpoint
	IncidentResized           = "resized"            // an elastic gang shrank or grew back
)

// Application error types: what a run's failure policy classifies errors by,
// and what a failed run's error says.
const (
	ErrUser            = "durabletrain.UserError"       // bad spec, missing data, diverged: fail the run
	ErrPreempted       = "durabletrain.Preempted"       // the worker is shutting down: its own budget
	ErrNoSlot          = "durabletrain.NoSlot"          // a worker asked for a slot had none free
	ErrBudgetExhausted = "durabletrain.BudgetExhausted" // more failures or preemptions than the spec allows
)

// Progress is a run as the progress query shows it; it is also the state
// that continue-as-new carries and the workflow's result.
type Progress struct {
	State       string         `json:"state"`
	Run         string         `json:"run"`   // checkpoint run name
	Epoch       int            `json:"epoch"` // epochs done
	Epochs      int            `json:"epochs"`
	Generation  int            `json:"generation"` // gangs formed so far
	Workers     int            `json:"workers"`    // ranks asked for (scaling.workers)
	World       int            `json:"world"`      // ranks of the current gang: fewer while degraded (scaling.min_workers)
	Attempts    int            `json:"attempts"`   // epochs started, failed ones included
	Gang        []Placement    `json:"gang,omitempty"`
	Metrics     []EpochMetrics `json:"metrics,omitempty"`
	Failures    int            `json:"failures"`
	Preemptions int            `json:"preemptions"`
	Incidents   []Incident     `json:"incidents,omitempty"`
	Latest      *CheckpointRef `json:"latest_checkpoint,omitempty"`
	Stopping    bool           `json:"stopping,omitempty"`
}

// Incident records a failure, a preemption, a gang that did not form, a
// resize, or a checkpoint skipped as corrupt.
type Incident struct {
	Generation int    `json:"generation"`
	Epoch      int    `json:"epoch"`
	Kind       string `json:"kind"` // one of the Incident* constants
	Detail     string `json:"detail"`
}

// LastMetrics is the latest epoch's metrics, if any epoch has finished.
func (p *Progress) LastMetrics() (EpochMetrics, bool) {
	if len(p.Metrics) == 0 {
		return EpochMetrics{}, false
	}
	return p.Metrics[len(p.Metrics)-1], true
}
