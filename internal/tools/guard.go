package tools

// Guard rails: per-machine policy (access = "read"), human approval of
// mutating calls (approve = [...]) through MCP elicitation, and the audit
// line every mutating call leaves. See docs/guardrails.md.

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// Auditor records mutating calls; *audit.Log is one.
type Auditor interface {
	Write(audit.Record) error
}

// mutating are the tools that send commands to T3: refused on read-only
// machines, subject to approval, audited.
var mutating = map[string]bool{
	mcptools.ToolDispatch:  true,
	mcptools.ToolAnswer:    true,
	mcptools.ToolInterrupt: true,
}

// readTools are what a read-only machine still serves, for messages.
const readTools = "t3_machines, t3_projects, t3_threads, t3_thread, t3_wait and t3_watch"

// refuseReadOnly is the one message for a mutating call on a read-only
// machine; what says what the call would have done.
func refuseReadOnly(tool string, m *fleet.Machine, what string) error {
	return fmt.Errorf("%s: machine %q is read-only (access = \"read\" in t3code.toml), so t3code-mcp does not %s there; only %s work on it. "+
		"To allow it, the operator sets access = \"operate\" for [machines.%s]", tool, m.Name, what, readTools, m.Name)
}

// approvalInputID keys the approval question in an input-required result.
const approvalInputID = "approval"

// approvalField is the requested schema's one field.
const approvalField = "approve"

// approvalTimeout bounds how long a person may take to answer, and how long
// an approval asked through an input request stays valid.
const approvalTimeout = 30 * time.Minute

// mrtrProtocol is the first MCP protocol version in which a server may not
// send requests to the client while serving a call; it asks through an
// input-required result instead, and the client retries the call with the
// answers (multi round-trip requests, SEP-2322).
const mrtrProtocol = "2026-07-28"

// approval describes one mutating action for a person to approve.
type approval struct {
	action string // config.ApproveDispatch, …
	// summary is the first line: what will happen, in a few words.
	summary string
	// details are "label: value" lines shown under it.
	details [][2]string
	// body is shown last, in full (the prompt, the questions and answers).
	bodyTitle, body string
	// thread is the thread id, or "new" for a thread not yet created.
	thread string
	// commands are what will be sent to T3, in order; the approval is bound
	// to them (their generated ids aside).
	commands []t3.Command
}

// message is the text the person reads.
func (a approval) message(tool string, m *fleet.Machine, c *Call) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Approve %s on machine %q?\n", a.summary, m.Name)
	fmt.Fprintf(&b, "(t3code-mcp asks because approve = %s for [machines.%s] in t3code.toml; nothing is sent until you approve.)\n\n", tomlList(m.Config.Approve), m.Name)
	rows := append([][2]string{{"tool", tool}, {"machine", m.Name + " (" + m.Config.URL + ")"}}, a.details...)
	if c.Audit.Client.Name != "" {
		rows = append(rows, [2]string{"requested by", strings.TrimSpace(c.Audit.Client.Name + " " + c.Audit.Client.Version)})
	}
	if c.Origin != "" {
		rows = append(rows, [2]string{"origin", c.Origin})
	}
	width := 0
	for _, r := range rows {
		width = max(width, len(r[0]))
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "  %-*s  %s\n", width+1, r[0]+":", r[1])
	}
	if a.bodyTitle != "" {
		fmt.Fprintf(&b, "\n%s\n%s\n", a.bodyTitle, a.body)
	}
	return b.String()
}

// schema is the form the person fills: one boolean, unticked by default.
// Only an accepted form with it ticked approves.
func (a approval) schema(m *fleet.Machine) map[string]any {
	return map[string]any{
		"type": "object",
		"properties": map[string]any{
			approvalField: map[string]any{
				"type":        "boolean",
				"title":       "Approve " + a.summary,
				"description": fmt.Sprintf("Tick to let t3code-mcp send exactly what is shown above to machine %q. Leave it unticked, decline or cancel, and nothing is sent.", m.Name),
				"default":     false,
			},
		},
		"required": []string{approvalField},
	}
}

