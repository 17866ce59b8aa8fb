package app_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// person plays the human behind an MCP client that supports elicitation: it
// records every question and answers with the next scripted reply.
type person struct {
	mu      sync.Mutex
	asked   []*mcp.ElicitParams
	replies []*mcp.ElicitResult
}

func (p *person) answer(_ context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.asked = append(p.asked, req.Params)
	if len(p.replies) == 0 {
		return &mcp.ElicitResult{Action: "cancel"}, nil
	}
	r := p.replies[0]
	p.replies = p.replies[1:]
	return r, nil
}

// will queues replies.
func (p *person) will(rs ...*mcp.ElicitResult) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.replies = append(p.replies, rs...)
}

// last is the last question asked, and how many were asked.
func (p *person) last() (*mcp.ElicitParams, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.asked) == 0 {
		return nil, 0
	}
	return p.asked[len(p.asked)-1], len(p.asked)
}

var (
	approve   = &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}
	unticked  = &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": false}}
	decline   = &mcp.ElicitResult{Action: "decline"}
	cancelled = &mcp.ElicitResult{Action: "cancel"}
)

// elicitingClient is an MCP client over real HTTP whose person answers
// approval questions.
func (h *harness) elicitingClient(origin string, answer func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error)) *client {
	h.t.Helper()
	c := &client{t: h.t, progress: make(chan *mcp.ProgressNotificationParams, 100)}
	mc := mcp.NewClient(&mcp.Implementation{Name: "approving-agent", Version: "2.5"}, &mcp.ClientOptions{ElicitationHandler: answer})
	hdr := http.Header{}
	if origin != "" {
		hdr.Set("X-Conversation-Origin", origin)
	}
	tr := &mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{Transport: headerRT{hdr, http.DefaultTransport}}}
	s, err := mc.Connect(context.Background(), tr, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	c.session = s
	h.t.Cleanup(func() { s.Close() })
	return c
}

// auditLines reads every line of the audit log, oldest first.
func (h *harness) auditLines() []audit.Record {
	h.t.Helper()
	var out []audit.Record
	bad, err := audit.Scan(h.stateDir, audit.Filter{}, func(_ []byte, r audit.Record) error {
		out = append(out, r)
		return nil
	})
	if err != nil || bad != 0 {
		h.t.Fatalf("reading the audit log: %v (%d bad lines)", err, bad)
	}
	return out
}

// auditRaw is the audit log's bytes.
func (h *harness) auditRaw() string {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.stateDir, audit.FileName))
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

// knownProject waits until the machine's watcher knows the project (it may
// come online a moment before its project list arrives) and returns its id.
func knownProject(t *testing.T, h *harness, title string) string {
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
	t.Fatalf("machine never listed project %q", title)
	return ""
}

// knownThread waits until the connector's watcher has seen a thread added
// on the fake T3.
func knownThread(t *testing.T, h *harness, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := h.app.Fleet.Thread(id); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("the connector never saw thread %s", id)
}

func (h *harness) accepted() int64 { return h.fake.Stats().CommandsAccepted }

func wantAudit(t *testing.T, r audit.Record, tool, machine, approval, result string) {
	t.Helper()
	if r.Tool != tool || r.Machine != machine || r.Approval != approval || r.Result != result || r.Time.IsZero() {
		t.Fatalf("audit line = %+v, want tool %s machine %s approval %s result %s", r, tool, machine, approval, result)
	}
}

func contains(t *testing.T, what, text string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(text, w) {
			t.Fatalf("%s does not contain %q:\n%s", what, w, text)
		}
	}
}

