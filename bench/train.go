package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/durabletrain/durabletrain/collective"
	"github.com/durabletrain/durabletrain/dataset"
	"github.com/durabletrain/durabletrain/internal/bloburl"
	"github.com/durabletrain/durabletrain/trainer"
	"github.com/durabletrain/durabletrain/trainer/native"
)

type trainFlags struct {
	ranks, epochs, batch, throughputEpochs int
	lr                                     float64
	seed                                   uint64
	data                                   string
	peers                                  bool
	bucketBytes                            int // scaling.bucket_bytes of our ranks; 0: the default
	gomaxprocs                             int // GOMAXPROCS of our rank processes; 0: the runtime's default
	spinWindow                             time.Duration
	progress                               string // collective.Options.Progress of our ranks
	windows                                bool   // collective.Options.HostWindows of our ranks
	scalingRepeats, scalingEpochs          int
}

func benchTrain(args []string) error {
	fs := flag.NewFlagSet("train", flag.ExitOnError)
	var f trainFlags
	fs.IntVar(&f.ranks, "ranks", 2, "ranks of the data-parallel run, one process each")
	fs.IntVar(&f.epochs, "epochs", 10, "epochs of the accuracy run")
	fs.IntVar(&f.batch, "batch", 128, "examples per rank per step")
	fs.Float64Var(&f.lr, "lr", 1e-3, "Adam learning rate")
	fs.Uint64Var(&f.seed, "seed", 0, "seed of weights and shuffle")
	fs.StringVar(&f.data, "data", dataset.DefaultURL, "Fashion-MNIST bucket URL")
	fs.BoolVar(&f.peers, "peers", true, "also run PyTorch (1 process, and DDP over gloo) for the table")
	fs.IntVar(&f.throughputEpochs, "throughput-epochs", 2, "epochs of the 1-rank throughput runs")
	fs.IntVar(&f.bucketBytes, "bucket-bytes", 0, "gradient per all-reduce bucket, overlapped with backward (scaling.bucket_bytes); 0: the default")
	fs.IntVar(&f.gomaxprocs, "gomaxprocs", 2, "GOMAXPROCS of each rank process: the training thread and the one that all-reduces beside it (PyTorch DDP also all-reduces on a thread of its own); 0: the runtime's default")
	fs.DurationVar(&f.spinWindow, "spin-window", 0, "collective.Options.SpinWindow of our ranks: how long a small all-reduce polls before it sleeps; 0: the default, negative: never")
	fs.BoolVar(&f.windows, "windows", false, "collective.Options.HostWindows of our ranks: all-reduce through host windows, as a run's ranks on one machine do (buckets moved by backward's own thread still go around the ring)")
	fs.StringVar(&f.progress, "progress", collective.ProgressAuto, "collective.Options.Progress of our ranks: who moves a step's bucket all-reduces; empty: automatic (backward's own thread where the ranks fill the cores), \"caller\" or \"never\" (a goroutine beside backward)")
	fs.IntVar(&f.scalingRepeats, "scaling-repeats", 3, "rounds of the scaling table (1 rank, 2 ranks overlapped, 2 ranks all-reducing after backward), interleaved; 0: no table")
	fs.IntVar(&f.scalingEpochs, "scaling-epochs", 3, "epochs of each scaling run; the first is a warm-up and not counted")
	fs.Parse(args)
	ctx := context.Background()
	if f.epochs == 0 {
		return trainScaling(ctx, f)
	}

	fmt.Printf("# native trainer (%s), MLP 784-256-128-10, Adam lr %g, batch %d per rank, full Fashion-MNIST\n", native.BLAS(), f.lr, f.batch)
	fmt.Printf("# %d ranks as processes, one BLAS thread each, gradients all-reduced over loopback TCP every step\n\n", f.ranks)
	start := time.Now()
	ours, err := runOurTraining(ctx, f, f.ranks, f.epochs, true)
	if err != nil {
		return err
	}
	wall := time.Since(start)
	last := ours[len(ours)-1]
	fmt.Printf("\nours: test accuracy %.4f after %d epochs, %.0f samples/s over %d ranks, %.1fs wall\n\n",
		num(last, "test_accuracy"), f.epochs, meanOf(ours, "samples_per_second"), f.ranks, wall.Seconds())
	if !f.peers {
		return trainScaling(ctx, f)
	}
	dir, err := peerDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dataDir, err := bloburl.LocalPath("-data", f.data)
	if err != nil {
		return err
	}
	torchDDP, err := runTorchTraining(ctx, dir, dataDir, f, f.ranks, f.epochs)
	if err != nil {
		return fmt.Errorf("pytorch DDP: %w", err)
	}
	ours1, err := runOurTraining(ctx, f, 1, f.throughputEpochs, false)
	if err != nil {
		return err
	}
	torch1, err := runTorchTraining(ctx, dir, dataDir, f, 1, f.throughputEpochs)
	if err != nil {
		return fmt.Errorf("pytorch: %w", err)
	}
	tLast := torchDDP[len(torchDDP)-1]
	ratio := func(a, b float64) string { return fmt.Sprintf("%.2fx", a/b) }
	table([]string{"measure", "ours", "pytorch " + torchVersion(), "ours / pytorch", "target"}, [][]string{
		{fmt.Sprintf("test accuracy, %d epochs, %d ranks", f.epochs, f.ranks), fmt.Sprintf("%.4f", num(last, "test_accuracy")), fmt.Sprintf("%.4f", num(tLast, "test_accuracy")), "", ">= 0.88"},
		{"samples/s, 1 rank, 1 thread", fmt.Sprintf("%.0f", meanOf(ours1, "samples_per_second")), fmt.Sprintf("%.0f", meanOf(torch1, "samples_per_second")),
			ratio(meanOf(ours1, "samples_per_second"), meanOf(torch1, "samples_per_second")), ">= 0.8x"},
		{fmt.Sprintf("samples/s, %d ranks on %d processes (pytorch: DDP, gloo)", f.ranks, f.ranks), fmt.Sprintf("%.0f", meanOf(ours, "samples_per_second")), fmt.Sprintf("%.0f", meanOf(torchDDP, "samples_per_second")),
			ratio(meanOf(ours, "samples_per_second"), meanOf(torchDDP, "samples_per_second")), ">= 1.0x"},
	})
	return trainScaling(ctx, f)
}

