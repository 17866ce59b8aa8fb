package app_test

import (
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// t3_threads lists what T3 has, not only what this connector started:
// threads made in the T3 app, archived ones on request, message search,
// status filters and paging, with tracked/watched flags; a project no
// allowlist admits never shows.
func TestThreadsListsTheMachine(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: time.Millisecond})
	api := fk.AddProject("api", "/srv/api")
	secret := fk.AddProject("secret", "/srv/secret")
	appThread := fk.AddThread(api, "made in the T3 app", "completed")
	secretThread := fk.AddThread(secret, "hidden", "idle")
	archived := fk.AddThread(api, "old work", "completed")
	if !fk.ArchiveThread(archived) {
		t.Fatal("archive failed")
	}
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	c := h.client("")

	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "remember the word quokkaflux please", "watch": false})
	mine := str(d, "thread_id")
	if w := c.ok("t3_wait", map[string]any{"thread_id": mine, "timeout": 20}); w["reason"] != "completed" {
		t.Fatalf("wait = %v", w)
	}

	list := func(args map[string]any) (map[string]any, map[string]map[string]any) {
		t.Helper()
		args["machine"] = "mac"
		out := c.ok("t3_threads", args)
		byID := map[string]map[string]any{}
		for _, e := range out["threads"].([]any) {
			m := e.(map[string]any)
			byID[m["thread_id"].(string)] = m
		}
		if _, leaked := byID[secretThread]; leaked {
			t.Fatalf("a thread of a project no allowlist admits was listed: %v", out)
		}
		return out, byID
	}

	out, got := list(map[string]any{})
	if len(got) != 2 || got[appThread] == nil || got[mine] == nil || out["total"] != float64(2) {
		t.Fatalf("threads = %v", out)
	}
	if e := got[appThread]; e["tracked"] != false || e["watching"] != false || e["status"] != "completed" || str(e, "project", "title") != "api" || e["latest_run_id"] == nil {
		t.Fatalf("app thread = %v", e)
	}
	if e := got[mine]; e["tracked"] != true || e["watching"] != false {
		t.Fatalf("dispatched thread = %v", e)
	}

	// Archived ones on request, marked so.
	if _, got := list(map[string]any{"archived": true}); len(got) != 3 || got[archived]["archived"] != true {
		t.Fatalf("with archived = %v", got)
	}
	// Message search (T3's searchThreads).
	if _, got := list(map[string]any{"query": "quokkaflux"}); len(got) != 1 || !strings.Contains(str(got[mine], "match"), "quokkaflux") {
		t.Fatalf("search = %v", got)
	}
	// T3's search skips archived threads: with archived, they are matched on
	// their title here (and not without archived).
	if _, got := list(map[string]any{"query": "OLD wor", "archived": true}); len(got) != 1 || got[archived]["archived"] != true || str(got[archived], "match") != "old work" {
		t.Fatalf("search with archived = %v", got)
	}
	if _, got := list(map[string]any{"query": "old work"}); len(got) != 0 {
		t.Fatalf("search without archived = %v", got)
	}
	// A status it does not filter on is an error naming the field and the values.
	c.fails("t3_threads", map[string]any{"machine": "mac", "status": "done"}, `status "done"`, "idle, preparing, queued", "busy, question")
	// Status filter and paging.
	if _, got := list(map[string]any{"status": "busy"}); len(got) != 0 {
		t.Fatalf("busy = %v", got)
	}
	p1, got1 := list(map[string]any{"limit": 1})
	next := str(p1, "next_cursor")
	if len(got1) != 1 || next == "" || p1["total"] != float64(2) {
		t.Fatalf("page 1 = %v", p1)
	}
	p2, got2 := list(map[string]any{"limit": 1, "cursor": next})
	if len(got2) != 1 || p2["next_cursor"] != nil {
		t.Fatalf("page 2 = %v", p2)
	}
	for id := range got2 {
		if got1[id] != nil {
			t.Fatalf("pages overlap: %v / %v", got1, got2)
		}
	}

	// Adopt the app's thread: now tracked and watched.
	c.ok("t3_watch", map[string]any{"thread_id": appThread, "enabled": true})
	if _, got := list(map[string]any{"project": "api"}); got[appThread]["watching"] != true || got[appThread]["tracked"] != true {
		t.Fatalf("after adopting = %v", got[appThread])
	}
	c.fails("t3_threads", map[string]any{"machine": "mac", "project": "secret"}, `project "secret" not found`)
	c.fails("t3_threads", map[string]any{"machine": "mac", "cursor": "x"}, "cursor")
}
