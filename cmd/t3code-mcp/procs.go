package main

import (
	"runtime"
	"strconv"
)

// spareProcs is how many Go processors `serve` runs with beyond the runtime's default (the
// cores it may use). Why: the connector's work is short bursts on many sockets (the machines'
// streams, the webhook's answers, MCP requests). With as many Ps as cores, at the moments every P
// is running a goroutine nobody waits in the network poller, so a socket that became readable is
// seen only when a P runs out of work or by sysmon after up to ~10 ms, and the goroutine it
// readies then queues behind the burst (traced per wake-up: docs/benchmarks.md, "Wake: what a
// wake's p99 is made of"). A spare P is idle at those moments: its thread blocks in the poller
// and the kernel wakes it when bytes arrive, so the readied goroutine runs on a thread the OS
// schedules like any other. Measured in two quiet windows at 1,000 transitions/s, default against
// +2 (docs/benchmarks.md, "Late-morning quiet window"): wake p99 15.6-21.0 ms in all seven runs
// with spare Ps against 23.4-34.5 in all thirteen without, the same CPU; the event p99 moved
// within its spread (40-87 against 50-87 ms). GOMAXPROCS in the environment wins.
const spareProcs = 2

// defaultProcs is the runtime's GOMAXPROCS when the process started (the cores, or a CPU quota's
// share), taken before serve raises it, so that raising it again (tests run serve in-process)
// adds nothing.
var defaultProcs = runtime.GOMAXPROCS(0)

// serveProcs is the GOMAXPROCS serve runs with, and false when GOMAXPROCS is set in the
// environment (the runtime already applied it: it is left alone).
func serveProcs(getenv func(string) string) (int, bool) {
	if v := getenv("GOMAXPROCS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n, false
		}
	}
	return defaultProcs + spareProcs, true
}

// setServeProcs applies serveProcs and logs it.
func (c *cli) setServeProcs() {
	n, set := serveProcs(c.getenv)
	if !set {
		c.log.Info("Go processors", "gomaxprocs", n, "from", "GOMAXPROCS")
		return
	}
	runtime.GOMAXPROCS(n)
	c.log.Info("Go processors", "gomaxprocs", n, "cores", defaultProcs, "spare", spareProcs)
}
