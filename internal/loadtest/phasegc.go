package loadtest

import (
	"os"
	"runtime"
	"runtime/debug"
)

// The harness's garbage collector, phase by phase. The fake T3 keeps 1–2 GB of live state at the
// full profile's scale, so one collection in the middle of a phase costs the harness 1.5–4 s of
// CPU (harness_gc_cpu_ns in the -json report; 2026-12-02 quiet window: 3.8–4.0 s in the 20 s
// throughput phase), taken from the two cores it shares with the connector under test, which is
// what a real T3 on its own machine would not do. So the harness collects before each phase,
// outside the measured window, and lets its heap grow during the phase without collecting
// (phaseGCPercent), within a soft limit (phaseMemoryLimit) past which the runtime collects
// anyway. The connector's own process is not touched. In process (-cpuprofile) the settings
// would hold for the connector too and change what the profile shows, so there they stay as
// they are; and a GOGC set in the environment is the user's choice, kept for the whole run.
const (
	phaseGCPercent   = 400
	phaseMemoryLimit = 8 << 30
)

// phaseGC prepares the harness's collector for a phase and returns what restores it after.
func phaseGC(inProcess bool) (restore func()) {
	if inProcess || os.Getenv("GOGC") != "" {
		return func() {}
	}
	runtime.GC()
	percent := debug.SetGCPercent(phaseGCPercent)
	limit := debug.SetMemoryLimit(phaseMemoryLimit)
	return func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}
