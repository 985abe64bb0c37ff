package exectrainer

import "syscall"

// procAttr starts a program in a process group of its own, and has the
// kernel SIGKILL it when the worker dies. (The kernel sends it when the
// thread that started it exits; Go's runtime ends threads only for
// goroutines that exit locked to one, which this package never does.)
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
