package app_test

import (
	"strings"
	"testing"
)

// Three threads dispatched into one project, each on its own worktree and
// branch from main, run in parallel; t3_wait over the three returns the
// first that settles, and each thread then says its branch and worktree (the
// path T3 announces after the launch, in thread.metadata-updated). No two
// share a working tree. An existing worktree is used as given; a base ref the
// repository lacks fails the run, not the call.
func TestWorktreeThreadsInParallel(t *testing.T) {
	fk := newIdemFake(t)
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	c := h.client("")

	branches := []string{"fix-login", "fix-logout", "fix-signup"}
	var ids []any
	for _, b := range branches {
		d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job on " + b,
			"worktree": map[string]any{"base_ref": "main", "branch": b}})
		if d["created"] != true || str(d, "branch") != b {
			t.Fatalf("dispatch on %s = %v", b, d)
		}
		ids = append(ids, str(d, "thread_id"))
	}
	first := c.ok("t3_wait", map[string]any{"thread_ids": ids, "timeout": 30})
	if first["reason"] != "completed" {
		t.Fatalf("first wait = %v", first)
	}
	worktrees := map[string]string{}
	for i, id := range ids {
		if w := c.ok("t3_wait", map[string]any{"thread_id": id, "timeout": 30}); w["reason"] != "completed" {
			t.Fatalf("wait %s = %v", id, w)
		}
		th := c.ok("t3_thread", map[string]any{"thread_id": id})
		wt := str(th, "worktree")
		if str(th, "branch") != branches[i] || wt != "/home/dev/.t3/worktrees/api/"+branches[i] {
			t.Fatalf("thread %s: branch %q worktree %q, want %s on its own worktree", id, str(th, "branch"), wt, branches[i])
		}
		if other, dup := worktrees[wt]; dup {
			t.Fatalf("threads %s and %s share the worktree %s", other, id, wt)
		}
		worktrees[wt] = id.(string)
	}

	// An existing worktree: branch and path as given.
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job",
		"worktree": map[string]any{"path": "/srv/api-wt/feature-y", "branch": "feature-y"}})
	if w := c.ok("t3_wait", map[string]any{"thread_id": str(d, "thread_id"), "timeout": 30}); w["reason"] != "completed" ||
		str(w, "state", "worktree") != "/srv/api-wt/feature-y" || str(w, "state", "branch") != "feature-y" {
		t.Fatalf("existing worktree: wait = %v", w)
	}

	// A bad base ref: the call succeeds, the run fails with T3's reason.
	bad := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job",
		"worktree": map[string]any{"base_ref": "no-such-branch", "branch": "feature-z"}})
	w := c.ok("t3_wait", map[string]any{"thread_id": str(bad, "thread_id"), "timeout": 30})
	if w["reason"] != "failed" || !strings.Contains(w["state"].(map[string]any)["runs"].([]any)[0].(map[string]any)["error"].(string), "Workspace preparation failed") {
		t.Fatalf("bad base ref: wait = %v", w)
	}

	// What the call cannot take.
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "worktree": map[string]any{}}, "worktree needs base_ref")
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "worktree": map[string]any{"base_ref": "main", "path": "/srv/x"}}, "not both")
	c.fails("t3_dispatch", map[string]any{"thread_id": ids[0], "prompt": "x", "worktree": map[string]any{"base_ref": "main"}}, "worktree applies to a new thread")
}

// A watched worktree thread's webhook event names its branch and worktree.
func TestWorktreeThreadEventNamesItsWorkspace(t *testing.T) {
	fk := newIdemFake(t)
	h := newHarness(t, harnessOpts{fake: fk, hook: true})
	h.waitOnline("mac")
	c := h.client("")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job",
		"worktree": map[string]any{"base_ref": "main", "branch": "fix-events"}})
	ev := h.hook.next(t).event
	if ev["type"] != "thread.completed" || str(ev, "thread_id") != str(d, "thread_id") ||
		str(ev, "branch") != "fix-events" || str(ev, "worktree") != "/home/dev/.t3/worktrees/api/fix-events" {
		t.Fatalf("event = %v", ev)
	}
	// A thread in the project root: neither field.
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job"})
	if ev := h.hook.next(t).event; ev["branch"] != nil || ev["worktree"] != nil {
		t.Fatalf("root thread event = %v", ev)
	}
}
