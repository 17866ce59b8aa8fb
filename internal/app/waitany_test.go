package app_test

import (
	"strings"
	"testing"
)

// t3_wait with thread_ids returns the first of several threads that settles,
// saying which, in the one-thread result shape; the others run on.
func TestWaitForAnyOfSeveralThreads(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("")
	dispatch := func(prompt string) string {
		t.Helper()
		return str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": prompt}), "thread_id")
	}
	slow1, slow2 := dispatch("hang until stopped"), dispatch("work forever")
	fast := dispatch("write the changelog")
	sc, text, isErr := c.call("t3_wait", map[string]any{"thread_ids": []string{slow1, fast, slow2}, "timeout": 20})
	if isErr || sc["reason"] != "completed" || str(sc, "state", "thread_id") != fast || !strings.Contains(text, fast) {
		t.Fatalf("wait any = %v\n%s", sc, text)
	}
	// Only the hanging ones now: a short wait times out, reporting one of them.
	sc = c.ok("t3_wait", map[string]any{"thread_ids": []string{slow1, slow2}, "timeout": 1})
	if sc["reason"] != "timeout" || (str(sc, "state", "thread_id") != slow1 && str(sc, "state", "thread_id") != slow2) {
		t.Fatalf("timeout = %v", sc)
	}
	c.ok("t3_interrupt", map[string]any{"thread_id": slow2})
	if sc := c.ok("t3_wait", map[string]any{"thread_ids": []string{slow1, slow2}, "timeout": 20}); sc["reason"] != "interrupted" || str(sc, "state", "thread_id") != slow2 {
		t.Fatalf("after interrupt = %v", sc)
	}
	c.ok("t3_interrupt", map[string]any{"thread_id": slow1})
	many := make([]string, 101)
	for i := range many {
		many[i] = slow1
	}
	c.fails("t3_wait", map[string]any{"thread_ids": many}, "thread_ids")
	c.fails("t3_wait", map[string]any{}, "thread_id")
	c.fails("t3_wait", map[string]any{"thread_ids": []string{fast, "thread-nope"}}, "thread-nope")
}
