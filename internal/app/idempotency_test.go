package app_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

func newIdemFake(t *testing.T) *t3fake.Server {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: time.Millisecond})
	fk.AddProject("api", "/srv/api")
	return fk
}

// A t3_dispatch retried with its idempotency_key returns the first call's
// thread and run — in the same process and after a restart of the connector
// over the same state file — and never makes a second thread; the key with
// other arguments is refused.
func TestDispatchIdempotencyKeyAcrossRestart(t *testing.T) {
	fk := newIdemFake(t)
	dir := t.TempDir()
	h := newHarness(t, harnessOpts{fake: fk, stateDir: dir})
	h.waitOnline("mac")
	c := h.client("")
	args := map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job", "idempotency_key": "job-7"}
	first := c.ok("t3_dispatch", args)
	tid, run := str(first, "thread_id"), str(first, "run_id")
	if tid == "" || run == "" || first["created"] != true || first["replayed"] != nil {
		t.Fatalf("first = %v", first)
	}
	again := c.ok("t3_dispatch", args)
	if str(again, "thread_id") != tid || str(again, "run_id") != run || str(again, "message_id") != str(first, "message_id") || again["replayed"] != true {
		t.Fatalf("retry = %v, want the first call's thread %s and run %s", again, tid, run)
	}
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "another job", "idempotency_key": "job-7"},
		"idempotency_key", "other arguments", tid)

	h.stop()
	h = newHarness(t, harnessOpts{fake: fk, stateDir: dir})
	h.waitOnline("mac")
	c = h.client("")
	after := c.ok("t3_dispatch", args)
	if str(after, "thread_id") != tid || str(after, "run_id") != run || after["replayed"] != true {
		t.Fatalf("retry after restart = %v, want thread %s run %s", after, tid, run)
	}
	if ids := fk.ThreadIDs(); len(ids) != 1 || ids[0] != tid {
		t.Fatalf("T3 has threads %v, want only %s", ids, tid)
	}
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "completed" {
		t.Fatalf("wait = %v", w)
	}
}

// A first call that died half-way — T3 created the thread but refused the
// prompt — leaves its plan under the key: the retry after a restart sends
// the prompt into that same thread (a new commandId for the refused command,
// the same one for the thread), and T3 still has one thread.
func TestDispatchIdempotencyKeyResumesAfterRestart(t *testing.T) {
	fk := newIdemFake(t)
	dir := t.TempDir()
	h := newHarness(t, harnessOpts{fake: fk, stateDir: dir})
	h.waitOnline("mac")
	c := h.client("")
	fk.RefuseDispatch("Provider codex is not ready.")
	args := map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job", "idempotency_key": "job-8"}
	c.fails("t3_dispatch", args, "was created", "did not take the prompt", "Provider codex is not ready.")
	ids := fk.ThreadIDs()
	if len(ids) != 1 {
		t.Fatalf("threads after the refused prompt = %v", ids)
	}
	h.stop()
	fk.RefuseDispatch("")

	h = newHarness(t, harnessOpts{fake: fk, stateDir: dir})
	h.waitOnline("mac")
	c = h.client("")
	res := c.ok("t3_dispatch", args)
	if str(res, "thread_id") != ids[0] || res["created"] != true || res["replayed"] != true || str(res, "run_id") == "" {
		t.Fatalf("retry = %v, want thread %s with its run", res, ids[0])
	}
	if now := fk.ThreadIDs(); !slices.Equal(now, ids) {
		t.Fatalf("T3 threads = %v, want still %v", now, ids)
	}
	if w := c.ok("t3_wait", map[string]any{"thread_id": ids[0], "timeout": 20}); w["reason"] != "completed" || str(w, "state", "latest_run", "id") != str(res, "run_id") {
		t.Fatalf("wait = %v", w)
	}
}

// Calls with one key at once, from several MCP sessions, make one thread and
// all return it.
func TestDispatchIdempotencyKeyConcurrentDuplicates(t *testing.T) {
	fk := newIdemFake(t)
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	const n = 6
	sessions := make([]*client, n)
	for i := range sessions {
		sessions[i] = h.client("")
	}
	args := map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job", "idempotency_key": "same-key"}
	var wg sync.WaitGroup
	got := make([]map[string]any, n)
	errs := make([]string, n)
	for i, c := range sessions {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			res, err := c.session.CallTool(ctx, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args})
			switch {
			case err != nil:
				errs[i] = err.Error()
			case res.IsError:
				errs[i] = "tool error"
			default:
				b, _ := json.Marshal(res.StructuredContent)
				_ = json.Unmarshal(b, &got[i])
			}
		})
	}
	wg.Wait()
	if e := strings.Join(errs, ""); e != "" {
		t.Fatalf("errors: %q", errs)
	}
	replayed := 0
	for _, g := range got {
		if str(g, "thread_id") != str(got[0], "thread_id") || str(g, "message_id") != str(got[0], "message_id") {
			t.Fatalf("results differ: %v", got)
		}
		if g["replayed"] == true {
			replayed++
		}
	}
	if replayed != n-1 {
		t.Fatalf("%d of %d results replayed, want all but the first: %v", replayed, n, got)
	}
	if ids := fk.ThreadIDs(); len(ids) != 1 {
		t.Fatalf("T3 has threads %v, want one", ids)
	}
}
