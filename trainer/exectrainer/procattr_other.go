//go:build !linux

package exectrainer

import "syscall"

// procAttr starts a program in a process group of its own.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