// A read-only machine serves the five reading tools and refuses the three
// mutating ones, with one message naming the policy; nothing reaches T3 and
// each refusal leaves an audit line.
func TestReadOnlyMachineRefusesMutatingTools(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "access = \"read\"\n"})
	h.waitOnline("mac")
	busy := h.fake.AddThread(knownProject(t, h, "api"), "busy", "running")
	knownThread(t, h, busy)
	c := h.client("ro-chat")

	c.ok("t3_machines", nil)
	c.ok("t3_projects", map[string]any{"machine": "mac"})
	c.ok("t3_thread", map[string]any{"thread_id": busy})
	if w := c.ok("t3_wait", map[string]any{"thread_id": busy, "timeout": 1}); w["reason"] != "timeout" {
		t.Fatalf("wait = %v", w)
	}
	c.ok("t3_watch", map[string]any{"thread_id": busy, "enabled": true})
	c.ok("t3_watch", nil)

	policy := []string{`machine "mac" is read-only (access = "read" in t3code.toml)`, "t3_machines, t3_projects, t3_threads, t3_thread, t3_wait and t3_watch", `access = "operate" for [machines.mac]`}
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "change things"}, append(policy, "t3_dispatch:", "start threads or send prompts")...)
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": busy, "prompt": "more"}, append(policy, "t3_dispatch:")...)
	c.fails("t3_interrupt", map[string]any{"thread_id": busy}, append(policy, "t3_interrupt:", "interrupt runs")...)
	c.fails("t3_answer", map[string]any{"thread_id": busy, "answers": map[string]any{"q": "a"}}, append(policy, "t3_answer:", "answer questions")...)
	if n := h.accepted(); n != 0 {
		t.Fatalf("T3 accepted %d commands from a read-only machine's tools", n)
	}
	if st, _ := h.fake.ThreadStatus(busy); st != "running" {
		t.Fatalf("busy thread is %s", st)
	}

	lines := h.auditLines()
	if len(lines) != 4 {
		t.Fatalf("audit has %d lines, want one per mutating call (4): %+v", len(lines), lines)
	}
	for i, tool := range []string{"t3_dispatch", "t3_dispatch", "t3_interrupt", "t3_answer"} {
		r := lines[i]
		wantAudit(t, r, tool, "mac", audit.NotReached, audit.ResultError)
		if !strings.Contains(r.Error, "read-only") || r.Origin != "ro-chat" || r.Client.Name != "test-agent" || r.Client.Version != "1" {
			t.Fatalf("line %d = %+v", i, r)
		}
	}
	if lines[1].Thread != busy || lines[2].Thread != busy || lines[2].Project != "api" {
		t.Fatalf("thread/project not recorded: %+v", lines[1:3])
	}
}

