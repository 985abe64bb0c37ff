// Command meshexchange is the experiment behind BENCHMARKS.md's "4 ranks over
// TCP: a direct exchange keeps the ring's sums and still loses" (2026-11-28):
// an all-reduce of float32 sums over a full mesh of loopback TCP connections
// that sums every chunk in the ring's order (each rank receives every other
// rank's raw contribution to its chunk, as a ring's reduce-scatter would add
// them, then sends the sum to all), in one progress loop of non-blocking
// reads and writes. Not part of the product: it says how fast an algorithm
// that keeps the ring's sums bit for bit can go with fewer steps than the ring.
//
//	go run ./bench/peers/meshexchange -n 4 -size 1048576 -yield   # prints each rank's µs per operation
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	n := flag.Int("n", 4, "ranks")
	size := flag.Int("size", 1<<20, "bytes per all-reduce")
	iters := flag.Int("iters", 500, "timed operations (a tenth more first, untimed)")
	rank := flag.Int("rank", -1, "this process's rank (unset: start all ranks as child processes)")
	base := flag.Int("base", 41000, "rank r listens on 127.0.0.1:base+r")
	spin := flag.Int("spin", 0, "looks again this many times before sleeping in poll(2)")
	yield := flag.Bool("yield", false, "sched_yield between looks")
	pairwise := flag.Bool("pairwise", false, "exchange with one partner at a time (rank XOR d), as pairwise all-to-all does; n a power of two")
	bigbuf := flag.Int("sockbuf", 0, "SO_SNDBUF and SO_RCVBUF in bytes (0: the kernel's autotuning)")
	flag.Parse()
	if *rank < 0 {
		var cmds []*exec.Cmd
		for r := 0; r < *n; r++ {
			args := append([]string{"-rank", fmt.Sprint(r)}, os.Args[1:]...)
			c := exec.Command(os.Args[0], args...)
			c.Stdout, c.Stderr = os.Stdout, os.Stderr
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			cmds = append(cmds, c)
		}
		failed := false
		for _, c := range cmds {
			failed = c.Wait() != nil || failed
		}
		if failed {
			os.Exit(1)
		}
		return
	}
	run(*n, *rank, *size, *iters, *base, *spin, *yield, *pairwise, *bigbuf)
}

func run(n, r, size, iters, base, spin int, yield, pairwise bool, sockbuf int) {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+r))
	if err != nil {
		panic(err)
	}
	fds := make([]int, n)
	files := make([]*os.File, n) // kept: a collected *os.File closes its descriptor
	accepted := make(chan struct{})
	go func() {
		for i := r + 1; i < n; i++ {
			c, err := ln.Accept()
			if err != nil {
				panic(err)
			}
			var b [1]byte
			c.Read(b[:])
			f, _ := c.(*net.TCPConn).File()
			files[b[0]], fds[b[0]] = f, int(f.Fd())
		}
		close(accepted)
	}()
	for p := 0; p < r; p++ {
		var c net.Conn
		for {
			if c, err = net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(base+p)); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		c.Write([]byte{byte(r)})
		f, _ := c.(*net.TCPConn).File()
		files[p], fds[p] = f, int(f.Fd())
	}
	<-accepted
	for p := range fds {
		if p != r {
			syscall.SetNonblock(fds[p], true)
			syscall.SetsockoptInt(fds[p], syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
			if sockbuf > 0 {
				syscall.SetsockoptInt(fds[p], syscall.SOL_SOCKET, syscall.SO_SNDBUF, sockbuf)
				syscall.SetsockoptInt(fds[p], syscall.SOL_SOCKET, syscall.SO_RCVBUF, sockbuf)
			}
		}
	}
	buf := make([]float32, size/4)
	for i := range buf {
		buf[i] = 1
	}
	C := len(buf) / n
	recv := make([][]float32, n)
	for p := range recv {
		recv[p] = make([]float32, C)
	}
	bytesOf := func(f []float32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), len(f)*4) }
	CB := C * 4
	sOff, rOff := make([]int, n), make([]int, n)
	var pfd []unix.PollFd
	// progress moves every pending send and receipt (sOff, rOff below CB)
	// until none is left.
	progress := func(sendOf, recvOf func(p int) []byte) {
		idle := 0
		for {
			pending, moved := false, false
			for d := 1; d < n; d++ {
				if p := (r + d) % n; sOff[p] < CB {
					k, err := syscall.Write(fds[p], sendOf(p)[sOff[p]:])
					if k > 0 {
						sOff[p] += k
						moved = true
					} else if err != syscall.EAGAIN {
						panic(fmt.Sprintf("writing to rank %d: %v", p, err))
					}
					pending = pending || sOff[p] < CB
				}
				if q := (r - d + n) % n; rOff[q] < CB {
					k, err := syscall.Read(fds[q], recvOf(q)[rOff[q]:])
					if k > 0 {
						rOff[q] += k
						moved = true
					} else if err != syscall.EAGAIN {
						panic(fmt.Sprintf("reading from rank %d: %d, %v", q, k, err))
					}
					pending = pending || rOff[q] < CB
				}
			}
			switch {
			case !pending:
				return
			case moved:
				idle = 0
				continue
			}
			if idle++; idle <= spin {
				if yield {
					syscall.Syscall(syscall.SYS_SCHED_YIELD, 0, 0, 0)
				}
				continue
			}
			pfd = pfd[:0]
			for p := 0; p < n; p++ {
				var ev int16
				if p != r && sOff[p] < CB {
					ev |= unix.POLLOUT
				}
				if p != r && rOff[p] < CB {
					ev |= unix.POLLIN
				}
				if ev != 0 {
					pfd = append(pfd, unix.PollFd{Fd: int32(fds[p]), Events: ev})
				}
			}
			unix.Poll(pfd, -1)
		}
	}
	exchange := func(sendOf, recvOf func(p int) []byte) {
		if !pairwise {
			for p := range sOff {
				sOff[p], rOff[p] = 0, 0
			}
			sOff[r], rOff[r] = CB, CB
			progress(sendOf, recvOf)
			return
		}
		for d := 1; d < n; d++ {
			for p := range sOff {
				sOff[p], rOff[p] = CB, CB
			}
			sOff[r^d], rOff[r^d] = 0, 0
			progress(sendOf, recvOf)
		}
	}
	op := func() {
		// Reduce-scatter: every rank's contribution to chunk r, raw.
		exchange(func(p int) []byte { return bytesOf(buf[p*C : (p+1)*C]) }, func(p int) []byte { return bytesOf(recv[p]) })
		// The ring's order for chunk r: x[r+1] + x[r+2] + ... + x[r-1], then x[r].
		out, acc := buf[r*C:(r+1)*C], recv[r] // recv[r] is free: nothing comes from r itself
		copy(acc, recv[(r+1)%n])
		for d := 2; d < n; d++ {
			x := recv[(r+d)%n]
			for i := range acc {
				acc[i] += x[i]
			}
		}
		for i := range out {
			out[i] = acc[i] + out[i]
		}
		// All-gather: chunk r to everyone, chunk p from p.
		exchange(func(p int) []byte { return bytesOf(buf[r*C : (r+1)*C]) }, func(p int) []byte { return bytesOf(buf[p*C : (p+1)*C]) })
	}
	for range iters/10 + 2 {
		op()
	}
	start := time.Now()
	for range iters {
		op()
	}
	runtime.KeepAlive(files)
	fmt.Printf("rank %d n %d size %d: %.1f us/op\n", r, n, size, float64(time.Since(start).Microseconds())/float64(iters))
}
