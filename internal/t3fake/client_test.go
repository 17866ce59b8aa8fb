package t3fake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadlock guards a test against hanging forever; it is not a timing assertion: every wait below
// ends as soon as the awaited message arrives.
const deadlock = 20 * time.Second

// exchange and frame have the fixture's shape (testdata/t3/README.md), so the shape test can
// classify the fake's traffic with the same code as the recordings.
type exchange struct {
	Method       string `json:"method"`
	URL          string `json:"url"`
	Status       int    `json:"status"`
	ResponseBody string `json:"responseBody"`
}

type frame struct {
	Dir  string `json:"dir"` // send | recv
	Data string `json:"data"`
}

// recorder collects traffic of one test in fixture form.
type recorder struct {
	mu        sync.Mutex
	exchanges []exchange
	frames    []frame
}

func (r *recorder) addExchange(e exchange) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.exchanges = append(r.exchanges, e)
	r.mu.Unlock()
}

func (r *recorder) addFrame(dir string, data []byte) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.frames = append(r.frames, frame{Dir: dir, Data: string(data)})
	r.mu.Unlock()
}

// httpClient never keeps idle connections, so no transport goroutine outlives a test (goleak).
var httpClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

type httpResp struct {
	status int
	header http.Header
	body   string
}

func doHTTP(t *testing.T, rec *recorder, method, url string, headers map[string]string, body string) httpResp {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	res, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	rec.addExchange(exchange{Method: method, URL: url, Status: res.StatusCode, ResponseBody: string(b)})
	return httpResp{status: res.StatusCode, header: res.Header, body: string(b)}
}

func bearer(tok string) map[string]string {
	return map[string]string{"Authorization": "Bearer " + tok, "x-t3-orchestration-protocol": "2"}
}

// ticket mints a WebSocket ticket.
func mintTicket(t *testing.T, s *Server, tok string) string {
	t.Helper()
	r := doHTTP(t, nil, "POST", s.URL()+"/api/auth/websocket-ticket", bearer(tok), "")
	if r.status != 200 {
		t.Fatalf("ticket: %d %s", r.status, r.body)
	}
	var v struct{ Ticket string }
	if err := json.Unmarshal([]byte(r.body), &v); err != nil || v.Ticket == "" {
		t.Fatalf("ticket body %q: %v", r.body, err)
	}
	return v.Ticket
}

// msg is one server message as the client received it.
type msg struct {
	m   t3rpc.ServerMessage
	raw []byte
}

// client is a minimal Effect RPC client: requests numbered "0", "1", … as T3's own client does,
// every received message kept in order, chunks acked when their stream is set to auto-ack.
type client struct {
	t       *testing.T
	ws      *websocket.Conn
	rec     *recorder
	ctx     context.Context
	cancel  context.CancelFunc
	in      chan msg
	done    chan struct{}
	next    int
	autoAck map[string]bool
	// items received per stream id, in order; exits per request id.
	items map[string][]jx.Raw
	exits map[string]t3rpc.Exit
	// chunks per stream id, each a list of values, to check batching.
	chunks map[string][][]jx.Raw
	other  []t3rpc.ServerMessage // Pong, Defect
}

func dial(t *testing.T, s *Server, tok string, rec *recorder) *client {
	t.Helper()
	u := s.WebSocketURL() + "?wsTicket=" + mintTicket(t, s, tok) + "&orchestrationProtocol=2"
	dctx, dcancel := context.WithTimeout(context.Background(), deadlock)
	defer dcancel()
	ws, _, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: httpClient})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ws.SetReadLimit(-1)
	c := &client{
		t: t, ws: ws, rec: rec, ctx: ctx, cancel: cancel,
		in: make(chan msg, 1<<16), done: make(chan struct{}),
		autoAck: map[string]bool{}, items: map[string][]jx.Raw{}, exits: map[string]t3rpc.Exit{},
		chunks: map[string][][]jx.Raw{},
	}
	go c.readLoop()
	t.Cleanup(c.close)
	return c
}

