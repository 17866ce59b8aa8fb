package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

func TestMachinesAndProjectsHonourTheAllowlist(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("")
	ms := c.ok("t3_machines", nil)["machines"].([]any)
	if len(ms) != 1 {
		t.Fatalf("machines = %v", ms)
	}
	m := ms[0].(map[string]any)
	if m["name"] != "mac" || m["status"] != "online" || m["online"] != true || m["protocol"] != float64(2) || m["t3_version"] != "0.1.0" || m["demo"] != false {
		t.Fatalf("machine = %v", m)
	}
	ps := c.ok("t3_projects", map[string]any{"machine": "mac"})["projects"].([]any)
	if len(ps) != 1 || ps[0].(map[string]any)["title"] != "api" || ps[0].(map[string]any)["path"] != "/srv/api" {
		t.Fatalf("projects = %v (secret must be hidden)", ps)
	}
	c.fails("t3_projects", map[string]any{"machine": "nope"}, `unknown machine "nope"`, "mac")
	c.fails("t3_projects", map[string]any{}, "machine")
}

func TestDispatchAndWaitForEachOutcome(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("chat-1")
	for _, tc := range []struct{ prompt, reason string }{
		{"write the changelog", "completed"},
		{"this will fail", "failed"},
	} {
		d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": tc.prompt})
		tid := str(d, "thread_id")
		if tid == "" || d["created"] != true || str(d, "project", "title") != "api" || str(d, "message_id") == "" {
			t.Fatalf("dispatch = %v", d)
		}
		w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
		if w["reason"] != tc.reason {
			t.Fatalf("%q: wait = %v", tc.prompt, w)
		}
		st := w["state"].(map[string]any)
		runs := st["runs"].([]any)
		last := runs[len(runs)-1].(map[string]any)
		switch tc.reason {
		case "completed":
			if !strings.HasPrefix(last["reply"].(string), "Done: write the changelog") {
				t.Errorf("reply = %v", last["reply"])
			}
			files := last["changed_files"].([]any)
			if len(files) == 0 || files[0].(map[string]any)["path"] != "README.md" {
				t.Errorf("changed files = %v", files)
			}
			if len(last["tools"].([]any)) == 0 {
				t.Errorf("no tools summarized: %v", last)
			}
		case "failed":
			if !strings.Contains(str(st, "latest_run", "error"), "Simulated provider failure") {
				t.Errorf("latest_run = %v", st["latest_run"])
			}
		}
		// Settled already: a second wait returns at once with the same outcome
		// (once the watcher has the row: the first wait may have been woken by
		// the thread's subscription before it).
		rowCaughtUp(t, h, tid, w)
		if w2 := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 1}); w2["reason"] != tc.reason {
			t.Fatalf("second wait = %v", w2["reason"])
		}
		th := c.ok("t3_thread", map[string]any{"thread_id": tid})
		if th["status"] != tc.reason || th["thread_id"] != tid {
			t.Fatalf("thread = %v", th)
		}
	}
}

// A continuation: the wait after t3_dispatch waits for the new run, never
// returning the previous run's outcome.
func TestContinuationWaitsForTheNewRun(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	c := h.client("")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "first"}), "thread_id")
	for fk.Pending() > 0 {
		fk.StepAll()
		time.Sleep(time.Millisecond)
	}
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 10}); w["reason"] != "completed" {
		t.Fatalf("first wait = %v", w)
	}
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": "second, this one will fail"})
	done := make(chan map[string]any, 1)
	go func() {
		sc, _, _ := c.call("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
		done <- sc
	}()
	select {
	case w := <-done:
		t.Fatalf("wait returned before the new run moved: %v", w)
	case <-time.After(200 * time.Millisecond):
	}
	for fk.Pending() > 0 {
		fk.StepAll()
		time.Sleep(time.Millisecond)
	}
	select {
	case w := <-done:
		if w["reason"] != "failed" {
			t.Fatalf("wait = %v, want the second run's failure", w)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("wait did not return")
	}
}

func TestQuestionAnswerValidationAndResume(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "/srv/api", "prompt": "ask me a question first"}), "thread_id")
	w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
	if w["reason"] != "question" {
		t.Fatalf("wait = %v", w)
	}
	pq := w["state"].(map[string]any)["pending_question"].(map[string]any)
	qs := pq["questions"].([]any)
	if len(qs) != 2 {
		t.Fatalf("questions = %v", qs)
	}
	var single, multi map[string]any
	for _, q := range qs {
		qm := q.(map[string]any)
		if qm["multi_select"] == true {
			multi = qm
		} else {
			single = qm
		}
	}
	sid, mid := single["id"].(string), multi["id"].(string)
	sl := single["options"].([]any)[0].(string)
	ml := multi["options"].([]any)[0].(string)
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"nope": "x"}}, `unknown question id "nope"`, sid)
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{sid: "Bogus", mid: []any{ml}}}, `"Bogus" is not an option`, sl)
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{sid: []any{sl}, mid: []any{ml}}}, "takes one answer, not a list")
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{sid: sl}}, "missing answers", mid)
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{sid: 5}}, `argument "answers.`+sid+`" must be a string or an array of strings; got the number 5`)
	c.ok("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{sid: sl, mid: []any{ml}}})
	got, ok := h.fake.Answers(pq["request_id"].(string))
	if !ok || got[sid][0] != sl || got[mid][0] != ml {
		t.Fatalf("T3 received answers %v", got)
	}
	w = c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
	if w["reason"] != "completed" {
		t.Fatalf("after answer: %v", w)
	}
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{sid: sl}}, "no pending question")
}

