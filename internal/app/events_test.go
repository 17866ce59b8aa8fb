package app_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// verify checks a Standard Webhooks signature, written from the spec:
// v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>.
func verify(t *testing.T, secret string, d delivery) {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatal(err)
	}
	id, ts := d.header.Get("webhook-id"), d.header.Get("webhook-timestamp")
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(d.body)))
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Fields(d.header.Get("webhook-signature")) {
		if hmac.Equal([]byte(sig), []byte(want)) {
			return
		}
	}
	t.Fatalf("signature %q does not verify", d.header.Get("webhook-signature"))
}

func TestEventsEndToEnd(t *testing.T) {
	h := newHarness(t, harnessOpts{hook: true})
	h.waitOnline("mac")
	c := h.client("conversation-9")
	want := map[string]string{
		"please finish":    "thread.completed",
		"this should fail": "thread.failed",
		"a question first": "thread.question",
	}
	threads := map[string]string{}
	for prompt, typ := range want {
		tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": prompt}), "thread_id")
		threads[tid] = typ
	}
	got := map[string]string{}
	for range want {
		d := h.hook.next(t)
		if d.header.Get("Authorization") != "Bearer hook-token-7f3a" || d.header.Get("Content-Type") != "application/json" {
			t.Fatalf("headers = %v", d.header)
		}
		if d.header.Get("webhook-id") != d.event["id"] {
			t.Fatalf("webhook-id %q != event id %v", d.header.Get("webhook-id"), d.event["id"])
		}
		verify(t, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", d)
		ev := d.event
		if ev["origin"] != "conversation-9" || ev["machine"] != "mac" || str(ev, "project", "title") != "api" || ev["run_id"] == "" {
			t.Fatalf("event = %v", ev)
		}
		tid := ev["thread_id"].(string)
		got[tid] = ev["type"].(string)
		switch ev["type"] {
		case "thread.completed":
			if !strings.HasPrefix(str(ev, "summary"), "Done: please finish") {
				t.Errorf("summary = %v", ev["summary"])
			}
		case "thread.failed":
			if !strings.Contains(str(ev, "error"), "Simulated provider failure") {
				t.Errorf("error = %v", ev["error"])
			}
		case "thread.question":
			q := ev["question"].(map[string]any)
			if q["kind"] != "user_input" || len(q["questions"].([]any)) != 2 {
				t.Errorf("question = %v", q)
			}
		}
	}
	for tid, typ := range threads {
		if got[tid] != typ {
			t.Fatalf("thread %s: got %q, want %q (all: %v)", tid, got[tid], typ, got)
		}
	}
	if ev := h.health()["events"].(map[string]any); ev["enabled"] != true {
		t.Fatalf("health events = %v", ev)
	}
}

func TestNoHookNoEvents(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	ev := h.health()["events"].(map[string]any)
	if ev["enabled"] != false || !strings.Contains(ev["reason"].(string), "T3CODE_MCP_HOOK_URL") {
		t.Fatalf("health events = %v", ev)
	}
	c := h.client("")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "go"}), "thread_id")
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "completed" {
		t.Fatalf("wait without hook = %v", w)
	}
	if p, d, _, _ := h.app.Store.Counts(); p+d != 0 {
		t.Fatalf("events recorded without a hook: %d pending, %d dead", p, d)
	}
}

// TestPlainCompletionNeedsNoThreadRead: a run that completes with a reply is delivered complete
// (its summary from the shell row's latest message) without a read of its thread: every read of
// it hangs, and the fake counts none. Its failure twin still gets its error from T3.
func TestPlainCompletionNeedsNoThreadRead(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{hook: true, fake: fk})
	h.waitOnline("mac")
	c := h.client("conversation-9")
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "please finish"}), "thread_id")
	fk.HangThreadReads(tid, true)
	defer fk.HangThreadReads(tid, false)
	before := readsOf(fk)
	fk.StepAll()
	d := h.hook.next(t)
	ev := d.event
	if ev["type"] != "thread.completed" || ev["thread_id"] != tid || !strings.HasPrefix(str(ev, "summary"), "Done: please finish") || ev["partial"] != nil || ev["run_status"] != "completed" {
		t.Fatalf("event = %v", ev)
	}
	if n := readsOf(fk).minus(before); n != (threadReads{}) {
		t.Fatalf("reads of the thread for a plain completion: %+v", n)
	}

	failing := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "this should fail"}), "thread_id")
	fk.StepAll()
	d = h.hook.next(t)
	if d.event["type"] != "thread.failed" || d.event["thread_id"] != failing || !strings.Contains(str(d.event, "error"), "Simulated provider failure") {
		t.Fatalf("event = %v", d.event)
	}
	if readsOf(fk) == before {
		t.Fatal("the failure was delivered without reading its thread: where did its error come from?")
	}
}
