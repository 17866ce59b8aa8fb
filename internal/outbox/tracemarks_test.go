package outbox

import (
	"bytes"
	"runtime/trace"
	"testing"
)

// TestTraceMarksNameEachEvent: while a runtime trace runs, each delivered event's way is marked
// in it (docs/troubleshooting.md, scripts/tracejoin): the hand-over, the attempt's start, the
// request written and the answer, the first three and the last with the event's id.
func TestTraceMarksNameEachEvent(t *testing.T) {
	rc := newReceiver(t)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, nil)
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("a runtime trace runs already (go test -trace): %v", err)
	}
	evs := roundOf(3, 1)
	h.commit(t, evs...)
	h.delivered(t, len(evs))
	trace.Stop()
	for _, mark := range []string{markDurable, markAttempt, markWritten, markAnswered} {
		if !bytes.Contains(buf.Bytes(), []byte(mark)) {
			t.Errorf("no %s mark in the trace", mark)
		}
	}
	for _, e := range evs {
		if !bytes.Contains(buf.Bytes(), []byte(e.ID)) {
			t.Errorf("event %s not named in the trace", e.ID)
		}
	}
}
