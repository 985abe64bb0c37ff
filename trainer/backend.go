package trainer

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/internal/registry"
	"github.com/durabletrain/durabletrain/spec"
)

// Backend builds the Trainer of one rank of a run. A GPU worker looks the
// backend up by the spec's "trainer" name, once per rank per gang, and then
// drives the Trainer it returns. Backends register themselves (see
// Register); native and exec are built in.
type Backend interface {
	NewRank(ctx context.Context, r Rank) (Trainer, error)
}

// BackendFunc is a Backend written as a function.
type BackendFunc func(ctx context.Context, r Rank) (Trainer, error)

// NewRank calls f.
func (f BackendFunc) NewRank(ctx context.Context, r Rank) (Trainer, error) { return f(ctx, r) }

// Rank is what a backend is given to build one rank: the run's spec, the
// rank's place in its gang, the gang's collective, and what the worker offers.
type Rank struct {
	Spec       spec.Training
	Run        string // the run's checkpoint name
	Generation int    // the gang's generation: a new one every time the gang is re-formed
	Rank       int
	// Peers has every rank's collective address, by rank; len(Peers) is the
	// gang's world size. Only rank 0's and those of the rank's own host and
	// its ring neighbours' are known: the others are "".
	Peers []string
	// Local is where the rank sits among the gang's hosts (torchrun's
	// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE).
	Local spec.LocalPlace
	// BatchSize is this rank's batch: hyper.batch_size, scaled up while an
	// elastic gang runs with fewer ranks than scaling.workers.
	BatchSize int
	// Comm is the gang's collective: every rank of the gang must call it in
	// the same order.
	Comm Reducer
	// Device is the CUDA_VISIBLE_DEVICES value of the rank's slot; "" on a CPU slot.
	Device string
	// Scratch is a directory of the rank's own, removed with the rank.
	Scratch string
	// PythonPath is where the worker keeps the durabletrain Python module,
	// for backends that run Python programs.
	PythonPath string
	// Data loads the run's data set (spec.dataset, by its registered format),
	// once per worker however many ranks ask. Backends whose program loads
	// its own data do not call it.
	Data func(ctx context.Context) (train, test *dataset.Set, err error)
	// Environ is the part of the worker's environment a program the
	// backend starts may see (the worker's policy: never its secrets).
	Environ []string
	// MemoryLimit is what the rank's model may take, in bytes (the
	// worker's policy); 0: no limit. A backend that can estimate its need
	// refuses a larger spec as a user error before it allocates.
	MemoryLimit int64
	Log         *zap.Logger
}

// Backends holds trainer backends by name (Register, Lookup, Names).
type Backends struct{ registry.Set[Backend] }

// NewBackends is an empty set of backends.
func NewBackends() *Backends { return &Backends{registry.Set[Backend]{Kind: "trainer backend"}} }

// DefaultBackends is where Register puts backends, and where workers look
// them up unless given a set of their own.
var DefaultBackends = NewBackends()

// Register adds a backend to DefaultBackends, usually from the init function
// of its package, so that importing the package makes it available:
//
//	func init() { trainer.Register("mine", trainer.BackendFunc(newMine)) }
func Register(name string, b Backend) { DefaultBackends.Register(name, b) }

// ErrUser marks errors that running again on a new gang cannot fix: a bad
// configuration, a program that fails by itself, a diverged loss. Test with
// errors.Is; mark with UserError.
var ErrUser = errors.New("user error")

// UserError marks err as the user's to fix (errors.Is(err, ErrUser)); its
// message is err's.
func UserError(err error) error {
	if err == nil {
		return nil
	}
	return userError{err}
}

type userError struct{ err error }

func (e userError) Error() string        { return e.err.Error() }
func (e userError) Unwrap() error        { return e.err }
func (e userError) Is(target error) bool { return target == ErrUser }
