// Package exectrainer owns the exec backend: each rank is the user's own
// training program (for example `python3 train.py --lr 0.001`), started once
// per gang with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, ROLE_*, TORCHELASTIC_*,
// MASTER_ADDR, MASTER_PORT) and CUDA_VISIBLE_DEVICES from the rank's slot, so
// torch.distributed works unchanged, and driven over a local control socket
// (protocol.go) by the Python module in python/durabletrain: epoch by epoch,
// and within an epoch between steps, at steps the gang's workers agree on
// over the gang's collective, so that every rank's program stops, saves and
// resumes at the same step. The checkpoint directory the program reports is
// saved as the checkpoint's objects, and restored into a directory before
// the program starts.
package exectrainer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/durabletrain/durabletrain/checkpoint"
	"github.com/durabletrain/durabletrain/spec"
	"github.com/durabletrain/durabletrain/trainer"
)

// Config is one rank's program.
type Config struct {
	Command []string          // the program and its arguments
	Dir     string            // its working directory; "": its scratch directory (never the worker's own)
	Env     map[string]string // extra environment
	// Environ is the worker's environment the program starts from (the
	// worker's policy decides it); nil: only PATH, HOME and LANG. The
	// worker's own secrets never reach a program unless listed here.
	Environ    []string
	Rank       int
	World      int
	LocalRank  int
	LocalWorld int    // ranks on this host (LOCAL_WORLD_SIZE)
	GroupRank  int    // this host's index in the gang (GROUP_RANK, NODE_RANK)
	GroupWorld int    // hosts in the gang (GROUP_WORLD_SIZE)
	RunID      string // TORCHELASTIC_RUN_ID: the run's name
	Restarts   int    // TORCHELASTIC_RESTART_COUNT: gangs formed before this one
	MasterAddr string // rank 0's host
	MasterPort int    // a free port there, the same for every rank
	Devices    string // CUDA_VISIBLE_DEVICES; "" leaves it unset
	Epochs     int    // the run's epochs, for DURABLETRAIN_EPOCHS
	// Hyper is the run's config (spec.Config.JSON), for DURABLETRAIN_CONFIG:
	// a trial's hyperparameters; "" is "{}".
	Hyper   string
	Scratch string // a directory of the rank's own: control socket, restored and saved checkpoints
	// Saves: this rank's Save is called (rank 0 of a run), so it copies each
	// checkpoint directory the program reports. Other ranks skip the copy,
	// which for a large model is the cost of the checkpoint itself.
	Saves      bool
	PythonPath string // where the durabletrain Python module is; prepended to PYTHONPATH
	Log        *zap.Logger
	// StartTimeout bounds how long the program may take to connect; default 2m.
	StartTimeout time.Duration
	// Comm is the gang's collective, over which the ranks' workers agree
	// where the programs stop (see TrainEpoch); nil: a gang of one.
	Comm trainer.Reducer
	// SyncEvery is about how often, in training time, the gang's programs
	// stop between two steps to agree whether to go on (default 100ms): the
	// most a preempted gang trains on before it stops, and one small
	// all-reduce each time. 1ns: after every step.
	SyncEvery time.Duration
	// VoteTimeout bounds how long a rank waits at a step for the gang's
	// other ranks to reach it (default 10m, or 20 times the slowest stretch
	// between two agreements, if longer): a program whose ranks report at
	// different steps fails instead of waiting forever.
	VoteTimeout time.Duration
	// StallTimeout: a program whose durabletrain helper has sent a
	// keepalive (DURABLETRAIN_KEEPALIVE, a fifth of it) and then sends
	// nothing for this long is hung or stopped: it is killed, and its
	// TrainEpoch fails with a StalledError, so the gang re-forms within
	// seconds instead of waiting, blocked in a collective, for ever
	// (failure.stall_timeout; 0: not watched).
	StallTimeout time.Duration
	// Spare: keep a spare process for this rank, started ahead with the
	// interpreter up and PyTorch imported, so that the rank's next start
	// on this worker (a new gang after a failure) skips both (spare.go;
	// exec.warm_spare). Only for the Python front door's ranks
	// (python -m durabletrain._rank); ignored for other commands.
	Spare bool
}

// Trainer drives one rank's program.
type Trainer struct {
	cfg    Config
	cursor trainer.Cursor

	cmd    *exec.Cmd
	proc   *process // the program's process: cmd, its output and its end
	exited chan struct{}
	conn   net.Conn
	// spareHeld is the key of the spare processes this rank keeps ready
	// (spare.go); "" when it keeps none.
	spareHeld string
	in        *inbox
	tail      *tailBuffer

	// paused: the program waits between two steps for word to go on (it
	// stopped at a step the gang agreed on, and saved there).
	paused bool
	epoch  epochPace

	last     message // the last epoch's report
	savedDir string  // a copy of the last checkpoint directory the program reported
	saved    trainer.Cursor
	skipped  trainer.Cursor // the cursor of an end report with no checkpoint on purpose (no_checkpoint)
	sockDir  string         // a short directory for the control socket, when Scratch is too deep
}