// approve = ["dispatch"]: the person sees machine, project, thread, model,
// runtime mode and the whole prompt; only accept with approve ticked sends
// anything, and each outcome leaves its audit line.
func TestDispatchApproval(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"dispatch\"]\n"})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	p := &person{}
	c := h.elicitingClient("chat-42", p.answer)
	prompt := "Rewrite the changelog for the 2.0 release.\n\nKeep every entry, group them by area, and link each one to its pull request. " +
		strings.Repeat("Be thorough. ", 20) + "END-OF-PROMPT"
	args := map[string]any{"machine": "mac", "project": "api", "prompt": prompt}
	threads := len(h.fake.ThreadIDs())
	// Over the stateful HTTP transport the protocol is one in which the
	// connector asks with an elicitation request during the call.
	if v := c.session.InitializeResult().ProtocolVersion; v >= "2026-07-28" {
		t.Fatalf("HTTP session negotiated %s", v)
	}

	for _, tc := range []struct {
		reply    *mcp.ElicitResult
		approval string
		want     []string
	}{
		{decline, audit.Declined, []string{"t3_dispatch: the person declined starting a new thread on machine \"mac\"", "nothing was sent to T3"}},
		{cancelled, audit.Cancelled, []string{"was cancelled (dismissed without a decision)", "nothing was sent to T3"}},
		{unticked, audit.Declined, []string{"declined", `without ticking "approve"`, "nothing was sent to T3"}},
	} {
		p.will(tc.reply)
		c.fails("t3_dispatch", args, tc.want...)
		if n := h.accepted(); n != 0 {
			t.Fatalf("%s: T3 accepted %d commands", tc.approval, n)
		}
		if n := len(h.fake.ThreadIDs()); n != threads {
			t.Fatalf("%s: T3 has %d threads, had %d", tc.approval, n, threads)
		}
	}
	p.will(approve)
	out := c.ok("t3_dispatch", args)
	tid := str(out, "thread_id")
	if !slices.Contains(h.fake.ThreadIDs(), tid) || h.accepted() != 2 {
		t.Fatalf("after approval: thread %s on T3: %v, commands accepted %d", tid, h.fake.ThreadIDs(), h.accepted())
	}

	// What the person saw, the last time and every time.
	q, asked := p.last()
	if asked != 4 {
		t.Fatalf("asked %d times, want 4", asked)
	}
	model := t3fake.ProviderInstance + "/" + t3fake.ProviderModel
	contains(t, "approval message", q.Message,
		`Approve starting a new thread on machine "mac"?`,
		`approve = ["dispatch"] for [machines.mac] in t3code.toml`,
		"machine:", "mac ("+h.fake.URL()+")",
		"project:", "api (/srv/api)",
		"thread:", `new, titled "Rewrite the changelog for the 2.0 release."`,
		"model:", model,
		"runtime mode:", "full-access",
		"requested by:", "approving-agent 2.5",
		"origin:", "chat-42",
		"Prompt (", "characters, in full):\n"+prompt)
	if q.Mode != "form" {
		t.Fatalf("mode = %q", q.Mode)
	}
	schema, _ := json.Marshal(q.RequestedSchema)
	var sch struct {
		Type       string
		Required   []string
		Properties map[string]struct {
			Type    string
			Title   string
			Default any
		}
	}
	if err := json.Unmarshal(schema, &sch); err != nil {
		t.Fatal(err)
	}
	if ap := sch.Properties["approve"]; sch.Type != "object" || len(sch.Properties) != 1 || ap.Type != "boolean" || ap.Default != false || !slices.Contains(sch.Required, "approve") {
		t.Fatalf("requested schema = %s", schema)
	}

	lines := h.auditLines()
	if len(lines) != 4 {
		t.Fatalf("audit has %d lines: %+v", len(lines), lines)
	}
	sum := sha256.Sum256([]byte(prompt))
	for i, want := range []string{audit.Declined, audit.Cancelled, audit.Declined, audit.Accepted} {
		r := lines[i]
		result := audit.ResultError
		if want == audit.Accepted {
			result = audit.ResultOK
		}
		wantAudit(t, r, "t3_dispatch", "mac", want, result)
		if r.Project != "api" || r.Model != model || r.Origin != "chat-42" || r.Client != (audit.Client{Name: "approving-agent", Version: "2.5"}) || r.Thread == "" {
			t.Fatalf("line %d = %+v", i, r)
		}
		if r.PromptSHA256 != hex.EncodeToString(sum[:]) || r.PromptChars != len([]rune(prompt)) || r.PromptPrefix != prompt[:audit.PromptPrefixChars]+"…" {
			t.Fatalf("line %d prompt fields = %q %d %q", i, r.PromptSHA256, r.PromptChars, r.PromptPrefix)
		}
	}
	if lines[3].Thread != tid || lines[3].Error != "" {
		t.Fatalf("accepted line = %+v", lines[3])
	}
	raw := h.auditRaw()
	if strings.Contains(raw, "END-OF-PROMPT") || strings.Contains(raw, "Be thorough. Be thorough. Be thorough. Be thorough.") {
		t.Fatal("the audit log holds more than the prompt's prefix")
	}
	if strings.Contains(raw, h.fake.Token()) {
		t.Fatal("the audit log holds the machine's token")
	}

	// A continuation asks too, naming the thread and its model.
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "completed" {
		t.Fatalf("wait = %v", w)
	}
	p.will(decline)
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "thread_id": tid, "prompt": "and the README"}, "declined sending a prompt to thread "+tid)
	q, _ = p.last()
	contains(t, "continuation approval", q.Message, "thread:", tid, "now completed", model+" (unchanged)", "characters, in full):\nand the README")
	if h.accepted() != 2 {
		t.Fatalf("a declined continuation sent commands: %d", h.accepted())
	}
}