func TestInterruptAndProgress(t *testing.T) {
	h := newHarness(t, harnessOpts{settings: func(s *appSettings) { s.Limits.ProgressEvery = 20 * time.Millisecond }})
	h.waitOnline("mac")
	c := h.client("")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "hang around"}), "thread_id")
	sc, _, isErr := c.callProgress("t3_wait", map[string]any{"thread_id": tid, "timeout": 1}, "tok-1")
	if isErr || sc["reason"] != "timeout" {
		t.Fatalf("wait = %v", sc)
	}
	select {
	case p := <-c.progress:
		if p.ProgressToken != "tok-1" || !strings.Contains(p.Message, tid) {
			t.Fatalf("progress = %+v", p)
		}
	default:
		t.Fatal("no progress notification during a 1 s wait with ProgressEvery 20ms")
	}
	out := c.ok("t3_interrupt", map[string]any{"thread_id": tid})
	if str(out, "run_id") == "" {
		t.Fatalf("interrupt = %v", out)
	}
	w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
	if w["reason"] != "interrupted" {
		t.Fatalf("wait = %v", w)
	}
	rowCaughtUp(t, h, tid, w) // the wait may have been woken by the thread's subscription before the row came
	c.fails("t3_interrupt", map[string]any{"thread_id": tid}, "no active run", "interrupted")
}

func TestToolErrorsNameTheFault(t *testing.T) {
	h := newHarness(t, harnessOpts{settings: func(s *appSettings) { s.Limits.MaxPromptChars = 50 }})
	h.waitOnline("mac")
	hidden := h.fake.AddThread(projectID(t, h, "secret"), "hidden work", "completed")
	c := h.client("")
	base := map[string]any{"machine": "mac", "project": "api", "prompt": "x"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for kk, vv := range base {
			m[kk] = vv
		}
		m[k] = v
		return m
	}
	c.fails("t3_dispatch", with("machine", "pc"), `unknown machine "pc"`)
	c.fails("t3_dispatch", with("project", "nope"), `project "nope" not found on machine "mac"`, `"api"`)
	c.fails("t3_dispatch", with("project", "secret"), `project "secret" not found`)
	c.fails("t3_dispatch", with("prompt", "   "), "prompt is empty")
	c.fails("t3_dispatch", with("prompt", strings.Repeat("y", 51)), "51 characters", "limit of 50")
	c.fails("t3_dispatch", with("model", "codex/nope"), `"codex/nope" is not available`, "codex/gpt-5.6-sol")
	c.fails("t3_dispatch", with("thread_id", hidden), "not found")
	for _, tool := range []string{"t3_thread", "t3_wait", "t3_interrupt"} {
		c.fails(tool, map[string]any{"thread_id": hidden}, "not found")
		c.fails(tool, map[string]any{"thread_id": "thread-nope"}, `thread "thread-nope" not found`)
	}
	c.fails("t3_answer", map[string]any{"thread_id": hidden, "answers": map[string]any{"a": "b"}}, "not found")
	c.fails("t3_watch", map[string]any{"thread_id": hidden, "enabled": true}, "not found")
	c.fails("t3_watch", map[string]any{"thread_id": hidden}, "pass both")
	c.fails("t3_thread", map[string]any{"thread_id": 42}, `argument "thread_id" must be a string; got the number 42`)
	c.fails("t3_wait", map[string]any{"thread_id": "x", "timeout": 999999}, "timeout")
	// The server is still healthy after all of that.
	if h.health()["ok"] != true {
		t.Fatalf("health = %v", h.health())
	}
}

