package app_test

import (
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// Prompts that pick the fake's request scripts (fixtures 18 and 19).
const (
	promptApproval    = "needs permission to read a file"
	promptElicitation = "elicit a form"
	promptStale       = "a stale request"
)

// askedFor dispatches prompt and waits until the run asks; it returns the
// thread id and the wait's structured result.
func askedFor(t *testing.T, c *client, prompt string) (string, map[string]any) {
	t.Helper()
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": prompt})
	tid := str(d, "thread_id")
	sc, text, isErr := c.call("t3_wait", map[string]any{"thread_id": tid, "timeout": 30})
	if isErr || str(sc, "reason") != "question" {
		t.Fatalf("wait for %q: %v %s", prompt, sc, text)
	}
	sc["text"] = text
	return tid, sc
}

// TestApprovalRequests: a tool permission (fixture 18) reaches the caller as
// a pending approval that names the command, in t3_wait and t3_thread alike;
// it is answered with a decision (accept and decline let the run finish,
// cancel ends it cancelled); answers meant for a question are refused before
// they reach T3, where they would resolve the request and hang the run
// (issue 13.5).
func TestApprovalRequests(t *testing.T) {
	leakCheck(t)
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("approvals")

	tid, w := askedFor(t, c, promptApproval)
	if str(w, "state", "pending_question", "kind") != "approval" {
		t.Fatalf("pending %v", w["state"])
	}
	pq := w["state"].(map[string]any)["pending_question"].(map[string]any)
	q := pq["questions"].([]any)[0].(map[string]any)
	if !strings.Contains(q["text"].(string), t3fake.ApprovalCommand) || !strings.Contains(q["text"].(string), "command") {
		t.Errorf("approval text %q does not name the command", q["text"])
	}
	if pq["answerable"] == false {
		t.Errorf("a live approval marked not answerable: %v", pq)
	}
	for _, want := range []string{"waiting for a decision", t3fake.ApprovalCommand, "accept | acceptForSession | decline | cancel"} {
		if !strings.Contains(w["text"].(string), want) {
			t.Errorf("t3_wait text lacks %q:\n%s", want, w["text"])
		}
	}
	_, thText, _ := c.call("t3_thread", map[string]any{"thread_id": tid})
	if !strings.Contains(thText, "waiting for a decision") || !strings.Contains(thText, t3fake.ApprovalCommand) {
		t.Errorf("t3_thread text:\n%s", thText)
	}

	accepted := h.accepted()
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"approved": "true"}}, "asks permission", "decision", "hang")
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"x": "y"}, "decision": "accept"}, "not both")
	if h.accepted() != accepted {
		t.Fatal("a refused answer reached T3")
	}
	c.ok("t3_answer", map[string]any{"thread_id": tid, "decision": "accept"})
	if r := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30}); str(r, "reason") != "completed" {
		t.Fatalf("after accept: %v", r)
	}

	// cancel ends the run cancelled (which t3_wait reports as interrupted).
	tid2, _ := askedFor(t, c, promptApproval)
	c.ok("t3_answer", map[string]any{"thread_id": tid2, "decision": "cancel"})
	r := c.ok("t3_wait", map[string]any{"thread_id": tid2, "timeout": 30})
	if str(r, "reason") != "interrupted" || str(r, "run_status") != "cancelled" || str(r, "state", "latest_run", "status") != "cancelled" {
		t.Fatalf("after cancel: %v", r)
	}

	// The older form, one answer keyed by the request id naming a decision,
	// keeps working.
	tid3, w3 := askedFor(t, c, promptApproval)
	req := str(w3, "state", "pending_question", "request_id")
	c.ok("t3_answer", map[string]any{"thread_id": tid3, "answers": map[string]any{req: "decline"}})
	if r := c.ok("t3_wait", map[string]any{"thread_id": tid3, "timeout": 30}); str(r, "reason") != "completed" {
		t.Fatalf("after decline: %v", r)
	}
	if got, _ := h.fake.Answers(req); strings.Join(got["decision"], ",") != "decline" {
		t.Errorf("T3 got %v", got)
	}
}