// fingerprint binds an approval to what it allows: tool, machine, thread and
// every command, with the ids generated per attempt (command, thread and
// message ids of a new thread) left out.
func (a approval) fingerprint(tool string, m *fleet.Machine) ([]byte, error) {
	h := sha256.New()
	for _, s := range []string{tool, m.Name, a.action, a.thread} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	for _, cmd := range a.commands {
		raw, err := cmd.MarshalJSON()
		if err != nil {
			return nil, err
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		delete(v, "commandId")
		delete(v, "messageId")
		if a.thread == "new" {
			delete(v, "threadId")
		}
		canon, err := json.Marshal(v) // map keys sorted
		if err != nil {
			return nil, err
		}
		h.Write(canon)
		h.Write([]byte{0})
	}
	return h.Sum(nil), nil
}

// inputRequired is a handler's way to end a call with a question for the
// person (protocol 2026-07-28 and later): wrap returns it as an
// input-required result and the client retries the call with the answer.
type inputRequired struct {
	params *mcp.ElicitParams
	state  string
}

func (e *inputRequired) Error() string { return "approval requested through an input request" }

func (e *inputRequired) result() *mcp.CallToolResult {
	return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{approvalInputID: e.params}, RequestState: e.state}
}

// approve enforces the machine's approve list for a. When no approval is
// needed or the person approves, it returns the context to send with (a
// fresh call timeout when a person took their time); otherwise an error that
// says what happened. Nothing is sent to T3 before it returns.
func (d *Deps) approve(ctx context.Context, c *Call, tool string, m *fleet.Machine, a approval) (context.Context, error) {
	if !m.Config.Approves(a.action) {
		c.Audit.Approval = audit.NotRequired
		return ctx, nil
	}
	fp, err := a.fingerprint(tool, m)
	if err != nil {
		c.Audit.Approval = audit.Failed
		return nil, fmt.Errorf("%s: preparing the approval question failed: %w; nothing was sent", tool, err)
	}
	session := ""
	if c.Req != nil && c.Req.Session != nil {
		session = c.Req.Session.ID()
	}
	// A retry carrying the answer to an input request.
	if c.Req != nil && c.Req.Params != nil && c.Req.Params.RequestState != "" {
		if err := d.approvals.redeem(c.Req.Params.RequestState, session, fp); err != nil {
			c.Audit.Approval = audit.Failed
			return nil, fmt.Errorf("%s: %w; nothing was sent to machine %q. Call %s again to ask the person anew", tool, err, m.Name, tool)
		}
		res, _ := c.Req.Params.InputResponses[approvalInputID].(*mcp.ElicitResult)
		if res == nil {
			c.Audit.Approval = audit.Failed
			return nil, fmt.Errorf("%s: the retried call carries no answer to the approval question %q; nothing was sent to machine %q", tool, approvalInputID, m.Name)
		}
		return ctx, decide(tool, m, a, c, res)
	}
	if !canElicit(c.Req) {
		c.Audit.Approval = audit.Unsupported
		client := "this MCP client"
		if n := c.Audit.Client.Name; n != "" {
			client = fmt.Sprintf("this MCP client (%s)", strings.TrimSpace(n+" "+c.Audit.Client.Version))
		}
		return nil, fmt.Errorf("%s: machine %q requires a person's approval for %s (approve = %s for [machines.%s] in t3code.toml), but %s cannot ask for one: it does not support MCP elicitation. "+
			"Nothing was sent to T3. Use an MCP client that supports elicitation (form mode), or the operator removes %q from approve for [machines.%s] in t3code.toml",
			tool, m.Name, a.action, tomlList(m.Config.Approve), m.Name, client, a.action, m.Name)
	}
	params := &mcp.ElicitParams{Mode: "form", Message: a.message(tool, m, c), RequestedSchema: a.schema(m)}
	if usesInputRequests(c.Req) {
		state, err := d.approvals.issue(session, fp)
		if err != nil {
			c.Audit.Approval = audit.Failed
			return nil, fmt.Errorf("%s: preparing the approval question failed: %w; nothing was sent", tool, err)
		}
		c.Audit.Approval = audit.Requested
		return nil, &inputRequired{params: params, state: state}
	}
	// Ask now, on the request's own context: the person's time does not
	// count against the call timeout, which starts afresh once they answer.
	ectx, cancel := context.WithTimeout(c.base, approvalTimeout)
	defer cancel()
	res, err := c.Req.Session.Elicit(ectx, params)
	if err != nil {
		c.Audit.Approval = audit.Failed
		if errors.Is(err, context.DeadlineExceeded) && c.base.Err() == nil {
			err = fmt.Errorf("no answer within %s", approvalTimeout)
		}
		return nil, fmt.Errorf("%s: asking for approval on machine %q failed: %v; nothing was sent to T3", tool, m.Name, err)
	}
	if err := decide(tool, m, a, c, res); err != nil {
		return nil, err
	}
	nctx, ncancel := context.WithTimeout(c.base, d.Limits.CallTimeout)
	c.cancels = append(c.cancels, ncancel)
	return nctx, nil
}

