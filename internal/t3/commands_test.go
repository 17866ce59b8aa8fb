package t3

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// fastRetry shortens the lost-reply backoff for a test.
func fastRetry(t *testing.T) {
	old := retry
	retry.base, retry.max = time.Millisecond, 2*time.Millisecond
	t.Cleanup(func() { retry = old })
}

func asMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m
}

// Built commands have exactly the shape of the recorded ones (T3's web
// client), with creationSource "mcp" and fresh ids.
func TestCommandsMatchRecordings(t *testing.T) {
	model := t3rpc.ModelSelection{InstanceId: "grok", Model: "grok-build"}
	cases := []struct {
		name, file, id string
		cmd            func(rec map[string]any) Command
		dropFromRec    []string
	}{
		{"thread.create", "05-ws-basic-run.json", "2", func(r map[string]any) Command {
			return ThreadCreate(r["threadId"].(string), r["projectId"].(string), r["title"].(string), model)
		}, nil},
		// This connector sets the model with ModelSelectionSet, not per message.
		{"message.dispatch", "05-ws-basic-run.json", "4", func(r map[string]any) Command {
			return MessageDispatch(r["threadId"].(string), r["messageId"].(string), r["text"].(string), "")
		}, []string{"modelSelection"}},
		{"run.interrupt", "07-ws-run-interrupt.json", "3", func(r map[string]any) Command {
			return RunInterrupt(r["threadId"].(string), r["runId"].(string), r["reason"].(string))
		}, nil},
		{"runtime-request.respond", "06-ws-pending-question.json", "4", func(r map[string]any) Command {
			return RespondAnswers(r["threadId"].(string), r["requestId"].(string),
				map[string]t3rpc.AnswerValue{"Which scope should Grok use?": t3rpc.NewStringAnswerValue("Workspace")})
		}, nil},
	}
	for _, tc := range cases {
		req := recordedSend(t, tc.file, tc.id)
		want := asMap(t, req.Payload)
		cmd := tc.cmd(want)
		b, err := json.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		got := asMap(t, b)
		if !strings.HasPrefix(cmd.CommandID(), "cmd-") || got["commandId"] != cmd.CommandID() || cmd.CommandType() != tc.name {
			t.Errorf("%s: id %q type %q, payload %s", tc.name, cmd.CommandID(), cmd.CommandType(), b)
		}
		want["commandId"] = cmd.CommandID()
		if _, ok := want["creationSource"]; ok {
			want["creationSource"] = "mcp"
		}
		for _, k := range tc.dropFromRec {
			delete(want, k)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got %s\nwant %v", tc.name, b, want)
		}
	}

	// launchThread: the recorded one also sent generateTitle:false, which is the default.
	req := recordedSend(t, "10-ws-launch-thread.json", "1")
	want := asMap(t, req.Payload)
	msg := want["initialMessage"].(map[string]any)
	in := LaunchThreadInput(want["threadId"].(string), want["projectId"].(string), want["title"].(string), model, "", msg["text"].(string))
	b, _ := json.Marshal(in)
	got := asMap(t, b)
	want["commandId"], want["creationSource"] = in.CommandId, "mcp"
	delete(want, "generateTitle")
	if !reflect.DeepEqual(got, want) {
		t.Errorf("launchThread:\n got %s\nwant %v", b, want)
	}

	d, _ := json.Marshal(RespondDecision("t", "r", "accept"))
	if string(d) != `{"type":"runtime-request.respond","commandId":"`+asMap(t, d)["commandId"].(string)+`","threadId":"t","requestId":"r","decision":"accept"}` {
		t.Errorf("decision %s", d)
	}
	m, _ := json.Marshal(ModelSelectionSet("t", model))
	if got := asMap(t, m); got["type"] != "thread.model-selection.set" || got["modelSelection"] == nil {
		t.Errorf("model selection %s", m)
	}
	if a, b := NewID("thread"), NewID("thread"); a == b || !strings.HasPrefix(a, "thread-") || len(a) != len("thread-")+36 {
		t.Errorf("NewID %s %s", a, b)
	}
}