// A client without elicitation gets an error that says approval is needed
// and how to change that; nothing is sent.
func TestApprovalWithoutElicitationSupport(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"dispatch\", \"interrupt\"]\n"})
	h.waitOnline("mac")
	busy := h.fake.AddThread(knownProject(t, h, "api"), "busy", "running")
	knownThread(t, h, busy)
	c := h.client("no-forms")
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "do it"},
		`machine "mac" requires a person's approval for dispatch`, `approve = ["dispatch", "interrupt"] for [machines.mac] in t3code.toml`,
		"this MCP client (test-agent 1) cannot ask for one", "elicitation", "Nothing was sent to T3", `removes "dispatch" from approve`)
	c.fails("t3_interrupt", map[string]any{"thread_id": busy}, "approval for interrupt", "elicitation")
	if h.accepted() != 0 {
		t.Fatalf("T3 accepted %d commands", h.accepted())
	}
	if st, _ := h.fake.ThreadStatus(busy); st != "running" {
		t.Fatalf("busy thread is %s", st)
	}
	lines := h.auditLines()
	if len(lines) != 2 {
		t.Fatalf("audit = %+v", lines)
	}
	wantAudit(t, lines[0], "t3_dispatch", "mac", audit.Unsupported, audit.ResultError)
	wantAudit(t, lines[1], "t3_interrupt", "mac", audit.Unsupported, audit.ResultError)
	if lines[1].Run == "" || lines[1].Thread != busy {
		t.Fatalf("interrupt line = %+v", lines[1])
	}
}

// approve = ["interrupt"]: dispatch needs none; the interrupt shows thread,
// run and reason, and a declined one leaves the run going.
func TestInterruptApproval(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"interrupt\"]\n"})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	p := &person{}
	c := h.elicitingClient("", p.answer)
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "hang around"}), "thread_id")
	if _, n := p.last(); n != 0 {
		t.Fatal("dispatch asked for approval though only interrupt needs it")
	}
	// The connector sees the run start a moment after dispatch returns.
	for deadline := time.Now().Add(10 * time.Second); c.ok("t3_thread", map[string]any{"thread_id": tid})["status"] != "running"; {
		if time.Now().After(deadline) {
			t.Fatal("the run never showed as running")
		}
		time.Sleep(5 * time.Millisecond)
	}
	sent := h.accepted()
	for _, reply := range []*mcp.ElicitResult{decline, cancelled} {
		p.will(reply)
		c.fails("t3_interrupt", map[string]any{"thread_id": tid}, "nothing was sent to T3")
	}
	if h.accepted() != sent {
		t.Fatalf("declined interrupts sent %d commands", h.accepted()-sent)
	}
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 1}); w["reason"] != "timeout" {
		t.Fatalf("the run stopped after declined interrupts: %v", w)
	}
	p.will(approve)
	out := c.ok("t3_interrupt", map[string]any{"thread_id": tid})
	run := str(out, "run_id")
	q, _ := p.last()
	contains(t, "interrupt approval", q.Message, "Approve interrupting run "+run+` on machine "mac"?`, "thread:", tid, `titled "hang around"`, "run:", run, "reason:", "interrupted through t3code-mcp")
	if w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20}); w["reason"] != "interrupted" {
		t.Fatalf("wait = %v", w)
	}
	lines := h.auditLines()
	if len(lines) != 4 {
		t.Fatalf("audit = %+v", lines)
	}
	wantAudit(t, lines[0], "t3_dispatch", "mac", audit.NotRequired, audit.ResultOK)
	wantAudit(t, lines[1], "t3_interrupt", "mac", audit.Declined, audit.ResultError)
	wantAudit(t, lines[2], "t3_interrupt", "mac", audit.Cancelled, audit.ResultError)
	wantAudit(t, lines[3], "t3_interrupt", "mac", audit.Accepted, audit.ResultOK)
	if lines[3].Run != run || lines[3].Thread != tid || lines[1].Run != run {
		t.Fatalf("interrupt lines = %+v", lines[1:])
	}
}