// TestApprovalCancelReportsTheRunsStatus: a run ended by an approval's cancel
// decision keeps the contract's three event types (thread.interrupted) and
// wait reasons (interrupted), and the caller sees the truth beside them:
// run_status "cancelled" in the t3_wait result (and its text) and in the
// webhook body. A completed run says run_status "completed".
func TestApprovalCancelReportsTheRunsStatus(t *testing.T) {
	leakCheck(t)
	h := newHarness(t, harnessOpts{hook: true})
	h.waitOnline("mac")
	c := h.client("cancel-approval")

	tid, w := askedFor(t, c, promptApproval)
	if d := h.hook.next(t); d.event["type"] != "thread.question" || d.event["run_status"] != nil {
		t.Fatalf("question event %v: want thread.question without run_status", d.event)
	}
	run := str(w, "state", "latest_run", "id")
	c.ok("t3_answer", map[string]any{"thread_id": tid, "decision": "cancel"})
	sc, text, isErr := c.call("t3_wait", map[string]any{"thread_id": tid, "timeout": 30})
	if isErr || str(sc, "reason") != "interrupted" || str(sc, "run_status") != "cancelled" || str(sc, "run_id") != run {
		t.Fatalf("t3_wait after cancel: %v %s", sc, text)
	}
	if !strings.HasPrefix(text, "interrupted (run cancelled): ") {
		t.Fatalf("t3_wait text %q: want it to say the run was cancelled", text)
	}
	d := h.hook.next(t)
	if d.event["type"] != "thread.interrupted" || d.event["run_status"] != "cancelled" || d.event["run_id"] != run {
		t.Fatalf("event after cancel: %v", d.event)
	}

	d2 := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "please finish"})
	r := c.ok("t3_wait", map[string]any{"thread_id": str(d2, "thread_id"), "timeout": 30})
	if str(r, "reason") != "completed" || str(r, "run_status") != "completed" {
		t.Fatalf("t3_wait on a completed run: %v", r)
	}
	if e := h.hook.next(t); e.event["type"] != "thread.completed" || e.event["run_status"] != "completed" {
		t.Fatalf("completed event %v", e.event)
	}
}

// TestElicitationAndQuestionKinds: a form elicitation is a user_input question
// (fixture 19) answered with answers; a decision sent to a question is refused.
func TestElicitationAndQuestionKinds(t *testing.T) {
	leakCheck(t)
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("elicit")
	tid, w := askedFor(t, c, promptElicitation)
	if str(w, "state", "pending_question", "kind") != "user_input" || !strings.Contains(dump(w, "state", "pending_question", "questions"), "Approve this request?") {
		t.Fatalf("pending %v", w["state"])
	}
	c.fails("t3_answer", map[string]any{"thread_id": tid, "decision": "accept"}, "is a question", "answers")
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"approved": "maybe"}}, `"true"`, `"false"`)
	c.ok("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"approved": "true"}})
	if r := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30}); str(r, "reason") != "completed" {
		t.Fatalf("after the answer: %v", r)
	}
}

// TestNotResumableRequestIsReportedNeverAnswered: a request T3 can no longer
// deliver an answer to is shown as not answerable, with T3's reason, and
// t3_answer refuses it; the run is ended with t3_interrupt.
func TestNotResumableRequestIsReportedNeverAnswered(t *testing.T) {
	leakCheck(t)
	h := newHarness(t, harnessOpts{})
	h.waitOnline("mac")
	c := h.client("stale")
	tid, w := askedFor(t, c, promptStale)
	pq := w["state"].(map[string]any)["pending_question"].(map[string]any)
	if pq["answerable"] != false || !strings.Contains(str(pq, "not_answerable_reason"), t3fake.NotResumableReason) {
		t.Fatalf("pending %v", pq)
	}
	if !strings.Contains(w["text"].(string), "can no longer be answered") {
		t.Errorf("t3_wait text:\n%s", w["text"])
	}
	accepted := h.accepted()
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": map[string]any{"scope": "Workspace", "checks": []string{"lint"}}}, "cannot be answered", "t3_interrupt")
	if h.accepted() != accepted {
		t.Fatal("an answer to a not_resumable request reached T3")
	}
	c.ok("t3_interrupt", map[string]any{"thread_id": tid})
	if r := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 30}); str(r, "reason") != "interrupted" {
		t.Fatalf("after interrupt: %v", r)
	}
}
