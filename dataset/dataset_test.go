package dataset

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"gocloud.dev/blob"

	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/testkit/testdata"
)

func TestLoadCommittedSubset(t *testing.T) {
	ctx := context.Background()
	for split, want := range map[Split]int{Train: 10000, Test: 1000} {
		s, err := Load(ctx, testdata.FashionMNISTSmall(), split)
		if err != nil {
			t.Fatal(err)
		}
		if s.Len() != want || s.Rows != 28 || s.Cols != 28 || len(s.Images) != want*784 {
			t.Fatalf("%s: %d examples of %dx%d, want %d of 28x28", split, s.Len(), s.Rows, s.Cols, want)
		}
		counts := make([]int, Classes)
		for _, l := range s.Labels {
			counts[l]++
		}
		for c, n := range counts {
			if n < want/20 {
				t.Errorf("%s: class %d has only %d examples", split, c, n)
			}
		}
		if lo, hi := slices.Min(s.Images), slices.Max(s.Images); lo != 0 || hi != 1 {
			t.Errorf("%s: pixels span [%v, %v], want [0, 1]", split, lo, hi)
		}
	}
}

func TestLoadFullDataSetWhenInstalled(t *testing.T) {
	if _, err := os.Stat("/usr/share/datasets/fashion-mnist"); err != nil {
		t.Skip("Debian's dataset-fashion-mnist is not installed")
	}
	for split, want := range map[Split]int{Train: 60000, Test: 10000} {
		s, err := Load(context.Background(), DefaultURL, split)
		if err != nil {
			t.Fatal(err)
		}
		if s.Len() != want {
			t.Errorf("%s: %d examples, want %d", split, s.Len(), want)
		}
	}
}

// idxFile builds a gzip IDX file by hand, to corrupt it in controlled ways.
func idxFile(magic uint32, dims []uint32, data []byte) []byte {
	var raw bytes.Buffer
	binary.Write(&raw, binary.BigEndian, magic)
	binary.Write(&raw, binary.BigEndian, dims)
	raw.Write(data)
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	w.Write(raw.Bytes())
	w.Close()
	return z.Bytes()
}