var _ trainer.Trainer = (*Trainer)(nil)

// stateObject lists a saved checkpoint's files and the cursor.
const stateObject = "exec-state.json"

type state struct {
	Cursor trainer.Cursor    `json:"cursor"`
	Files  map[string]string `json:"files"` // relative path -> SHA-256
	// Objects names the object of each file whose path is no object name
	// (checkpoint.ValidObjectName: a space, a letter beyond ASCII, a long
	// name): renamedPrefix and a number. Every other file's is "files/"
	// and its path.
	Objects map[string]string `json:"objects,omitempty"`
}

// renamedPrefix begins the object names of files whose paths are not object names.
const renamedPrefix = "renamed/"

// objectOf is the object that holds the file at relative path rel.
func (st state) objectOf(rel string) string { return cmp.Or(st.Objects[rel], "files/"+rel) }

// New checks the config; the program starts at Init or Restore.
func New(cfg Config) (*Trainer, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("exec trainer: exec.command is empty; want the program and its arguments, e.g. [\"python3\", \"train.py\"]")
	}
	if cfg.Scratch == "" {
		return nil, errors.New("exec trainer: no scratch directory")
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 2 * time.Minute
	}
	if cfg.Comm == nil {
		cfg.Comm = trainer.Local{}
	}
	if cfg.SyncEvery == 0 {
		cfg.SyncEvery = 100 * time.Millisecond
	}
	if cfg.VoteTimeout == 0 {
		cfg.VoteTimeout = 10 * time.Minute
	}
	if err := os.MkdirAll(cfg.Scratch, 0o755); err != nil {
		return nil, err
	}
	return &Trainer{cfg: cfg, tail: &tailBuffer{max: 20}}, nil
}

func (t *Trainer) Cursor() trainer.Cursor { return t.cursor }

// Init starts the program with no checkpoint.
func (t *Trainer) Init(ctx context.Context) error {
	t.cursor = trainer.Cursor{}
	return t.start(ctx, "")
}

// Restore writes the saved files into a fresh directory, verifying each
// against the list saved with them, then starts the program on it. On error
// nothing has started and the trainer is as it was.
func (t *Trainer) Restore(ctx context.Context, from trainer.StateReader) error {
	return t.RestoreParts(ctx, []trainer.StateReader{from})
}

var _ trainer.PartsRestorer = (*Trainer)(nil)

// RestoreParts is Restore from several saved states at once (every rank's
// part of a sharded checkpoint), their files merged into one directory
// (WriteFiles).
func (t *Trainer) RestoreParts(ctx context.Context, parts []trainer.StateReader) error {
	dir, err := os.MkdirTemp(t.cfg.Scratch, "restored-")
	if err != nil {
		return err
	}
	st, err := writeFiles(ctx, parts, dir)
	if err != nil {
		os.RemoveAll(dir)
		return err
	}
	if t.cmd != nil {
		t.stop()
	}
	t.cursor, t.saved, t.savedDir = st.Cursor, st.Cursor, ""
	if len(st.Files) == 0 { // saved before any epoch: a fresh start
		os.RemoveAll(dir)
		return t.start(ctx, "")
	}
	if err := t.start(ctx, dir); err != nil {
		return err
	}
	t.savedDir = dir // what the program resumed from is the state until it reports another
	return nil
}

// WriteFiles writes the checkpoint directory the program reported, from
// one saved state or from several merged (every rank's part of a sharded
// checkpoint: a file two parts hold must have the same contents in both,
// and every part must be of the same epoch and step), into dir, verifying
// each file against its SHA-256. It returns where the state stands.
// starter extract writes a checkpoint's files with it.
func WriteFiles(ctx context.Context, parts []trainer.StateReader, dir string) (trainer.Cursor, error) {
	st, err := writeFiles(ctx, parts, dir)
	return st.Cursor, err
}

func writeFiles(ctx context.Context, parts []trainer.StateReader, dir string) (state, error) {
	if len(parts) == 0 {
		return state{}, errors.New("exec trainer: no state to restore from")
	}
	states := make([]state, len(parts))
	owner := map[string]int{} // relative path -> the first part that holds it
	for i, from := range parts {
		if err := readJSON(ctx, from, stateObject, &states[i]); err != nil {
			if len(parts) > 1 {
				return state{}, fmt.Errorf("exec trainer: part %d: %s: %w", i, stateObject, err)
			}
			return state{}, fmt.Errorf("exec trainer: %s: %w", stateObject, err)
		}
		if states[i].Cursor != states[0].Cursor {
			return state{}, fmt.Errorf("exec trainer: part %d of the checkpoint is of epoch %d step %d and part 0 of epoch %d step %d",
				i, states[i].Cursor.Epoch, states[i].Cursor.Step, states[0].Cursor.Epoch, states[0].Cursor.Step)
		}
		for _, rel := range slices.Sorted(maps.Keys(states[i].Files)) {
			first, ok := owner[rel]
			switch {
			case !ok:
				owner[rel] = i
			case states[first].Files[rel] != states[i].Files[rel]:
				return state{}, trainer.UserError(fmt.Errorf("exec trainer: ranks %d and %d both saved %s, with different contents: in a merged sharded checkpoint "+
					"(checkpoint.merge_shards) each file is one rank's, or the same bytes on every rank that writes it; name each rank's files apart", first, i, rel))
			}
		}
	}
	st := state{Cursor: states[0].Cursor, Files: map[string]string{}}
	for _, rel := range slices.Sorted(maps.Keys(owner)) {
		i := owner[rel]
		st.Files[rel] = states[i].Files[rel]
		if err := restoreFile(ctx, parts[i], states[i].objectOf(rel), rel, states[i].Files[rel], dir); err != nil {
			return state{}, fmt.Errorf("exec trainer: restoring %s: %w", rel, err)
		}
	}
	return st, nil
}

