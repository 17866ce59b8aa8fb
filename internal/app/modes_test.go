package app_test

import (
	"testing"
)

// A prompt to a busy thread: queued by default and with mode queue (a new
// run each, queued: true); steer puts it into the active run (same run id,
// which then goes on and completes with the new instructions, and the wait
// follows it); restart likewise; on an idle thread steer is refused; a mode
// the provider cannot do is refused with the modes left.
func TestDispatchModesOnABusyThread(t *testing.T) {
	fk := newIdemFake(t)
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	c := h.client("")

	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "hang forever"})
	tid, run1 := str(d, "thread_id"), str(d, "run_id")
	if th := c.ok("t3_thread", map[string]any{"thread_id": tid}); th["status"] != "running" && th["status"] != "starting" {
		t.Fatalf("thread = %v", th)
	}
	plain := c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "finish the second job"})
	queued := c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "finish the third job", "mode": "queue"})
	for _, q := range []map[string]any{plain, queued} {
		if q["queued"] != true || str(q, "run_id") == "" || str(q, "run_id") == run1 {
			t.Fatalf("queued dispatch = %v (run 1 is %s)", q, run1)
		}
	}
	if str(plain, "run_id") == str(queued, "run_id") {
		t.Fatalf("two queued prompts share run %s", str(plain, "run_id"))
	}

	steer := c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "stop waiting and finish the job", "mode": "steer"})
	if str(steer, "run_id") != run1 || steer["queued"] != nil {
		t.Fatalf("steer = %v, want run %s, not queued", steer, run1)
	}
	w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30})
	if w["reason"] != "completed" {
		t.Fatalf("wait after steer = %v", w)
	}
	// The wait followed run 1: its reply answers the steering prompt.
	var steered map[string]any
	for _, r := range w["state"].(map[string]any)["runs"].([]any) {
		if rm := r.(map[string]any); str(rm, "run_id") == run1 {
			steered = rm
		}
	}
	if steered == nil || steered["status"] != "completed" || str(steered, "reply") != "Done: stop waiting and finish the job" {
		t.Fatalf("run 1 after steering = %v (wait %v)", steered, w)
	}
	// The queued runs start by themselves once run 1 ended.
	waitRun(t, c, tid, str(plain, "run_id"), "completed")
	waitRun(t, c, tid, str(queued, "run_id"), "completed")

	// restart: the same run goes on with the new prompt.
	d2 := c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "hang forever"})
	waitRun(t, c, tid, str(d2, "run_id"), "running")
	rs := c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "start over and finish the job", "mode": "restart"})
	if str(rs, "run_id") != str(d2, "run_id") {
		t.Fatalf("restart = %v, want run %s", rs, str(d2, "run_id"))
	}
	w = c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30})
	if w["reason"] != "completed" || str(w, "state", "latest_run", "id") != str(d2, "run_id") {
		t.Fatalf("wait after restart = %v", w)
	}
	rowCaughtUp(t, h, tid, w) // the wait may have been woken by the thread's subscription before the row came

	// Idle: nothing to steer.
	c.fails("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "x", "mode": "steer"}, `mode "steer" needs a run under way`, tid)
	// A new thread takes no mode.
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "mode": "queue"}, "mode applies to a busy thread")

	// A provider that cannot steer.
	fk.RefuseModes("codex", "steer_active")
	d3 := c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "hang forever"})
	waitRun(t, c, tid, str(d3, "run_id"), "running")
	c.fails("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "x", "mode": "steer"},
		"refused mode steer", "does not support dispatch mode steer_active", "Modes to use instead: queue, restart")
}

// waitRun polls t3_thread until the thread's run shows status (the fake's
// run steps are driven by its own scheduler).
func waitRun(t *testing.T, c *client, threadID, runID, status string) {
	t.Helper()
	for range 5000 {
		th := c.ok("t3_thread", map[string]any{"thread_id": threadID, "turns": 20})
		for _, r := range th["runs"].([]any) {
			if rm := r.(map[string]any); str(rm, "run_id") == runID && rm["status"] == status {
				return
			}
		}
	}
	t.Fatalf("run %s of thread %s never showed status %s", runID, threadID, status)
}