func projectID(t *testing.T, h *harness, title string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, p := range h.app.Fleet.Machines()[0].Watcher().Projects() {
			if p.Title == title {
				return p.ID
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no project %q", title)
	return ""
}

// Origins are read per call from each request's header: two clients with
// different origins get their own recorded, and a continuation takes over the
// caller's origin.
func TestOriginPerCallAndWatchList(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	a, b := h.client("origin-A"), h.client("origin-B")
	ta := str(a.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "one"}), "thread_id")
	tb := str(b.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "two", "watch": false}), "thread_id")
	origins := func() map[string]map[string]any {
		out := map[string]map[string]any{}
		for _, x := range a.ok("t3_watch", nil)["threads"].([]any) {
			m := x.(map[string]any)
			out[m["thread_id"].(string)] = m
		}
		return out
	}
	o := origins()
	if o[ta]["origin"] != "origin-A" || o[tb]["origin"] != "origin-B" || o[ta]["watching"] != true || o[tb]["watching"] != false {
		t.Fatalf("tracked = %v", o)
	}
	a.ok("t3_wait", map[string]any{"thread_id": tb, "timeout": 20})
	a.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tb, "prompt": "continue"})
	if o := origins(); o[tb]["origin"] != "origin-A" || o[tb]["watching"] != true {
		t.Fatalf("after continuation: %v", o[tb])
	}
	out := b.ok("t3_watch", map[string]any{"thread_id": ta, "enabled": false})
	if out["thread"].(map[string]any)["watching"] != false {
		t.Fatalf("watch off = %v", out)
	}
}

// The state file keeps tracked threads: a restarted connector still knows
// them, with their origins, and can wait on them.
func TestRestartKeepsTrackedThreads(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	tid := str(h.client("keep-me").ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "persist"}), "thread_id")
	h.stop()
	h2 := newHarness(t, harnessOpts{fake: h.fake, stateDir: h.stateDir})
	h2.waitOnline("mac")
	c := h2.client("")
	var found bool
	for _, x := range c.ok("t3_watch", nil)["threads"].([]any) {
		m := x.(map[string]any)
		found = found || (m["thread_id"] == tid && m["origin"] == "keep-me")
	}
	if !found {
		t.Fatal("tracked thread lost across a restart")
	}
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "completed" {
		t.Fatalf("wait = %v", w)
	}
}

func TestIncompatibleAndMisconfiguredMachines(t *testing.T) {
	old := t3fake.StartT(t, t3fake.Options{Label: "old-box", Protocol: 1})
	t.Setenv("T3CODE_MCP_TEST_OLD_TOKEN", old.Token())
	extra := "[machines.old]\nurl = \"" + old.URL() + "\"\ntoken_env = \"T3CODE_MCP_TEST_OLD_TOKEN\"\n" +
		"[machines.nokey]\nurl = \"http://127.0.0.1:1\"\ntoken_env = \"T3CODE_MCP_TEST_UNSET_VAR\"\n"
	h := newHarness(t, harnessOpts{extraTOML: extra})
	h.waitOnline("mac")
	c := h.client("")
	deadline := time.Now().Add(10 * time.Second)
	var byName map[string]map[string]any
	for time.Now().Before(deadline) {
		byName = map[string]map[string]any{}
		for _, x := range c.ok("t3_machines", nil)["machines"].([]any) {
			m := x.(map[string]any)
			byName[m["name"].(string)] = m
		}
		if byName["old"]["status"] == "incompatible" {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if byName["old"]["status"] != "incompatible" || !strings.Contains(str(byName["old"], "problem"), `machine "old" runs T3 Code 0.0.45 (orchestration protocol 1); t3code-mcp needs T3 Code 0.1.0 or later (protocol 2)`) {
		t.Fatalf("old = %v", byName["old"])
	}
	if byName["nokey"]["status"] != "misconfigured" || !strings.Contains(str(byName["nokey"], "problem"), "T3CODE_MCP_TEST_UNSET_VAR") {
		t.Fatalf("nokey = %v", byName["nokey"])
	}
	if byName["mac"]["status"] != "online" {
		t.Fatalf("mac = %v", byName["mac"])
	}
	c.fails("t3_projects", map[string]any{"machine": "old"}, "protocol 1")
	c.fails("t3_dispatch", map[string]any{"machine": "nokey", "project": "x", "prompt": "y"}, "T3CODE_MCP_TEST_UNSET_VAR")
	if h.health()["ok"] != false {
		t.Fatal("health ok with two machines down")
	}
}

// Clients speaking MCP 2025-06-18, 2025-11-25 and 2026-07-28 all work,
// including origin capture and progress notifications during t3_wait.
func TestProtocolVersions(t *testing.T) {
	h := newHarness(t, harnessOpts{settings: func(s *appSettings) { s.Limits.ProgressEvery = 20 * time.Millisecond }})
	h.waitOnline("mac")
	for _, v := range []string{"2025-06-18", "2025-11-25", "2026-07-28"} {
		c := h.clientVersion("origin-"+v, v)
		if got := c.session.InitializeResult(); got != nil && v < "2026-07-28" && got.ProtocolVersion != v {
			t.Fatalf("%s: negotiated %s", v, got.ProtocolVersion)
		}
		if ms := c.ok("t3_machines", nil)["machines"].([]any); len(ms) != 1 {
			t.Fatalf("%s: machines = %v", v, ms)
		}
		tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "hang on " + v}), "thread_id")
		sc, text, isErr := c.callProgress("t3_wait", map[string]any{"thread_id": tid, "timeout": 1}, "p-"+v)
		if isErr || sc["reason"] != "timeout" {
			t.Fatalf("%s: wait = %v %s", v, sc, text)
		}
		select {
		case p := <-c.progress:
			if p.ProgressToken != "p-"+v {
				t.Fatalf("%s: progress token %v", v, p.ProgressToken)
			}
		default:
			t.Fatalf("%s: no progress notification", v)
		}
		c.ok("t3_interrupt", map[string]any{"thread_id": tid})
		found := false
		for _, x := range c.ok("t3_watch", nil)["threads"].([]any) {
			m := x.(map[string]any)
			found = found || (m["thread_id"] == tid && m["origin"] == "origin-"+v)
		}
		if !found {
			t.Fatalf("%s: origin not recorded", v)
		}
	}
}

