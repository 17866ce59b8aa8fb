package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// T3CODE_MCP_TRACE writes a runtime trace of the real binary: the window opens at once
// (T3CODE_MCP_TRACE_AFTER=0s) and SIGTERM closes it and the file, leaving a whole trace that
// `go tool trace` opens.
func TestServeWritesATraceWindow(t *testing.T) {
	path := filepath.Join(t.TempDir(), "connector.trace")
	env := baseEnv(t, "T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)), "T3CODE_MCP_STATE_DIR="+t.TempDir(),
		"T3CODE_MCP_TRACE="+path, "T3CODE_MCP_TRACE_AFTER=0s", "T3CODE_MCP_TRACE_FOR=1h")
	s := startServe(t, t.TempDir(), env, "serve")
	// The runtime writes the header once the window is open.
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			break
		}
		select {
		case <-s.exited:
			t.Fatalf("serve exited\n%s", s.stderr)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.stderr)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("go 1.")) || !bytes.Contains(b[:16], []byte(" trace")) {
		t.Fatalf("not a runtime trace: %q", b[:min(len(b), 16)])
	}
	if !strings.Contains(s.stderr.String(), "runtime trace window") {
		t.Errorf("no log line about the window:\n%s", s.stderr)
	}
	out, err := exec.Command("go", "tool", "trace", "-d=footprint", path).CombinedOutput()
	if err != nil {
		t.Fatalf("go tool trace cannot read it: %v\n%.2000s", err, out)
	}
}

// A wrong setting stops the start with exit 2 and says which variable; no file is made.
func TestTraceSettingsAreChecked(t *testing.T) {
	for _, kv := range []string{"T3CODE_MCP_TRACE_AFTER=soon", "T3CODE_MCP_TRACE_FOR=0s", "T3CODE_MCP_TRACE_FOR=-1s"} {
		path := filepath.Join(t.TempDir(), "connector.trace")
		cmd := exec.Command(binary(t), "serve")
		cmd.Env = baseEnv(t, "T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)), "T3CODE_MCP_STATE_DIR="+t.TempDir(), "T3CODE_MCP_TRACE="+path, kv)
		out, _ := cmd.CombinedOutput()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 2 {
			t.Fatalf("%s: exit %v\n%s", kv, cmd.ProcessState, out)
		}
		if name, _, _ := strings.Cut(kv, "="); !strings.Contains(string(out), name) {
			t.Errorf("%s: output does not name the variable:\n%s", kv, out)
		}
		if _, err := os.Stat(path); err == nil {
			t.Errorf("%s: a trace file was made", kv)
		}
	}
	cmd := exec.Command(binary(t), "serve")
	cmd.Env = baseEnv(t, "T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)), "T3CODE_MCP_STATE_DIR="+t.TempDir(), "T3CODE_MCP_TRACE=/nonexistent/dir/x.trace")
	out, _ := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "T3CODE_MCP_TRACE") {
		t.Fatalf("unwritable trace file: exit %v\n%s", cmd.ProcessState, out)
	}
}
