package main

import "syscall"

// On Linux the servers the tests start die with the test binary, even when a
// test timeout kills it before any cleanup runs.
func init() {
	childAttr = func() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
}