// approve = ["answer"]: the person sees each question, its options and the
// answers that will be sent.
func TestAnswerApproval(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"answer\"]\n"})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	p := &person{}
	c := h.elicitingClient("", p.answer)
	tid := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "ask me a question first"}), "thread_id")
	w := c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
	if w["reason"] != "question" {
		t.Fatalf("wait = %v", w)
	}
	reqID := str(w, "state", "pending_question", "request_id")
	answers := map[string]any{"scope": "Workspace", "checks": []any{"lint", "test"}}
	p.will(decline)
	c.fails("t3_answer", map[string]any{"thread_id": tid, "answers": answers}, "declined answering the agent's question on thread "+tid, "nothing was sent to T3")
	if _, ok := h.fake.Answers(reqID); ok {
		t.Fatal("T3 got answers after a decline")
	}
	q, _ := p.last()
	contains(t, "answer approval", q.Message, "request:", reqID, "Questions, and the answers that will be sent:",
		"[Scope] Which scope should I use?", "options: Workspace | Session", `answer:  "Workspace"`,
		"[Checks] Which checks should I run?", "options: lint | test", `answer:  "lint", "test"`)
	p.will(approve)
	c.ok("t3_answer", map[string]any{"thread_id": tid, "answers": answers})
	if got, ok := h.fake.Answers(reqID); !ok || got["scope"][0] != "Workspace" || len(got["checks"]) != 2 {
		t.Fatalf("T3 received %v", got)
	}
	lines := h.auditLines()
	wantAudit(t, lines[len(lines)-2], "t3_answer", "mac", audit.Declined, audit.ResultError)
	wantAudit(t, lines[len(lines)-1], "t3_answer", "mac", audit.Accepted, audit.ResultOK)
	if r := lines[len(lines)-1]; r.Request != reqID || r.Thread != tid || r.Project != "api" {
		t.Fatalf("answer line = %+v", r)
	}
}

// A client that fails the approval request leaves nothing sent and a
// failed approval in the audit log.
func TestApprovalRequestFails(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"dispatch\"]\n"})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	c := h.elicitingClient("", func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		return nil, errors.New("the form could not be shown")
	})
	c.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x"}, `asking for approval on machine "mac" failed`, "the form could not be shown", "nothing was sent to T3")
	if h.accepted() != 0 {
		t.Fatalf("T3 accepted %d commands", h.accepted())
	}
	lines := h.auditLines()
	if len(lines) != 1 {
		t.Fatalf("audit = %+v", lines)
	}
	wantAudit(t, lines[0], "t3_dispatch", "mac", audit.Failed, audit.ResultError)
}

// The person's time does not count against the call timeout: an approval
// given after T3CODE_MCP_CALL_TIMEOUT has passed still sends.
func TestApprovalTimeIsNotCallTime(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"dispatch\"]\n", settings: func(s *appSettings) { s.Limits.CallTimeout = time.Second }})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	p := &person{}
	p.will(approve)
	c := h.elicitingClient("", func(ctx context.Context, req *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
		time.Sleep(1500 * time.Millisecond) // longer than the call timeout
		return p.answer(ctx, req)
	})
	c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "take your time"})
	if h.accepted() != 2 {
		t.Fatalf("T3 accepted %d commands", h.accepted())
	}
}