// Each DialRPC mints a fresh ticket and dials /ws with it and protocol 2; the
// token stays in headers.
func TestDialRPCTicketPerConnection(t *testing.T) {
	f := newFake(t)
	c := f.client(t, "vm", Options{})
	for range 2 {
		conn, err := c.DialRPC(tctx(t))
		if err != nil {
			t.Fatal(err)
		}
		if conn.Label() != "vm" {
			t.Errorf("label %q", conn.Label())
		}
		_ = conn.Close()
	}
	var tickets []string
	for _, r := range f.requests() {
		if r.path != "/ws" {
			continue
		}
		q := strings.Split(r.rawQuery, "&")
		var tk, proto string
		for _, kv := range q {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "wsTicket":
				tk = v
			case "orchestrationProtocol":
				proto = v
			}
		}
		if tk == "" || proto != "2" {
			t.Errorf("ws query %q", r.rawQuery)
		}
		tickets = append(tickets, tk)
	}
	if len(tickets) != 2 || tickets[0] == tickets[1] {
		t.Fatalf("tickets %v: want a fresh one per connection", tickets)
	}
	checkHeaders(t, f.requests())
}

func TestDialRPCRefusals(t *testing.T) {
	// The fake gate itself: /ws without orchestrationProtocol=2 is a 426.
	f := newFake(t)
	_, err := effectrpc.Dial(tctx(t), "ws"+strings.TrimPrefix(f.srv.URL, "http")+"/ws?wsTicket=x", effectrpc.Options{})
	var ue *effectrpc.UpgradeError
	if !errors.As(err, &ue) || ue.Status != 426 {
		t.Fatalf("gate: %v", err)
	}

	// A server on a newer protocol refuses our 2.
	f.wsProtocol = "3"
	f.wsBody = `{"code":"orchestration_protocol_incompatible","message":"Update this client to one that supports orchestration protocol 3.","orchestrationProtocolVersion":3}`
	_, err = f.client(t, "next", Options{}).DialRPC(tctx(t))
	wantErr(t, err, 426, "orchestration_protocol_incompatible", `machine "next" refused orchestration protocol 2 on /ws and asks for protocol 3`, "Update this client")

	// A ticket T3 does not accept: the recorded 401.
	f = newFake(t)
	f.rejectTickets = true
	_, err = f.client(t, "vm", Options{}).DialRPC(tctx(t))
	wantErr(t, err, 401, "auth_invalid", `token for machine "vm" is invalid or expired`, IssueCommand)
	if strings.Contains(err.Error(), "ticket-1") {
		t.Errorf("ticket in message: %v", err)
	}
}

func TestGetConfig(t *testing.T) {
	f := newFake(t)
	f.ws = func(n int, p *wsPeer) {
		if r, ok := p.request(); ok && r.Method == "server.getConfig" && string(r.Payload) == "{}" {
			p.send(recordedExit(t, "05-ws-basic-run.json", "0", r.ID.String))
		}
	}
	c := f.client(t, "vm", Options{})
	conn, err := c.DialRPC(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cfg, err := c.GetConfig(tctx(t), conn)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Providers) == 0 || cfg.Providers[0].InstanceId == "" {
		t.Fatalf("%+v", cfg)
	}
}

// dialer hands Dispatch a fresh socket per attempt, as a reconnecting watcher
// would, and closes them all at the end.
type dialer struct {
	c     *Client
	mu    sync.Mutex
	conns []*effectrpc.Conn
	calls int
}

func (d *dialer) connect(ctx context.Context) (*effectrpc.Conn, error) {
	conn, err := d.c.DialRPC(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls++
	if conn != nil {
		d.conns = append(d.conns, conn)
	}
	return conn, err
}

func (d *dialer) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.conns {
		_ = c.Close()
	}
}

func newDialer(t *testing.T, c *Client) *dialer {
	d := &dialer{c: c}
	t.Cleanup(d.close)
	return d
}

// commandIDOf reads commandId from a dispatched payload.
func commandIDOf(t *testing.T, payload jx.Raw) string {
	var m map[string]any
	if err := json.Unmarshal(payload, &m); err != nil {
		t.Errorf("payload %s: %v", payload, err)
		return ""
	}
	s, _ := m["commandId"].(string)
	return s
}

// The first socket dies before the reply; Dispatch resends the same command
// (same commandId) on a new socket and gets T3's answer.
func TestDispatchRetriesLostReplyWithSameCommandID(t *testing.T) {
	fastRetry(t)
	f := newFake(t)
	var mu sync.Mutex
	var seen []string
	f.ws = func(n int, p *wsPeer) {
		r, ok := p.request()
		if !ok {
			return
		}
		if r.Method != "orchestration.dispatchCommand" {
			t.Errorf("method %s", r.Method)
		}
		mu.Lock()
		seen = append(seen, commandIDOf(t, r.Payload))
		mu.Unlock()
		if n == 1 {
			p.drop()
			return
		}
		p.send(recordedExit(t, "05-ws-basic-run.json", "4", r.ID.String))
	}
	d := newDialer(t, f.client(t, "vm", Options{}))
	cmd := MessageDispatch("thread-edec8901-ce32-45b4-82ca-65ecac9ec39b", NewID("msg"), "Say hello", "")
	seq, err := Dispatch(tctx(t), d.connect, cmd)
	if err != nil {
		t.Fatal(err)
	}
	if seq != 9 {
		t.Fatalf("sequence %d", seq)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0] != cmd.CommandID() || seen[1] != cmd.CommandID() {
		t.Fatalf("commandIds sent %v, want %s twice", seen, cmd.CommandID())
	}
}