func TestBadFilesAreNamedWithWhatWasExpected(t *testing.T) {
	ctx := context.Background()
	good := map[string][]byte{
		"train-images-idx3-ubyte.gz": idxFile(idxImagesMagic, []uint32{3, 2, 2}, make([]byte, 12)),
		"train-labels-idx1-ubyte.gz": idxFile(idxLabelsMagic, []uint32{3}, []byte{0, 1, 9}),
	}
	for _, tc := range []struct {
		name    string
		file    string
		content []byte // nil removes the file
		want    []string
	}{
		{"valid", "", nil, nil},
		{"missing labels", "train-labels-idx1-ubyte.gz", nil, []string{"train-labels-idx1-ubyte.gz", "not found", "train-images-idx3-ubyte.gz, train-labels"}},
		{"wrong magic", "train-images-idx3-ubyte.gz", idxFile(idxLabelsMagic, []uint32{3, 2, 2}, make([]byte, 12)), []string{"train-images-idx3-ubyte.gz", "magic number 0x00000801", "want 0x00000803"}},
		{"truncated", "train-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{3, 2, 2}, make([]byte, 7)), []string{"truncated: 7 of 12 bytes"}},
		{"trailing data", "train-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{3, 2, 2}, make([]byte, 13)), []string{"more data than"}},
		{"count mismatch", "train-labels-idx1-ubyte.gz", idxFile(idxLabelsMagic, []uint32{2}, []byte{0, 1}), []string{"3 images", "2 labels", "want the same count"}},
		{"label out of range", "train-labels-idx1-ubyte.gz", idxFile(idxLabelsMagic, []uint32{3}, []byte{0, 10, 1}), []string{"label 10 of example 1", "want 0..9"}},
		{"not gzip", "train-images-idx3-ubyte.gz", []byte("hello"), []string{"not a gzip file"}},
		{"dimensions past the bound", "train-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{2_100_000, 2_100_000, 2_100_000}, nil), []string{"more than the 7840000000 values"}},
		{"dimensions whose product wraps to 0", "train-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{1 << 22, 1 << 22, 1 << 20}, nil), []string{"dimensions [4194304 4194304] hold more"}},
		{"dimensions whose product wraps past the bound", "train-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{3, 1 << 22, 1 << 22}, nil), []string{"dimensions [3 4194304 4194304] hold more"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := "mem://"
			b, _ := blob.OpenBucket(ctx, url)
			defer b.Close()
			for name, content := range good {
				if name == tc.file {
					if tc.content == nil {
						continue
					}
					content = tc.content
				}
				b.WriteAll(ctx, name, content, nil)
			}
			s, err := loadFrom(ctx, b, url, Train)
			if tc.want == nil {
				if err != nil || s.Len() != 3 || s.Rows != 2 {
					t.Fatalf("valid files: %v, %+v", err, s)
				}
				return
			}
			if err == nil {
				t.Fatal("loaded a bad data set")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestMissingDefaultSaysHowToInstall(t *testing.T) {
	_, err := Load(context.Background(), "file:///nonexistent/fashion", Train)
	if err == nil || !strings.Contains(err.Error(), "want a bucket holding") {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(installHint(DefaultURL), "apt-get install dataset-fashion-mnist") {
		t.Fatal("the default location's hint does not say how to install the package")
	}
}

func TestWriteThenLoadRoundTrips(t *testing.T) {
	ctx := context.Background()
	src, err := Load(ctx, testdata.FashionMNISTSmall(), Test)
	if err != nil {
		t.Fatal(err)
	}
	// A folder whose name a URL gives meaning to (a space, '#', '?', '%'):
	// its escaped URL reaches that folder, not another.
	dir := filepath.Join(t.TempDir(), "my data #1?v=2 100%")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Write(ctx, bloburl.FromPath(dir)+"?metadata=skip", Test, src.Head(50)); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 {
		t.Fatalf("%s holds %d files; want the split's images and labels", dir, len(entries))
	}
	got, err := Load(ctx, bloburl.FromPath(dir), Test)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Images, src.Images[:50*784]) || !slices.Equal(got.Labels, src.Labels[:50]) {
		t.Fatal("round trip changed the data")
	}
}

func TestPermutationIsDeterministicAndChangesPerEpoch(t *testing.T) {
	a, b := Permutation(1000, 42, 3), Permutation(1000, 42, 3)
	if !slices.Equal(a, b) {
		t.Fatal("same seed and epoch gave different orders")
	}
	if slices.Equal(a, Permutation(1000, 42, 4)) || slices.Equal(a, Permutation(1000, 43, 3)) {
		t.Fatal("another epoch or seed gave the same order")
	}
	sorted := slices.Clone(a)
	slices.Sort(sorted)
	for i, v := range sorted {
		if int(v) != i {
			t.Fatalf("not a permutation: %d at %d", v, i)
		}
	}
	// Pinned: the order must never change across releases, or resumed runs diverge.
	if got := Permutation(10, 1, 0); !slices.Equal(got, pinnedPermutation) {
		t.Fatalf("Permutation(10, 1, 0) = %v; it was %v in every earlier release", got, pinnedPermutation)
	}
}

func TestShardsAreDisjointEqualAndCoverTheEpoch(t *testing.T) {
	for _, n := range []int{12, 1000, 1001, 59999} {
		for _, world := range []int{1, 2, 3, 4, 7} {
			perm := Permutation(n, 7, 1)
			seen := map[int32]bool{}
			for r := range world {
				s := Shard(perm, r, world)
				if len(s) != n/world {
					t.Fatalf("n=%d world=%d rank %d: %d examples, want %d", n, world, r, len(s), n/world)
				}
				for _, i := range s {
					if seen[i] {
						t.Fatalf("n=%d world=%d: example %d in two shards", n, world, i)
					}
					seen[i] = true
				}
			}
			// The union is the permutation minus its remainder (its last n%world examples).
			for _, i := range perm[:world*(n/world)] {
				if !seen[i] {
					t.Fatalf("n=%d world=%d: example %d in no shard", n, world, i)
				}
			}
		}
	}
}

func TestShardBatchesMatchOneRankWithTheGlobalBatch(t *testing.T) {
	perm := Permutation(960, 5, 2)
	const world, batch = 3, 8
	for k := range 960 / (world * batch) {
		global := slices.Clone(perm[k*world*batch : (k+1)*world*batch])
		var union []int32
		for r := range world {
			union = append(union, Shard(perm, r, world)[k*batch:(k+1)*batch]...)
		}
		slices.Sort(global)
		slices.Sort(union)
		if !slices.Equal(global, union) {
			t.Fatalf("batch %d: ranks' batches differ from the single-rank global batch", k)
		}
	}
}

func TestEvalRangesCoverEveryExampleOnce(t *testing.T) {
	for _, world := range []int{1, 2, 3, 7} {
		next := 0
		for r := range world {
			lo, hi := EvalRange(1000, r, world)
			if lo != next {
				t.Fatalf("world %d rank %d starts at %d, want %d", world, r, lo, next)
			}
			next = hi
		}
		if next != 1000 {
			t.Fatalf("world %d covers %d of 1000", world, next)
		}
	}
}

// A URL a spec could not name is refused before any store is opened, with
// what would be accepted: a Go caller gets the rule specs are checked by.
func TestBadURLsAreRefusedAsInSpecs(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	// file://data would write into the working directory: make it dir, so
	// that a regression shows below instead of writing into the package.
	t.Chdir(dir)
	for _, c := range []struct{ url, want string }{
		{"file://data", `"data" reads as a host`},
		{bloburl.FromPath(dir) + "/a#b", "%23"},
		{"s3://user:pw@bucket", "no user or password"},
		{"ftp://host/x", "file://, s3://"},
	} {
		if _, err := Load(ctx, c.url, Train); err == nil || !strings.Contains(err.Error(), "dataset URL") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Load(%s): %v; want the dataset URL refused, saying %q", c.url, err, c.want)
		}
		if err := Write(ctx, c.url, Train, &Set{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Write(%s): %v; want it refused, saying %q", c.url, err, c.want)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("refused writes left %d entries in %s", len(entries), dir)
	}
}

// TestAHeaderClaimingMoreThanItsFileHoldsCostsLittle: a file of a few bytes
// whose header claims the most this reader accepts (7.84 GB) is refused as
// truncated, having allocated about what arrived, not what was claimed: a
// data set's files are anyone's, and the claim alone once allocated it
// (found by FuzzIDXFromAnywhere, whose parallel workers then ran out of
// memory).
func TestAHeaderClaimingMoreThanItsFileHoldsCostsLittle(t *testing.T) {
	ctx := context.Background()
	b, _ := blob.OpenBucket(ctx, "mem://")
	defer b.Close()
	b.WriteAll(ctx, "train-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{10_000_000, 28, 28}, make([]byte, 100)), nil)
	b.WriteAll(ctx, "train-labels-idx1-ubyte.gz", idxFile(idxLabelsMagic, []uint32{10_000_000}, nil), nil)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := loadFrom(ctx, b, "mem://", Train)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "truncated: 100 of 7840000000 bytes") {
		t.Fatalf("got %v; want the images refused as truncated", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 16<<20 {
		t.Fatalf("refusing 100 bytes of data allocated %d MiB", grew>>20)
	}
}

// TestMemoryLimitRefusesALargeDataSetFromItsHeaders: under WithMemoryLimit a
// data set whose examples would not fit is refused, naming its size and the
// limit, before its data is read; LoadIDX counts both splits.
func TestMemoryLimitRefusesALargeDataSetFromItsHeaders(t *testing.T) {
	ctx := context.Background()
	url := bloburl.FromPath(t.TempDir())
	b, err := blob.OpenBucket(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	// 1,000 images of 32x32 in each split: 4,096,000 bytes of float32 pixels
	// and 1,000 of labels per split, the data itself of a few kilobytes.
	for _, prefix := range []string{"train", "t10k"} {
		b.WriteAll(ctx, prefix+"-images-idx3-ubyte.gz", idxFile(idxImagesMagic, []uint32{1000, 32, 32}, make([]byte, 1000*32*32)), nil)
		b.WriteAll(ctx, prefix+"-labels-idx1-ubyte.gz", idxFile(idxLabelsMagic, []uint32{1000}, make([]byte, 1000)), nil)
	}
	const split = 4*1000*32*32 + 1000
	if s, err := Load(WithMemoryLimit(ctx, split), url, Train); err != nil || s.Bytes() != split {
		t.Fatalf("a split that fits its limit exactly: %v", err)
	}
	_, err = Load(WithMemoryLimit(ctx, 3<<20), url, Train)
	if err == nil || !strings.Contains(err.Error(), "train-images-idx3-ubyte.gz") || !strings.Contains(err.Error(), "3 MiB for a data set") {
		t.Fatalf("images past the limit: got %v", err)
	}
	_, err = Load(WithMemoryLimit(ctx, split-1), url, Train)
	if err == nil || !strings.Contains(err.Error(), "train-labels-idx1-ubyte.gz") {
		t.Fatalf("labels one byte past the limit: got %v", err)
	}
	if _, _, err := LoadIDX(WithMemoryLimit(ctx, 2*split), url); err != nil {
		t.Fatalf("two splits that fit their limit exactly: %v", err)
	}
	_, _, err = LoadIDX(WithMemoryLimit(ctx, 2*split-1), url)
	if err == nil || !strings.Contains(err.Error(), "t10k-labels-idx1-ubyte.gz") {
		t.Fatalf("the test split's labels one byte past what the train split left: got %v", err)
	}
	if _, _, err := LoadIDX(ctx, url); err != nil {
		t.Fatalf("no limit: %v", err)
	}
	if MemoryLimit(ctx) != 0 || MemoryLimit(WithMemoryLimit(ctx, -5)) != 0 || MemoryLimit(WithMemoryLimit(ctx, 7)) != 7 {
		t.Fatal("MemoryLimit does not read what WithMemoryLimit set")
	}
}