// modernClient connects over an in-memory transport, where client and server
// agree on protocol 2026-07-28: the server may not send requests during a
// call, so approval goes back as an input-required result.
func modernClient(t *testing.T, h *harness, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	ss, err := h.app.MCP.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "modern-agent", Version: "9"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close(); ss.Wait() })
	if v := cs.InitializeResult().ProtocolVersion; v < "2026-07-28" {
		t.Skipf("the SDK negotiated %s: no input-required results to test", v)
	}
	return cs
}

func callRaw(t *testing.T, cs *mcp.ClientSession, p *mcp.CallToolParams) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", p.Name, err)
	}
	return res
}

func callText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// Protocol 2026-07-28 and later: the SDK client answers the input request
// through its elicitation handler and retries; the approval counts for that
// call only.
func TestApprovalThroughInputRequests(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"dispatch\"]\n"})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	p := &person{}
	cs := modernClient(t, h, &mcp.ClientOptions{ElicitationHandler: p.answer})
	args := map[string]any{"machine": "mac", "project": "api", "prompt": "modern times"}

	p.will(decline)
	if res := callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args}); !res.IsError || !strings.Contains(callText(res), "declined") {
		t.Fatalf("declined call = %v %q", res.IsError, callText(res))
	}
	if h.accepted() != 0 {
		t.Fatal("a declined call sent commands")
	}
	p.will(approve)
	res := callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args})
	if res.IsError || h.accepted() != 2 {
		t.Fatalf("approved call = %q, commands %d", callText(res), h.accepted())
	}
	q, n := p.last()
	if n != 2 {
		t.Fatalf("asked %d times", n)
	}
	contains(t, "approval message", q.Message, `Approve starting a new thread on machine "mac"?`, "full-access", "modern-agent 9", "in full):\nmodern times")

	lines := h.auditLines()
	if len(lines) != 4 {
		t.Fatalf("audit = %+v", lines)
	}
	wantAudit(t, lines[0], "t3_dispatch", "mac", audit.Requested, audit.ResultInputRequired)
	wantAudit(t, lines[1], "t3_dispatch", "mac", audit.Declined, audit.ResultError)
	wantAudit(t, lines[2], "t3_dispatch", "mac", audit.Requested, audit.ResultInputRequired)
	wantAudit(t, lines[3], "t3_dispatch", "mac", audit.Accepted, audit.ResultOK)
	if lines[3].Client.Name != "modern-agent" {
		t.Fatalf("client = %+v", lines[3].Client)
	}
}

// An approval answer binds to its question: replaying it, or carrying it to
// different arguments, sends nothing.
func TestInputRequestApprovalCannotBeReusedOrMoved(t *testing.T) {
	h := newHarness(t, harnessOpts{extraTOML: "approve = [\"dispatch\"]\n"})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	cs := modernClient(t, h, &mcp.ClientOptions{
		ElicitationHandler: (&person{}).answer,
		MultiRoundTrip:     &mcp.MultiRoundTripOptions{Disabled: true},
	})
	args := map[string]any{"machine": "mac", "project": "api", "prompt": "only this"}
	first := callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args})
	ep, ok := first.InputRequests["approval"].(*mcp.ElicitParams)
	if !first.NeedsInput() || !ok || first.RequestState == "" || !strings.Contains(ep.Message, "in full):\nonly this") {
		t.Fatalf("first round = %+v: %s", first, callText(first))
	}
	yes := mcp.InputResponseMap{"approval": &mcp.ElicitResult{Action: "accept", Content: map[string]any{"approve": true}}}

	// The approved prompt goes; carried to another prompt, it does not.
	moved := map[string]any{"machine": "mac", "project": "api", "prompt": "something else entirely"}
	res := callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: moved, InputResponses: yes, RequestState: first.RequestState})
	if !res.IsError || !strings.Contains(callText(res), "does not match this call") || h.accepted() != 0 {
		t.Fatalf("moved approval = %q, commands %d", callText(res), h.accepted())
	}
	// A made-up state is refused.
	res = callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args, InputResponses: yes, RequestState: "forged.state"})
	if !res.IsError || !strings.Contains(callText(res), "not an approval question of this connector") || h.accepted() != 0 {
		t.Fatalf("forged approval = %q", callText(res))
	}
	second := callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args})
	res = callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args, InputResponses: yes, RequestState: second.RequestState})
	if res.IsError || h.accepted() != 2 {
		t.Fatalf("approved = %q, commands %d", callText(res), h.accepted())
	}
	res = callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args, InputResponses: yes, RequestState: second.RequestState})
	if !res.IsError || !strings.Contains(callText(res), "already used") || h.accepted() != 2 {
		t.Fatalf("replayed approval = %q, commands %d", callText(res), h.accepted())
	}
	// An answer without its question's state is no approval: it asks again.
	res = callRaw(t, cs, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: args, InputResponses: yes})
	if !res.NeedsInput() || h.accepted() != 2 {
		t.Fatalf("answer without state = %+v", res)
	}
	failed := 0
	for _, r := range h.auditLines() {
		if r.Approval == audit.Failed {
			failed++
		}
	}
	if failed != 3 {
		t.Fatalf("audit has %d failed approvals, want 3 (moved, forged, replayed)", failed)
	}
}