// decide reads the person's answer: only accept with approve ticked passes.
func decide(tool string, m *fleet.Machine, a approval, c *Call, res *mcp.ElicitResult) error {
	switch res.Action {
	case "accept":
		if v, _ := res.Content[approvalField].(bool); v {
			c.Audit.Approval = audit.Accepted
			return nil
		}
		c.Audit.Approval = audit.Declined
		return fmt.Errorf("%s: the person declined %s on machine %q (submitted the approval form without ticking %q); nothing was sent to T3. Do not retry unless they ask you to", tool, a.summary, m.Name, approvalField)
	case "decline":
		c.Audit.Approval = audit.Declined
		return fmt.Errorf("%s: the person declined %s on machine %q; nothing was sent to T3. Do not retry unless they ask you to", tool, a.summary, m.Name)
	case "cancel":
		c.Audit.Approval = audit.Cancelled
		return fmt.Errorf("%s: the approval of %s on machine %q was cancelled (dismissed without a decision); nothing was sent to T3", tool, a.summary, m.Name)
	default:
		c.Audit.Approval = audit.Failed
		return fmt.Errorf("%s: the approval of %s on machine %q came back with action %q, which is none of accept, decline, cancel; nothing was sent to T3", tool, a.summary, m.Name, res.Action)
	}
}

// canElicit reports whether the client declared form elicitation support
// (an empty elicitation capability means form, for older clients).
func canElicit(req *mcp.CallToolRequest) bool {
	if req == nil || req.Session == nil {
		return false
	}
	caps := req.ClientCapabilities()
	if caps == nil || caps.Elicitation == nil {
		return false
	}
	return caps.Elicitation.Form != nil || caps.Elicitation.URL == nil
}

// usesInputRequests reports whether the session speaks a protocol in which
// the question goes back as an input-required result rather than as an
// elicitation request sent during the call.
func usesInputRequests(req *mcp.CallToolRequest) bool {
	v := ""
	if p := req.Session.InitializeParams(); p != nil {
		v = p.ProtocolVersion
	}
	if v == "" {
		v = req.ProtocolVersion()
	}
	return v >= mrtrProtocol
}

// approvals signs the request state of approval questions asked through
// input requests, so that an answer counts only for the call it was asked
// for — same session, same tool, same machine, same commands — only once,
// and only within approvalTimeout. The key lives in memory: a restart
// invalidates questions still open, and the agent simply calls again.
type approvals struct {
	once sync.Once
	key  []byte
	mu   sync.Mutex
	used map[string]int64 // nonce → expiry (Unix seconds)
}

const stateNonceBytes = 16

func (p *approvals) init() {
	p.once.Do(func() {
		p.key = make([]byte, 32)
		_, _ = rand.Read(p.key) // never fails (crypto/rand)
		p.used = map[string]int64{}
	})
}