func (c *client) readLoop() {
	defer close(c.done)
	for {
		_, data, err := c.ws.Read(c.ctx)
		if err != nil {
			close(c.in)
			return
		}
		c.rec.addFrame("recv", data)
		var raws []jx.Raw
		d := jx.DecodeBytes(data)
		if d.Next() == jx.Array {
			_ = d.Arr(func(d *jx.Decoder) error {
				r, err := d.Raw()
				raws = append(raws, append(jx.Raw(nil), r...))
				return err
			})
		} else {
			raws = []jx.Raw{data}
		}
		for _, r := range raws {
			var m t3rpc.ServerMessage
			if err := m.Decode(jx.DecodeBytes(r)); err != nil {
				c.t.Errorf("undecodable server message %s: %v", r, err)
				continue
			}
			c.in <- msg{m: m, raw: r}
		}
	}
}

func (c *client) close() {
	_ = c.ws.CloseNow()
	c.cancel()
	<-c.done
}

func idString(id t3rpc.RequestId) string {
	if v, ok := id.GetString(); ok {
		return v
	}
	v, _ := id.GetInt64()
	return strconv.FormatInt(v, 10)
}

func (c *client) sendRaw(v string) {
	c.t.Helper()
	c.rec.addFrame("send", []byte(v))
	if err := c.ws.Write(c.ctx, websocket.MessageText, []byte(v)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// request sends a Request and returns its id.
func (c *client) request(method, payload string) string {
	c.t.Helper()
	id := strconv.Itoa(c.next)
	c.next++
	c.sendRaw(fmt.Sprintf(`{"_tag":"Request","id":%q,"tag":%q,"payload":%s,"headers":[]}`, id, method, payload))
	return id
}

func (c *client) ack(id string) { c.sendRaw(fmt.Sprintf(`{"_tag":"Ack","requestId":%q}`, id)) }

func (c *client) ping() { c.sendRaw(`{"_tag":"Ping"}`) }

// subscribe starts a stream; autoAck acks each of its chunks as it is consumed.
func (c *client) subscribe(method, payload string, autoAck bool) string {
	c.t.Helper()
	id := c.request(method, payload)
	c.autoAck[id] = autoAck
	return id
}

// subscribeReady subscribes with auto-ack and waits for the stream's first item, so that what the
// test does next is seen live by the stream.
func (c *client) subscribeReady(method, payload string) string {
	c.t.Helper()
	id := c.subscribe(method, payload, true)
	for len(c.items[id]) == 0 {
		c.pump()
	}
	return id
}

// pump consumes one message, records it and acks it if its stream auto-acks.
func (c *client) pump() t3rpc.ServerMessage {
	c.t.Helper()
	select {
	case m, open := <-c.in:
		if !open {
			c.t.Fatalf("socket closed")
		}
		switch {
		case m.m.IsChunk():
			id := idString(m.m.Chunk.RequestId)
			c.items[id] = append(c.items[id], m.m.Chunk.Values...)
			c.chunks[id] = append(c.chunks[id], m.m.Chunk.Values)
			if c.autoAck[id] {
				c.ack(id)
			}
		case m.m.IsExit():
			c.exits[idString(m.m.Exit.RequestId)] = m.m.Exit
		default:
			c.other = append(c.other, m.m)
		}
		return m.m
	case <-time.After(deadlock):
		c.t.Fatalf("no server message within %v", deadlock)
	}
	return t3rpc.ServerMessage{}
}

// exit waits for the Exit of request id.
func (c *client) exit(id string) t3rpc.Exit {
	c.t.Helper()
	for {
		if e, ok := c.exits[id]; ok {
			return e
		}
		c.pump()
	}
}

// call sends a request and waits for its Exit.
func (c *client) call(method, payload string) t3rpc.Exit {
	c.t.Helper()
	return c.exit(c.request(method, payload))
}

// success returns the Exit's success value, failing the test on a failure.
func (c *client) success(e t3rpc.Exit) jx.Raw {
	c.t.Helper()
	s, ok := e.Exit.GetExitSuccess()
	if !ok {
		c.t.Fatalf("exit is not a success: %s", mustJSON(&e))
	}
	return s.Value
}

// waitItem consumes until stream id has an item (from index from on) matching pred and returns
// its index.
func (c *client) waitItem(id string, from int, pred func(v map[string]any) bool) int {
	c.t.Helper()
	for i := from; ; i++ {
		for i >= len(c.items[id]) {
			c.pump()
		}
		if pred(asMap(c.t, c.items[id][i])) {
			return i
		}
	}
}

// barrier makes the server's writer finish everything it could send before this point: two
// Ping/Pong round trips, because a round's chunks are written right after its Pong.
func (c *client) barrier() {
	c.t.Helper()
	for range 2 {
		c.ping()
		for {
			if c.pump().IsPong() {
				break
			}
		}
	}
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func asMap(t *testing.T, raw []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("decode %s: %v", raw, err)
	}
	return m
}

// path reads a nested value: path(m, "event", "payload", "status").
func path(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

func str(m map[string]any, keys ...string) string {
	s, _ := path(m, keys...).(string)
	return s
}

// isEvent matches a thread event item of type typ whose payload field key equals val ("" = any).
func isEvent(typ, key, val string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		if m["kind"] != "event" || str(m, "event", "type") != typ {
			return false
		}
		return key == "" || str(m, "event", "payload", key) == val
	}
}

// isShell matches a shell thread.updated item of thread tid with status.
func isShell(tid, status string) func(map[string]any) bool {
	return func(m map[string]any) bool {
		return m["kind"] == "thread.updated" && str(m, "thread", "id") == tid && str(m, "thread", "status") == status
	}
}

func dieOf(t *testing.T, e t3rpc.Exit) string {
	t.Helper()
	f, ok := e.Exit.GetExitFailure()
	if !ok || len(f.Cause) == 0 || f.Cause[0].Tag != "Die" {
		t.Fatalf("want a Die, got %s", mustJSON(&e))
	}
	var s string
	if err := json.Unmarshal(f.Cause[0].Defect, &s); err != nil {
		t.Fatalf("defect %s: %v", f.Cause[0].Defect, err)
	}
	return s
}

func failOf(t *testing.T, e t3rpc.Exit) t3rpc.TaggedError {
	t.Helper()
	f, ok := e.Exit.GetExitFailure()
	if !ok || len(f.Cause) == 0 || f.Cause[0].Tag != "Fail" {
		t.Fatalf("want a Fail, got %s", mustJSON(&e))
	}
	return f.Cause[0].Error.Value
}

func seqOf(t *testing.T, c *client, e t3rpc.Exit) int64 {
	t.Helper()
	var r t3rpc.DispatchResult
	if err := r.Decode(jx.DecodeBytes(c.success(e))); err != nil {
		t.Fatal(err)
	}
	return r.Sequence
}

// Command payloads as T3's web client sends them (shapes from testdata/t3).

func createThreadPayload(cmd, tid, pid string) string {
	return fmt.Sprintf(`{"type":"thread.create","commandId":%q,"createdBy":"user","creationSource":"web","threadId":%q,"projectId":%q,"title":"test thread","modelSelection":{"instanceId":"codex","model":"gpt-5.6-sol"},"runtimeMode":"full-access","interactionMode":"default","branch":null,"worktreePath":null}`, cmd, tid, pid)
}

func dispatchPayload(cmd, tid, mid, text string) string {
	return fmt.Sprintf(`{"type":"message.dispatch","commandId":%q,"createdBy":"user","creationSource":"mcp","threadId":%q,"messageId":%q,"text":%q,"attachments":[],"modelSelection":{"instanceId":"codex","model":"gpt-5.6-sol","options":[{"id":"reasoningEffort","value":"high"}]},"dispatchMode":{"type":"start_immediately"}}`, cmd, tid, mid, text)
}

func interruptPayload(cmd, tid, rid string) string {
	return fmt.Sprintf(`{"type":"run.interrupt","commandId":%q,"threadId":%q,"runId":%q,"reason":"test: stop"}`, cmd, tid, rid)
}

func respondPayload(cmd, tid, reqID string) string {
	return fmt.Sprintf(`{"type":"runtime-request.respond","commandId":%q,"threadId":%q,"requestId":%q,"answers":{"scope":"Workspace","checks":["lint","test"]}}`, cmd, tid, reqID)
}

func runID(tid string, n int) string { return fmt.Sprintf("run:thread:%s:ordinal:%d", tid, n) }
