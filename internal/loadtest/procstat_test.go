package loadtest

import (
	"path/filepath"
	"testing"
	"time"
)

// TestProcStatFile reads utime+stime, stime alone and the minor faults from a stat line laid out
// as the kernel's, with a command that holds spaces and a parenthesis.
func TestProcStatFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	// Fields after the command: state (3) … minflt (10) … utime (14) stime (15).
	writeFile(t, path, "4242 (t3code mcp) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 270 130 0 0 20 0 9 0 100 0 0\n")
	got, err := procStatFile(path)
	if err != nil {
		t.Fatal(err)
	}
	tick := time.Second / clockTicks
	if want := (procTimes{cpu: 400 * tick, sys: 130 * tick, minflt: 1234}); got != want {
		t.Fatalf("procStatFile = %+v, want %+v", got, want)
	}
	writeFile(t, path, "4242 (t3code-mcp) S 1 2 3\n")
	if _, err := procStatFile(path); err == nil {
		t.Fatal("a short stat line was read without an error")
	}
}
