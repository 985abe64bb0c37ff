package exectrainer

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/durabletrain/durabletrain/trainer"
)

// savedPart runs a one-rank program that writes files (name -> contents)
// into its checkpoint for epochs epochs, and returns what it saved.
func savedPart(t *testing.T, files map[string]string, epochs int) trainer.MemState {
	t.Helper()
	prog := "import os, durabletrain as dt\nfiles = {"
	for n, v := range files {
		prog += strconv.Quote(n) + ": " + strconv.Quote(v) + ", "
	}
	prog += "}\nfor epoch in dt.epochs():\n" +
		"    for n, v in files.items():\n" +
		"        p = os.path.join('ckpt', n); os.makedirs(os.path.dirname(p), exist_ok=True); open(p, 'w').write(v)\n" +
		"    dt.report({'test_accuracy': 0.5}, checkpoint_dir='ckpt')\n"
	tr := startInline(t, prog, t.TempDir())
	for e := 0; e < epochs; e++ {
		if _, err := tr.TrainEpoch(context.Background(), e, trainer.EpochOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	st := trainer.MemState{}
	if err := tr.Save(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	return st
}

// A merged sharded checkpoint (checkpoint.merge_shards) hands the program
// every part's files in one directory, as torch.distributed.checkpoint
// needs them: rank 0's metadata and every rank's shard, on every rank.
func TestRestorePartsMergesEveryRanksFiles(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	ctx := context.Background()
	p0 := savedPart(t, map[string]string{"ckpt.dcp/.metadata": "meta", "ckpt.dcp/__0_0.distcp": "zero", "same": "s"}, 1)
	p1 := savedPart(t, map[string]string{"ckpt.dcp/__1_0.distcp": "one", "same": "s"}, 1)
	check := "import os, sys, durabletrain as dt\n" +
		"want = {'ckpt.dcp/.metadata': 'meta', 'ckpt.dcp/__0_0.distcp': 'zero', 'ckpt.dcp/__1_0.distcp': 'one', 'same': 's'}\n" +
		"for epoch in dt.epochs():\n" +
		"    d = str(dt.get_checkpoint())\n" +
		"    got = {os.path.relpath(os.path.join(r, f), d): open(os.path.join(r, f)).read() for r, _, fs in os.walk(d) for f in fs}\n" +
		"    if got != want: sys.exit('restored %r; want %r' % (got, want))\n" +
		"    dt.report({'test_accuracy': 1.0}, checkpoint_dir=d)\n"
	py, _ := filepath.Abs("../../python")
	b, err := New(Config{Command: []string{"/usr/bin/python3", "-c", check}, World: 1, Scratch: t.TempDir(), PythonPath: py, Saves: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.RestoreParts(ctx, []trainer.StateReader{p0, p1}); err != nil {
		t.Fatal(err)
	}
	if b.Cursor() != (trainer.Cursor{Epoch: 1}) {
		t.Fatalf("restored at %+v; want epoch 1 step 0", b.Cursor())
	}
	if _, err := b.TrainEpoch(ctx, 1, trainer.EpochOptions{}); err != nil {
		t.Fatalf("the restored program: %v", err)
	}
}

func TestRestorePartsRefusesPartsThatDisagree(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	ctx := context.Background()
	p0 := savedPart(t, map[string]string{"model.pt": "rank 0's"}, 1)
	for _, c := range []struct {
		name  string
		other trainer.MemState
		want  string
		user  bool
	}{
		{"one file name, two contents", savedPart(t, map[string]string{"model.pt": "rank 1's"}, 1),
			"ranks 0 and 1 both saved model.pt, with different contents", true},
		{"two epochs", savedPart(t, map[string]string{"other.pt": "x"}, 2), "part 1 of the checkpoint is of epoch 2 step 0 and part 0 of epoch 1 step 0", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			scratch := t.TempDir()
			b, err := New(Config{Command: []string{"/usr/bin/python3", "-c", "pass"}, World: 1, Scratch: scratch, Saves: true})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			err = b.RestoreParts(ctx, []trainer.StateReader{p0, c.other})
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, trainer.ErrUser) != c.user {
				t.Fatalf("got %v; want an error saying %q (a user error: %v)", err, c.want, c.user)
			}
			if left, _ := filepath.Glob(filepath.Join(scratch, "restored-*")); len(left) != 0 {
				t.Fatalf("a refused restore left %v", left)
			}
		})
	}
}