func meanOf(rows []map[string]any, key string) float64 {
	var sum float64
	for _, r := range rows {
		sum += num(r, key)
	}
	return sum / float64(max(1, len(rows)))
}

// runOurTraining trains with `ranks` rank processes and returns rank 0's epoch reports.
func runOurTraining(ctx context.Context, f trainFlags, ranks, epochs int, show bool) ([]map[string]any, error) {
	cmds, err := selfRanks(ctx, ranks, func(rank int, peers string) []string {
		return []string{"train-rank", "-rank", strconv.Itoa(rank), "-peers", peers, "-bucket-bytes", strconv.Itoa(f.bucketBytes),
			"-epochs", strconv.Itoa(epochs), "-batch", strconv.Itoa(f.batch), "-lr", fmt.Sprint(f.lr), "-seed", fmt.Sprint(f.seed), "-data", f.data,
			"-spin-window", f.spinWindow.String(), "-progress", f.progress, "-windows=" + strconv.FormatBool(f.windows)}
	})
	if err != nil {
		return nil, err
	}
	for _, c := range cmds {
		c.Env = append(os.Environ(), "OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1")
		if f.gomaxprocs > 0 {
			c.Env = append(c.Env, "GOMAXPROCS="+strconv.Itoa(f.gomaxprocs))
		}
	}
	onText := func(rank int, line string) {
		if show && rank == 0 {
			fmt.Println(line)
		}
	}
	lines, err := runRanks(ctx, cmds, onText)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, l := range lines {
		if num(l, "rank") == 0 {
			out = append(out, l)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("the ranks reported no epoch")
	}
	return out, nil
}

func runTorchTraining(ctx context.Context, dir, dataDir string, f trainFlags, ranks, epochs int) ([]map[string]any, error) {
	port, err := masterPort()
	if err != nil {
		return nil, err
	}
	cmds := make([]*exec.Cmd, ranks)
	for r := range ranks {
		cmds[r] = exec.CommandContext(ctx, "/usr/bin/python3", filepath.Join(dir, "torch_mlp.py"), "--data", dataDir,
			"--epochs", strconv.Itoa(epochs), "--batch", strconv.Itoa(f.batch), "--lr", fmt.Sprint(f.lr), "--seed", fmt.Sprint(f.seed), "--threads", "1")
		cmds[r].Env = append(torchEnv(1), fmt.Sprint("RANK=", r), fmt.Sprint("WORLD_SIZE=", ranks), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
	}
	return runRanks(ctx, cmds, nil)
}

// trainRank is one rank process of `bench train` (and of `make demo`).
func trainRank(args []string) error {
	fs := flag.NewFlagSet("train-rank", flag.ExitOnError)
	rank := fs.Int("rank", 0, "")
	peers := fs.String("peers", "", "")
	epochs := fs.Int("epochs", 10, "")
	batch := fs.Int("batch", 128, "")
	lr := fs.Float64("lr", 1e-3, "")
	seed := fs.Uint64("seed", 0, "")
	data := fs.String("data", dataset.DefaultURL, "")
	bucketBytes := fs.Int("bucket-bytes", 0, "")
	spinWindow := fs.Duration("spin-window", 0, "")
	progress := fs.String("progress", collective.ProgressAuto, "")
	windows := fs.Bool("windows", false, "")
	fs.Parse(args)
	if n := len(strings.Split(*peers, ",")); *rank < 0 || *rank >= n {
		return fmt.Errorf("-rank %d; want 0..%d, one of -peers", *rank, n-1)
	}
	ctx := context.Background()
	train, err := dataset.Load(ctx, *data, dataset.Train)
	if err != nil {
		return err
	}
	test, err := dataset.Load(ctx, *data, dataset.Test)
	if err != nil {
		return err
	}
	addrs := strings.Split(*peers, ",")
	var comm trainer.Reducer = trainer.Local{}
	if len(addrs) > 1 {
		ln, err := collective.Listen(addrs[*rank], nil)
		if err != nil {
			return err
		}
		defer ln.Close()
		jctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		g, err := collective.Join(jctx, ln, collective.Gang{Run: "bench-train", Generation: 1, Peers: addrs}, *rank, collective.Options{Secret: benchSecret, SpinWindow: *spinWindow, Progress: *progress, HostWindows: *windows})
		if err != nil {
			return err
		}
		defer g.Close()
		comm = g
	}
	tr, err := native.New(native.Config{BatchSize: *batch, LR: *lr, Seed: *seed, BucketBytes: *bucketBytes}, train, test, comm)
	if err != nil {
		return err
	}
	if err := tr.Init(ctx); err != nil {
		return err
	}
	for epoch := range *epochs {
		lastShown := time.Now()
		m, err := tr.TrainEpoch(ctx, epoch, trainer.EpochOptions{Progress: func(p trainer.Progress) {
			if *rank == 0 && time.Since(lastShown) > 2*time.Second {
				lastShown = time.Now()
				fmt.Printf("epoch %d/%d  step %d/%d  loss %.4f\n", epoch+1, *epochs, p.Step, p.Steps, p.Loss)
			}
		}})
		if err != nil {
			return err
		}
		e, err := tr.Evaluate(ctx)
		if err != nil {
			return err
		}
		if *rank == 0 {
			fmt.Printf("epoch %d/%d  train loss %.4f  test loss %.4f  test accuracy %.4f  %.0f samples/s\n",
				epoch+1, *epochs, m.TrainLoss, e.TestLoss, e.TestAccuracy, m.SamplesPerSecond)
		}
		line, _ := json.Marshal(map[string]any{"rank": *rank, "epoch": epoch, "train_loss": m.TrainLoss, "test_loss": e.TestLoss,
			"test_accuracy": e.TestAccuracy, "samples_per_second": m.SamplesPerSecond, "seconds": m.Seconds})
		fmt.Println(string(line))
	}
	return nil
}
