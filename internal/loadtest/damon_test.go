package loadtest

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDamonStates reads each DAMON worker's state as the kernel writes it, and none where the
// kernel has no DAMON.
func TestDamonStates(t *testing.T) {
	sys := t.TempDir()
	if got := damonStates(sys); got != "" {
		t.Fatalf("no DAMON: %q, want empty", got)
	}
	writeFile(t, filepath.Join(sys, "kernel/mm/damon/admin/kdamonds/0/state"), "on\n")
	if got := damonStates(sys); got != "on" {
		t.Fatalf("one worker on: %q", got)
	}
	writeFile(t, filepath.Join(sys, "kernel/mm/damon/admin/kdamonds/1/state"), "off\n")
	if got := damonStates(sys); got != "off,on" {
		t.Fatalf("two workers: %q", got)
	}
}

// TestKdamondCPU sums utime+stime of the kdamond threads only, from stat lines laid out as the
// kernel's (the command in parentheses).
func TestKdamondCPU(t *testing.T) {
	proc := t.TempDir()
	stat := func(comm string, utime, stime int) string {
		// Fields 3-15 after the command: state ... utime (14) stime (15).
		return "1 (" + comm + ") S 2 0 0 0 -1 2129984 0 0 0 0 " + strconv.Itoa(utime) + " " + strconv.Itoa(stime) + " 0 0 20 0 1 0 5 0 0\n"
	}
	writeFile(t, filepath.Join(proc, "83/comm"), "kdamond.0\n")
	writeFile(t, filepath.Join(proc, "83/stat"), stat("kdamond.0", 150, 350))
	writeFile(t, filepath.Join(proc, "84/comm"), "kdamond.1\n")
	writeFile(t, filepath.Join(proc, "84/stat"), stat("kdamond.1", 0, 100))
	writeFile(t, filepath.Join(proc, "90/comm"), "t3code-mcp\n")
	writeFile(t, filepath.Join(proc, "90/stat"), stat("t3code-mcp", 9000, 9000))
	writeFile(t, filepath.Join(proc, "self/comm"), "kdamond.0\n") // not a pid: skipped
	if got, want := kdamondCPU(proc), 6*time.Second; got != want {
		t.Fatalf("kdamond CPU %s, want %s (the two workers' 600 ticks)", got, want)
	}
}

// TestWarnMonitor: a phase in which the monitor took a share of a core is flagged in the
// report's warnings; one in which it took next to nothing is not.
func TestWarnMonitor(t *testing.T) {
	h := &harness{rep: &Report{}, cfg: Config{Progress: io.Discard}}
	h.warnMonitor("latency", Usage{Wall: 10 * time.Second, KdamondCPU: 100 * time.Millisecond})
	if len(h.rep.Warnings) != 0 {
		t.Fatalf("0.01 cores warned: %q", h.rep.Warnings)
	}
	h.warnMonitor("latency", Usage{Wall: 10 * time.Second, KdamondCPU: 1400 * time.Millisecond})
	if len(h.rep.Warnings) != 1 || !strings.Contains(h.rep.Warnings[0], "0.14 cores") {
		t.Fatalf("0.14 cores: warnings %q", h.rep.Warnings)
	}
}
