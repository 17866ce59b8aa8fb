package app_test

import (
	"bytes"
	"runtime/trace"
	"testing"
)

// TestWaitResultIsMarkedInTheTrace: while a runtime trace runs (T3CODE_MCP_TRACE), each t3_wait
// result is marked in it with its thread: a log event of category "t3_wait" whose message is the
// thread's id, written when the result is handed back, which scripts/wakejoin joins with the
// harness's own timestamps. The outbox's TestTraceMarksNameEachEvent is its pair.
func TestWaitResultIsMarkedInTheTrace(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("trace")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	tid := str(d, "thread_id")
	h.fake.StepAll()
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("a runtime trace runs already (go test -trace): %v", err)
	}
	res := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 60})
	trace.Stop()
	if str(res, "reason") != "completed" {
		t.Fatalf("wait result %v", res)
	}
	if !bytes.Contains(buf.Bytes(), []byte("t3_wait")) {
		t.Error("no t3_wait mark in the trace")
	}
	if !bytes.Contains(buf.Bytes(), []byte(tid)) {
		t.Errorf("the wait's thread %s not named in the trace", tid)
	}
}