func (p *approvals) mac(nonce []byte, expiry int64, session string, fp []byte) []byte {
	h := hmac.New(sha256.New, p.key)
	h.Write(nonce)
	_ = binary.Write(h, binary.BigEndian, expiry)
	h.Write([]byte(session))
	h.Write([]byte{0})
	h.Write(fp)
	return h.Sum(nil)
}

// issue makes the request state of a new question.
func (p *approvals) issue(session string, fp []byte) (string, error) {
	p.init()
	nonce := make([]byte, stateNonceBytes)
	if _, err := rand.Read(nonce); err != nil {
		return "", err
	}
	expiry := time.Now().Add(approvalTimeout).Unix()
	payload := binary.BigEndian.AppendUint64(nonce, uint64(expiry))
	enc := base64.RawURLEncoding
	return enc.EncodeToString(payload) + "." + enc.EncodeToString(p.mac(nonce, expiry, session, fp)), nil
}

// redeem checks a request state against the call that carries it and uses
// it up.
func (p *approvals) redeem(state, session string, fp []byte) error {
	p.init()
	enc := base64.RawURLEncoding
	ps, ms, ok := strings.Cut(state, ".")
	payload, err1 := enc.DecodeString(ps)
	sig, err2 := enc.DecodeString(ms)
	if !ok || err1 != nil || err2 != nil || len(payload) != stateNonceBytes+8 {
		return errors.New("the retried call carries a request state that is not an approval question of this connector")
	}
	nonce := payload[:stateNonceBytes]
	expiry := int64(binary.BigEndian.Uint64(payload[stateNonceBytes:]))
	if !hmac.Equal(sig, p.mac(nonce, expiry, session, fp)) {
		return errors.New("the approval answer does not match this call: the arguments, the session or what the call would send changed since the person was asked (or the connector restarted)")
	}
	now := time.Now().Unix()
	if now > expiry {
		return fmt.Errorf("the approval question expired (answers count for %s)", approvalTimeout)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, exp := range p.used { // bounded: an entry lives until its state expires
		if now > exp {
			delete(p.used, n)
		}
	}
	key := string(nonce)
	if _, dup := p.used[key]; dup {
		return errors.New("this approval answer was already used; an approval counts for one call")
	}
	p.used[key] = expiry
	return nil
}

// clientOf is the MCP client's name and version, as far as it said.
func clientOf(req *mcp.CallToolRequest) audit.Client {
	if req == nil || req.Session == nil {
		return audit.Client{}
	}
	info := req.ClientInfo()
	if info == nil {
		return audit.Client{}
	}
	return audit.Client{Name: text.Cut(info.Name, 200), Version: text.Cut(info.Version, 100)}
}

// tomlList writes a list of strings as t3code.toml does: ["dispatch", "answer"].
func tomlList(xs []string) string { return "[" + text.QuoteList(xs) + "]" }

// actOn finds the thread a mutating tool acts on — allowlisted, on a machine
// whose policy permits changes and which is online — and notes it for the
// audit line.
func (d *Deps) actOn(tool string, c *Call, threadID, verb string) (fleet.Found, error) {
	c.Audit.Thread = threadID
	f, err := d.Fleet.Thread(threadID)
	if err != nil {
		return fleet.Found{}, err
	}
	m := f.Machine
	c.Audit.Machine, c.Audit.Project, c.Audit.Thread = m.Name, f.Project.Title, f.Shell.ID
	if m.Config.ReadOnly() {
		return fleet.Found{}, refuseReadOnly(tool, m, verb)
	}
	if err := m.Ready(); err != nil {
		return fleet.Found{}, err
	}
	return f, nil
}

// stateAfter is the state of the thread a mutating tool acted on, from its
// row now (the row it was found by, if the watcher has none).
func (d *Deps) stateAfter(ctx context.Context, f fleet.Found) (t3rpc.ThreadShell, mcptools.ThreadState, error) {
	shell, _ := f.Machine.Watcher().Thread(f.Shell.ID)
	if shell.ID == "" {
		shell = f.Shell
	}
	st, err := d.state(ctx, f, shell, 3, nil)
	return shell, st, err
}
