package loadtest

import (
	"math"
	"runtime/debug"
	"testing"
)

// A phase against the connector's binary runs with the harness's collector relaxed and gets the
// earlier settings back after it; in process (the connector shares the runtime) nothing changes.
func TestPhaseGCRelaxesOnlyAroundAPhaseOfTheBinary(t *testing.T) {
	t.Setenv("GOGC", "")
	percent := debug.SetGCPercent(100)
	limit := debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })

	restore := phaseGC(false)
	if got := debug.SetGCPercent(-1); got != phaseGCPercent {
		t.Fatalf("during a phase GC percent %d, want %d", got, phaseGCPercent)
	}
	debug.SetGCPercent(phaseGCPercent)
	if got := debug.SetMemoryLimit(-1); got != phaseMemoryLimit {
		t.Fatalf("during a phase memory limit %d, want %d", got, int64(phaseMemoryLimit))
	}
	restore()
	if got := debug.SetGCPercent(-1); got != 100 {
		t.Fatalf("after the phase GC percent %d, want 100 back", got)
	}
	debug.SetGCPercent(100)
	if got := debug.SetMemoryLimit(-1); got != math.MaxInt64 {
		t.Fatalf("after the phase memory limit %d, want none back", got)
	}

	restore = phaseGC(true)
	if got := debug.SetGCPercent(-1); got != 100 {
		t.Fatalf("in process GC percent %d, want 100 untouched", got)
	}
	debug.SetGCPercent(100)
	restore()

	// A GOGC from the environment is kept through the phases.
	t.Setenv("GOGC", "100")
	restore = phaseGC(false)
	if got := debug.SetGCPercent(-1); got != 100 {
		t.Fatalf("with GOGC set, GC percent %d during a phase, want 100 untouched", got)
	}
	debug.SetGCPercent(100)
	restore()
}
