package loadtest

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// This file: the connector's CPU over the t3_thread windows in nanoseconds. /proc/<pid>/stat
// counts it in 10 ms ticks, which over the ten first calls of a full run is ±1 ms per call:
// the size of what is measured there. Each thread's schedstat counts its time on a CPU in
// nanoseconds.

// taskTimes is the time on a CPU of each of a process's threads, by thread id, at one moment.
type taskTimes map[string]time.Duration

// readTaskTimes reads /proc/<pid>/task/*/schedstat (its first field: ns on a CPU).
func readTaskTimes(pid int) (taskTimes, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	out := make(taskTimes, len(ents))
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			if os.IsNotExist(err) {
				continue // ended meanwhile: since says so
			}
			return nil, err
		}
		f := bytes.Fields(b)
		if len(f) == 0 {
			return nil, fmt.Errorf("%s/%s/schedstat: empty", dir, e.Name())
		}
		ns, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s/%s/schedstat: %w", dir, e.Name(), err)
		}
		out[e.Name()] = time.Duration(ns)
	}
	return out, nil
}

// since is the process's CPU between t0 and t; ok is false when a thread of t0 has ended (its
// time since t0 is lost with it): the caller then keeps the ticks of /proc/<pid>/stat.
func (t taskTimes) since(t0 taskTimes) (cpu time.Duration, ok bool) {
	for id, before := range t0 {
		now, alive := t[id]
		if !alive {
			return 0, false
		}
		cpu += now - before
	}
	for id, now := range t {
		if _, old := t0[id]; !old {
			cpu += now // started after t0
		}
	}
	return cpu, true
}

// preciseCPU is a CPU window of the connector (pid) in nanoseconds beside a usage mark.
type preciseCPU struct {
	pid int
	t0  taskTimes
}

func startPreciseCPU(pid int) preciseCPU {
	t0, _ := readTaskTimes(pid) // nil: the window falls back to the ticks
	return preciseCPU{pid, t0}
}

// of is the connector's CPU since the window started, in nanoseconds when its threads tell it,
// else ticks (the usage's CPU, from /proc/<pid>/stat).
func (p preciseCPU) of(ticks time.Duration) time.Duration {
	if p.t0 == nil {
		return ticks
	}
	t, err := readTaskTimes(p.pid)
	if err != nil {
		return ticks
	}
	if cpu, ok := t.since(p.t0); ok {
		return cpu
	}
	return ticks
}