// Evaluate returns what the program reported for the epoch: it evaluates itself.
func (t *Trainer) Evaluate(ctx context.Context) (trainer.EvalMetrics, error) {
	if t.last.Metrics == nil {
		return trainer.EvalMetrics{}, errors.New("exec trainer: no epoch reported yet")
	}
	e := trainer.EvalMetrics{TestLoss: t.last.Metrics[spec.MetricTestLoss], TestAccuracy: t.last.Metrics[spec.MetricTestAccuracy],
		Examples: int(t.last.Metrics["test_examples"])}
	for name, v := range t.last.Metrics {
		if !slices.Contains(spec.Metrics, name) {
			if e.Other == nil {
				e.Other = map[string]float64{}
			}
			e.Other[name] = v
		}
	}
	for _, name := range spec.Metrics {
		if _, ok := t.last.Metrics[name]; !ok {
			e.Absent = append(e.Absent, name)
		}
	}
	return e, nil
}

// checkMetrics refuses a report whose metrics could not travel: a name
// that is not a metric's, or more than spec.MaxOtherMetrics beyond the three.
func checkMetrics(epoch int, metrics map[string]float64) error {
	other := 0
	for _, name := range slices.Sorted(maps.Keys(metrics)) {
		if err := spec.CheckMetricName(fmt.Sprintf("the program's report of epoch %d: a metric", epoch), name); err != nil {
			return trainer.UserError(err)
		}
		if !slices.Contains(spec.Metrics, name) {
			other++
		}
	}
	if other > spec.MaxOtherMetrics {
		return trainer.UserError(fmt.Errorf("the program's report of epoch %d has %d metrics beyond %s; want at most %d",
			epoch, other, strings.Join(spec.Metrics, ", "), spec.MaxOtherMetrics))
	}
	return nil
}

// Save writes the last reported checkpoint directory, file by file, and the
// list of files with their SHA-256 and the cursor.
func (t *Trainer) Save(ctx context.Context, to trainer.StateWriter) error {
	st := state{Cursor: t.saved, Files: map[string]string{}}
	if t.skipped == t.cursor && t.skipped != (trainer.Cursor{}) {
		return trainer.ErrNoCheckpoint
	}
	if t.savedDir != "" && t.saved != t.cursor {
		return trainer.UserError(fmt.Errorf("exec trainer: a checkpoint is due at epoch %d step %d, but the program's latest checkpoint_dir is of epoch %d step %d: "+
			"report a checkpoint_dir with every epoch's report, and pass save= to durabletrain.steps()", t.cursor.Epoch, t.cursor.Step, t.saved.Epoch, t.saved.Step))
	}
	if t.savedDir == "" {
		if !t.cfg.Saves {
			return fmt.Errorf("exec trainer: rank %d was not configured to save (Config.Saves)", t.cfg.Rank)
		}
		if t.cursor != (trainer.Cursor{}) {
			return errors.New("exec trainer: the program has reported no checkpoint_dir to save: call durabletrain.report(metrics, checkpoint_dir=...)")
		}
		return writeState(ctx, to, state{Files: map[string]string{}}) // nothing trained yet
	}
	err := filepath.WalkDir(t.savedDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(t.savedDir, path)
		rel = filepath.ToSlash(rel)
		object := "files/" + rel
		// Checked with the longest prefix a rank's part of a sharded checkpoint adds.
		if !checkpoint.ValidObjectName(checkpoint.ShardPrefix(checkpoint.MaxShardRank) + object) {
			object = fmt.Sprintf("%s%06d", renamedPrefix, len(st.Objects))
			if st.Objects == nil {
				st.Objects = map[string]string{}
			}
			st.Objects[rel] = object
		}
		sum, err := saveFile(ctx, to, path, object)
		st.Files[rel] = sum
		return err
	})
	if err != nil {
		return err
	}
	return writeState(ctx, to, st)
}

// Close asks the program to end, and kills its process group if it does not.
func (t *Trainer) Close() error {
	if t.cmd != nil {
		t.stop()
	}
	if t.spareHeld != "" {
		spares.release(t.spareHeld)
		t.spareHeld = ""
	}
	if t.sockDir != "" {
		os.RemoveAll(t.sockDir)
		t.sockDir = ""
	}
	return nil
}