// tools/list shows every tool with true annotations and an output schema.
// What MCP defaults to is left out to save context: openWorldHint (true
// when absent) and a read-only tool's destructiveHint.
func TestToolsListAnnotations(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	c := h.client("")
	res, err := c.session.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	readOnly := map[string]bool{"t3_machines": true, "t3_projects": true, "t3_thread": true, "t3_wait": true, "t3_threads": true}
	if len(res.Tools) != 9 {
		t.Fatalf("%d tools", len(res.Tools))
	}
	for _, tl := range res.Tools {
		a := tl.Annotations
		if a == nil || (a.OpenWorldHint != nil && !*a.OpenWorldHint) || a.Title == "" {
			t.Errorf("%s: annotations %+v: want a title and openWorldHint absent (true)", tl.Name, a)
			continue
		}
		if a.ReadOnlyHint != readOnly[tl.Name] {
			t.Errorf("%s: readOnlyHint = %v", tl.Name, a.ReadOnlyHint)
		}
		if d := a.DestructiveHint != nil && *a.DestructiveHint; d != (tl.Name == "t3_interrupt") {
			t.Errorf("%s: destructiveHint = %v", tl.Name, d)
		}
		if tl.OutputSchema == nil || tl.Description == "" {
			t.Errorf("%s: no output schema or description", tl.Name)
		}
	}
}

// A follow-up needs only thread_id and prompt: the thread knows its machine
// and project. A machine or project that does not match is refused, saying
// they can be left out; a new thread without them says what it needs.
func TestFollowUpNeedsOnlyThreadIDAndPrompt(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "first"}), "thread_id")
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30}); w["reason"] != "completed" {
		t.Fatalf("first wait = %v", w)
	}
	if got := str(c.ok("t3_dispatch", map[string]any{"thread_id": tid, "prompt": "second"}), "thread_id"); got != tid {
		t.Fatalf("follow-up went to %q, want %q", got, tid)
	}
	w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30})
	runs, _ := w["state"].(map[string]any)["runs"].([]any)
	if w["reason"] != "completed" || len(runs) == 0 || !strings.HasPrefix(str(runs[len(runs)-1].(map[string]any), "reply"), "Done: second") {
		t.Fatalf("follow-up wait = %v", w)
	}
	c.fails("t3_dispatch", map[string]any{"thread_id": tid, "machine": "other", "prompt": "x"},
		`t3_dispatch: thread "`+tid+`" is on machine "mac", not "other"; with thread_id, machine and project can be left out`)
	c.fails("t3_dispatch", map[string]any{"thread_id": tid, "project": "web", "prompt": "x"},
		`belongs to project "api" (/srv/api), not "web"; with thread_id, machine and project can be left out`)
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "prompt": "x"},
		"t3_dispatch: a new thread needs machine and project (from t3_machines and t3_projects); to continue a thread, pass its thread_id and the prompt only")
}
