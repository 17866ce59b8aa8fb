package main

import (
	"fmt"
	"os"
	"runtime/trace"
	"sync"
	"time"
)

// traceWindow is a runtime/trace (go tool trace) of a window of the serving process, asked
// for with T3CODE_MCP_TRACE: where the real binary's goroutines wait (runnable but not
// running, the network poller, syscalls) cannot be seen from a trace of the load harness's
// in-process connector, whose goroutines share one runtime, and so its Ps, with the harness.
// The window starts T3CODE_MCP_TRACE_AFTER after the start and lasts T3CODE_MCP_TRACE_FOR; a
// trace grows by tens of MB a second under load, so it is a window, never the whole run.
type traceWindow struct {
	mu      sync.Mutex
	f       *os.File
	timer   *time.Timer
	running bool
	done    bool // taken or stopped: one window per process
}

// traceSettings reads T3CODE_MCP_TRACE, _AFTER and _FOR; path "" means no trace.
func traceSettings(getenv func(string) string) (path string, after, length time.Duration, err error) {
	path = getenv("T3CODE_MCP_TRACE")
	after, length = 0, 5*time.Second
	for _, d := range []struct {
		key string
		to  *time.Duration
	}{{"T3CODE_MCP_TRACE_AFTER", &after}, {"T3CODE_MCP_TRACE_FOR", &length}} {
		v := getenv(d.key)
		if v == "" {
			continue
		}
		x, perr := time.ParseDuration(v)
		if perr != nil || x < 0 || (d.to == &length && x == 0) {
			return "", 0, 0, fmt.Errorf("%s=%q: want a Go duration such as 5s (T3CODE_MCP_TRACE_FOR above zero)", d.key, v)
		}
		*d.to = x
	}
	return path, after, length, nil
}

// startTraceWindow creates the trace file at once (a wrong path fails the start, not the
// window) and arranges the window; stop ends a window still open and closes the file.
func startTraceWindow(path string, after, length time.Duration) (*traceWindow, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600) // it names threads, as the state file does
	if err != nil {
		return nil, fmt.Errorf("T3CODE_MCP_TRACE: %w", err)
	}
	w := &traceWindow{f: f}
	w.timer = time.AfterFunc(after, func() { w.begin(length) })
	return w, nil
}

func (w *traceWindow) begin(length time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.done = true
	if err := trace.Start(w.f); err != nil {
		// Another trace is running (a test's -trace): this window is skipped.
		return
	}
	w.running = true
	w.timer = time.AfterFunc(length, w.stop)
}

// stop ends the window (or cancels one not begun) and closes the file.
func (w *traceWindow) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
	w.timer.Stop()
	if w.running {
		trace.Stop()
		w.running = false
	}
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
}

// traceWindow arranges the trace window the environment asks for; stop is never nil. A bad
// setting or a file that cannot be created is reported on stderr.
func (c *cli) traceWindow() (stop func(), err error) {
	path, after, length, err := traceSettings(c.getenv)
	if err != nil {
		fmt.Fprintln(c.stderr, "configuration error:", err)
		return func() {}, exitUsage
	}
	if path == "" {
		return func() {}, nil
	}
	w, err := startTraceWindow(path, after, length)
	if err != nil {
		fmt.Fprintln(c.stderr, "t3code-mcp:", err)
		return func() {}, exitFailed
	}
	c.log.Info("runtime trace window", "file", path, "after", after, "for", length)
	return w.stop, nil
}
