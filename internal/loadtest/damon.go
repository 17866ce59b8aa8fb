package loadtest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// This file: the guest's memory monitor (DAMON), which on this machine changes every latency
// figure by 2-4× (docs/benchmarks.md, "The guest's memory monitor"). The harness does not turn
// it off (it is the machine's setting, not the harness's); it reports its state with each run
// and the CPU its kernel threads took in each window, and warns when they took a share.

// damonStates is the state of each DAMON worker (kdamond) set up under sys (normally /sys),
// sorted and joined with commas: "on", "off", "on,off"; "" when there is none (no DAMON, or
// none set up).
func damonStates(sys string) string {
	files, _ := filepath.Glob(filepath.Join(sys, "kernel/mm/damon/admin/kdamonds/*/state"))
	var states []string
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			states = append(states, strings.TrimSpace(string(b)))
		}
	}
	slices.Sort(states)
	return strings.Join(states, ",")
}

// kdamondCPU is the CPU (utime+stime) of every kernel thread named kdamond.* under proc
// (normally /proc) so far. A kdamond turned off and on again is a new thread: a window's
// difference is then not its CPU, which is why the harness only reports it and never turns
// DAMON on or off itself.
func kdamondCPU(proc string) time.Duration {
	dirs, _ := os.ReadDir(proc)
	var sum time.Duration
	for _, d := range dirs {
		name := d.Name()
		if name == "" || name[0] < '0' || name[0] > '9' {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(proc, name, "comm"))
		if err != nil || !strings.HasPrefix(string(comm), "kdamond") {
			continue
		}
		if t, err := procStatFile(filepath.Join(proc, name, "stat")); err == nil {
			sum += t.cpu
		}
	}
	return sum
}

// kdamondWarnCores is the share of a core the memory monitor's threads may take in a window
// before the report warns: with it on and settled, they took 0.10-0.15 cores of this machine's
// two in the latency phase, and the phase's tails were 2-4× longer.
const kdamondWarnCores = 0.02

// warnMonitor warns when the memory monitor's threads took more than kdamondWarnCores over a
// phase's window: its latencies are then not comparable with runs without it.
func (h *harness) warnMonitor(phase string, u Usage) {
	if u.Wall <= 0 {
		return
	}
	if cores := u.KdamondCPU.Seconds() / u.Wall.Seconds(); cores > kdamondWarnCores {
		h.warn("%s phase: the guest's memory monitor (DAMON's kdamond) took %.2f cores of the machine's; with it on, the latency tails were 2-4× longer on the machine of docs/benchmarks.md (\"The guest's memory monitor\"): compare runs with the same state (report's host.damon)", phase, cores)
	}
}