// A typed failure is T3's answer, not a lost reply: never resent.
func TestDispatchNeverRetriesFailures(t *testing.T) {
	fastRetry(t)
	cases := []struct {
		file, id string
		check    func(err error)
	}{
		{"05-ws-basic-run.json", "11", func(err error) {
			wantErr(t, err, 0, CodeRejected, `machine "vm" rejected run.interrupt command cmd-827cb858-fd40-438f-912b-70e81bd44a38: Run run-does-not-exist is not interruptible.`)
		}},
		{"09-ws-missing-scope.json", "1", func(err error) {
			wantErr(t, err, 403, "insufficient_scope", `token for machine "vm" lacks scope "orchestration:operate"`, IssueCommand, "token_env")
		}},
		{"05-ws-basic-run.json", "7", func(err error) {
			wantErr(t, err, 0, CodeDefect, `machine "vm" could not process run.interrupt (T3 defect: Missing key`)
		}},
	}
	for _, tc := range cases {
		f := newFake(t)
		f.ws = func(n int, p *wsPeer) {
			if r, ok := p.request(); ok {
				p.send(recordedExit(t, tc.file, tc.id, r.ID.String))
			}
		}
		d := newDialer(t, f.client(t, "vm", Options{}))
		_, err := Dispatch(tctx(t), d.connect, RunInterrupt("thread-1", "run-does-not-exist", ""))
		tc.check(err)
		var re *effectrpc.Error
		if !errors.As(err, &re) {
			t.Errorf("%s/%s: effectrpc.Error not wrapped: %v", tc.file, tc.id, err)
		}
		if d.calls != 1 {
			t.Errorf("%s/%s: connect called %d times", tc.file, tc.id, d.calls)
		}
	}
}

// Retries are bounded; the error says the command may or may not have run.
func TestDispatchGivesUp(t *testing.T) {
	fastRetry(t)
	f := newFake(t)
	f.ws = func(n int, p *wsPeer) {
		if _, ok := p.request(); ok {
			p.drop()
		}
	}
	d := newDialer(t, f.client(t, "vm", Options{}))
	cmd := ThreadCreate("thread-x", "project-x", "t", t3rpc.ModelSelection{InstanceId: "grok", Model: "grok-build"})
	_, err := Dispatch(tctx(t), d.connect, cmd)
	wantErr(t, err, 0, CodeReplyLost, cmd.CommandID(), "may or may not have been applied")
	if !errors.Is(err, effectrpc.ErrClosed) || d.calls != retry.attempts {
		t.Fatalf("calls %d, err %v", d.calls, err)
	}
}

// A connect failure before anything was sent is returned as is.
func TestDispatchConnectError(t *testing.T) {
	boom := errors.New(`machine "vm" is offline`)
	_, err := Dispatch(tctx(t), func(context.Context) (*effectrpc.Conn, error) { return nil, boom }, RunInterrupt("t", "r", ""))
	if err != boom {
		t.Fatalf("%v", err)
	}
}

func TestLaunch(t *testing.T) {
	f := newFake(t)
	f.ws = func(n int, p *wsPeer) {
		if r, ok := p.request(); ok && r.Method == "orchestration.launchThread" {
			p.send(`{"_tag":"Exit","requestId":"` + r.ID.String + `","exit":{"_tag":"Success","value":{"threadId":"thread-6dcf45e8-edb5-4e41-bef9-584ba76aa7d3","resumed":false}}}`)
		}
	}
	d := newDialer(t, f.client(t, "vm", Options{}))
	in := LaunchThreadInput("thread-6dcf45e8-edb5-4e41-bef9-584ba76aa7d3", "project-1", "title", t3rpc.ModelSelection{InstanceId: "grok", Model: "grok-build"}, NewID("msg"), "go")
	res, err := Launch(tctx(t), d.connect, in)
	if err != nil || res.ThreadId != in.ThreadId || res.Resumed {
		t.Fatalf("%v %+v", err, res)
	}
}
