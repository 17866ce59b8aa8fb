package app_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// One thread whose reads answer 500 and one whose reads hang, among many busy
// threads of the same machine, both with rows that cannot say how their runs
// ended (the server reports "idle"): the machine's stream is never held, every
// other thread's waits and events keep flowing, t3_machines, /healthz and the
// metrics show the two threads waiting for a look-up, and once the threads
// can be read their events arrive, each exactly once.
func TestFaultOneThreadUnreadable(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	hl := newHookLog(t, nil)
	h := newHarness(t, harnessOpts{fake: fk, settings: func(s *appSettings) {
		hl.settings(s)
		s.HTTPTimeout = 2 * time.Second // the hanging reads end in a timeout
		s.Lookup = events.LookupOptions{MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}
	}})
	h.waitOnline("mac")
	c := h.client("faults")

	dispatch := func(prompt string) string {
		return str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": prompt}), "thread_id")
	}
	bad500, badHang := dispatch(promptDone+" (reads answer 500)"), dispatch(promptDone+" (reads time out)")
	for _, tid := range []string{bad500, badHang} {
		fk.ReportIdleAfterRuns(tid, true)
	}
	fk.FailThreadReads(bad500, 500)
	fk.HangThreadReads(badHang, true)
	w := want{}
	w.add(bad500, "thread.completed")
	w.add(badHang, "thread.completed")
	var good []string
	for i := range 12 {
		tid := dispatch(fmt.Sprintf("%s #%d", promptDone, i))
		good = append(good, tid)
		w.add(tid, "thread.completed")
	}
	fk.StepAll()

	// The good threads' waits and events flow while the two bad ones fail.
	goodWant := want{}
	for _, tid := range good {
		if r := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); r["reason"] != "completed" {
			t.Fatalf("wait on %s = %v", tid, r)
		}
		goodWant.add(tid, "thread.completed")
	}
	eventually(t, 30*time.Second, "the good threads' events", func() bool { return hl.arrived(goodWant) }, hl.summary)
	eventually(t, 30*time.Second, "both bad threads noted for a look-up", func() bool {
		return h.app.Detector.Lookups()["mac"].Pending == 2
	}, func() string {
		st5, _ := fk.ThreadStatus(bad500)
		sth, _ := fk.ThreadStatus(badHang)
		return fmt.Sprintf("%+v 500:%s hang:%s %s", h.app.Detector.Lookups(), st5, sth, tail(h.logs.String(), 3))
	})

	// Surfaced in t3_machines, /healthz and the metrics.
	ms := c.ok("t3_machines", nil)["machines"].([]any)[0].(map[string]any)
	if ms["threads_awaiting_lookup"] != float64(2) {
		t.Errorf("t3_machines = %v, want threads_awaiting_lookup 2", ms)
	}
	ev := h.health()["events"].(map[string]any)
	if ev["threads_awaiting_lookup"] != float64(2) {
		t.Errorf("/healthz events = %v", ev)
	}
	resp, err := http.Get(h.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(metrics), `t3code_mcp_thread_lookups_pending{machine="mac"} 2`) {
		t.Errorf("metrics lack the pending look-ups:\n%s", metrics)
	}

	// A second round on the good threads while the bad ones still fail.
	for _, tid := range good[:4] {
		c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": promptFail})
		w.add(tid, "thread.failed")
		goodWant.add(tid, "thread.failed")
	}
	fk.StepAll()
	eventually(t, 30*time.Second, "the second round's events", func() bool { return hl.arrived(goodWant) }, hl.summary)
	if h.app.Detector.Lookups()["mac"].Pending != 2 {
		t.Fatalf("look-ups = %+v", h.app.Detector.Lookups())
	}

	// The bad threads recover: their events arrive, once.
	fk.FailThreadReads(bad500, 0)
	fk.HangThreadReads(badHang, false)
	repeats := hl.settle(t, h, w)
	eventually(t, 10*time.Second, "no look-up left", func() bool { return h.app.Detector.Lookups()["mac"].Pending == 0 }, nil)
	if !strings.Contains(h.logs.String(), "thread look-up failed") {
		t.Errorf("the failed look-ups were not logged")
	}
	faultCount(t, "one-thread-unreadable", 2, len(good)+4+2, countEvents(w), repeats)
}
