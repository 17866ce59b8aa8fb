package app_test

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestStageMetrics: one event's way from T3 to the receiver shows in /metrics, stage by stage
// (docs/troubleshooting.md, "Where an event's time goes"): every stage histogram has counted it.
func TestStageMetrics(t *testing.T) {
	h := newHarness(t, harnessOpts{hook: true})
	h.waitOnline("mac")
	c := h.client("conversation-9")
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "please finish"})
	if d := h.hook.next(t); d.event["type"] != "thread.completed" {
		t.Fatalf("event = %v", d.event)
	}
	stages := []string{
		"t3code_mcp_watch_chunk_wait_seconds",
		"t3code_mcp_watch_chunk_applied_seconds",
		"t3code_mcp_watch_chunk_durable_seconds",
		"t3code_mcp_watch_chunk_items",
		"t3code_mcp_store_commit_wait_seconds",
		"t3code_mcp_store_commit_seconds",
		"t3code_mcp_store_commit_batches",
		"t3code_mcp_events_durable_lag_seconds",
		"t3code_mcp_outbox_first_attempt_lag_seconds",
		"t3code_mcp_outbox_attempt_seconds",
	}
	var body string
	// The attempt is observed once the receiver's answer is back, which may be after the
	// delivery reached the test's receiver.
	eventually(t, 30*time.Second, "every stage histogram counted the event", func() bool {
		resp, err := http.Get(h.http.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		// The group transaction's parts (bbolt store), labelled.
		for _, part := range []string{"writes", "sync", "handover", "release"} {
			if !regexp.MustCompile(`(?m)^t3code_mcp_store_commit_part_seconds_count\{part="` + part + `"\} [1-9]`).MatchString(body) {
				return false
			}
		}
		for _, name := range stages {
			m := regexp.MustCompile(`(?m)^` + name + `_count (\d+)$`).FindStringSubmatch(body)
			if m == nil {
				return false
			}
			if n, _ := strconv.Atoi(m[1]); n < 1 {
				return false
			}
		}
		return true
	}, func() string { return body })
}