// The audit log rotates by size and keeps T3CODE_MCP_AUDIT_KEEP files;
// every line in every file is whole.
func TestAuditLogRotates(t *testing.T) {
	h := newHarness(t, harnessOpts{settings: func(s *appSettings) { s.AuditMaxBytes, s.AuditKeep = 1500, 2 }})
	h.waitOnline("mac")
	knownProject(t, h, "api")
	c := h.client("")
	for range 12 {
		c.fails("t3_dispatch", map[string]any{"machine": "nope", "project": "api", "prompt": strings.Repeat("p", 300)}, "unknown machine")
	}
	files, err := audit.Files(h.stateDir)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(h.stateDir, audit.FileName)
	if !slices.Equal(files, []string{base + ".2", base + ".1", base}) {
		t.Fatalf("files = %v", files)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > 1500 {
			t.Fatalf("%s is %d bytes, more than the 1500 allowed", f, st.Size())
		}
		fh, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			var r audit.Record
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Tool != "t3_dispatch" {
				t.Fatalf("%s: torn line %q", f, sc.Text())
			}
		}
		fh.Close()
	}
	if n := len(h.auditLines()); n == 0 || n >= 12 {
		t.Fatalf("%d lines kept of 12: rotation should have dropped the oldest", n)
	}
}

func TestAuditSettingsFromEnv(t *testing.T) {
	env := map[string]string{}
	get := func(k string) string { return env[k] }
	s, err := app.SettingsFromEnv(get)
	if err != nil || s.AuditMaxBytes != audit.DefaultMaxBytes || s.AuditKeep != audit.DefaultKeep || s.AuditRetention != 0 {
		t.Fatalf("defaults: %+v %v", s, err)
	}
	env["T3CODE_MCP_AUDIT_MAX_BYTES"], env["T3CODE_MCP_AUDIT_KEEP"], env["T3CODE_MCP_AUDIT_RETENTION"] = "2048", "7", "2160h"
	if s, err = app.SettingsFromEnv(get); err != nil || s.AuditMaxBytes != 2048 || s.AuditKeep != 7 || s.AuditRetention != 2160*time.Hour {
		t.Fatalf("set: %+v %v", s, err)
	}
	env["T3CODE_MCP_AUDIT_MAX_BYTES"], env["T3CODE_MCP_AUDIT_KEEP"], env["T3CODE_MCP_AUDIT_RETENTION"] = "10MB", "-1", "90d"
	_, err = app.SettingsFromEnv(get)
	if err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_AUDIT_MAX_BYTES") || !strings.Contains(err.Error(), "T3CODE_MCP_AUDIT_KEEP") ||
		!strings.Contains(err.Error(), "T3CODE_MCP_AUDIT_RETENTION") {
		t.Fatalf("bad values: %v", err)
	}
}
