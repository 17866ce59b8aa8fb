package t3

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testToken is distinctive so a leak into any message or log line is found.
const testToken = "t3tok-SECRET-7c1e9a44-0d1b-4b7e-b0c2-do-not-print"

// safety bounds waits that should finish at once; it is never the thing tested.
const safety = 10 * time.Second

const (
	recorded  = "../../testdata/t3/t3-v2-pr2829"
	synthetic = "../../testdata/t3/t3-v2-gate-synthetic.json"
)

type fxExchange struct {
	Name            string            `json:"name"`
	Method          string            `json:"method"`
	URL             string            `json:"url"`
	RequestHeaders  map[string]string `json:"requestHeaders"`
	Status          int               `json:"status"`
	ResponseHeaders map[string]string `json:"responseHeaders"`
	ResponseBody    json.RawMessage   `json:"responseBody"`
}

// body is the response body as sent: recordings keep it as text, the
// synthetic file as JSON.
func (e fxExchange) body() string {
	if len(e.ResponseBody) == 0 || string(e.ResponseBody) == "null" {
		return ""
	}
	if e.ResponseBody[0] == '"' {
		var s string
		if err := json.Unmarshal(e.ResponseBody, &s); err != nil {
			panic(err)
		}
		return s
	}
	return string(e.ResponseBody)
}

type fxFrame struct {
	Dir  string `json:"dir"`
	Data string `json:"data"`
}

type fxFile struct {
	Exchanges []fxExchange `json:"exchanges"`
	Frames    []fxFrame    `json:"frames"`
}

func loadFx(t testing.TB, path string) fxFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var f fxFile
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return f
}

// rec is exchange i of a recording.
func rec(t testing.TB, file string, i int) fxExchange {
	t.Helper()
	return loadFx(t, filepath.Join(recorded, file)).Exchanges[i]
}

// synth is the synthetic gate exchange whose name starts with name.
func synth(t testing.TB, name string) fxExchange {
	t.Helper()
	for _, e := range loadFx(t, synthetic).Exchanges {
		if strings.HasPrefix(e.Name, name) {
			return e
		}
	}
	t.Fatalf("no synthetic exchange %q", name)
	return fxExchange{}
}

// recordedSend is the recorded client frame (a Request) with id in file.
func recordedSend(t testing.TB, file, id string) t3rpc.Request {
	t.Helper()
	for _, fr := range loadFx(t, filepath.Join(recorded, file)).Frames {
		if fr.Dir != "send" || !strings.HasPrefix(fr.Data, fmt.Sprintf(`{"_tag":"Request","id":%q,`, id)) {
			continue
		}
		var m t3rpc.ClientMessage
		if err := m.UnmarshalJSON([]byte(fr.Data)); err != nil {
			t.Fatal(err)
		}
		return m.Request
	}
	t.Fatalf("%s: no recorded request %s", file, id)
	return t3rpc.Request{}
}

// recordedExit is the recorded Exit for requestID in file, re-addressed to newID.
func recordedExit(t testing.TB, file, requestID, newID string) string {
	t.Helper()
	old := fmt.Sprintf(`{"_tag":"Exit","requestId":%q,`, requestID)
	for _, fr := range loadFx(t, filepath.Join(recorded, file)).Frames {
		if fr.Dir == "recv" && strings.HasPrefix(fr.Data, old) {
			return fmt.Sprintf(`{"_tag":"Exit","requestId":%q,`, newID) + strings.TrimPrefix(fr.Data, old)
		}
	}
	t.Fatalf("%s: no recorded Exit for %s", file, requestID)
	return ""
}

type seenReq struct {
	method, path, rawQuery string
	header                 http.Header
}

// fakeT3 is a T3 Code server on 127.0.0.1 that answers with the recorded
// exchanges (t3-v2-pr2829) plus the protocol-2 gate (t3-v2-gate-synthetic):
// 400 on orchestration reads without the protocol header, 426 on /ws without
// orchestrationProtocol=2, single-use tickets.
type fakeT3 struct {
	t   *testing.T
	srv *httptest.Server

	// descriptor is the body of /.well-known/t3/environment.
	descriptor string
	// wsProtocol is the orchestrationProtocol /ws insists on ("2").
	wsProtocol string
	// wsBody, when set, is the 426 body.
	wsBody string
	// preGate answers /bounded like the recorded pre-gate build (503 text).
	preGate bool
	// hang makes every /api route wait for the client to give up.
	hang bool
	// internalError answers the shell with a 500.
	internalError bool
	// readOnly answers the shell with the recorded 403 insufficient_scope body.
	readOnly bool
	// echoToken answers the shell with a 400 whose message repeats the token.
	echoToken bool
	// rejectTickets answers every upgrade with the recorded 401.
	rejectTickets bool
	// ws runs each accepted socket; n counts sockets from 1.
	ws func(n int, p *wsPeer)

	mu      sync.Mutex
	seen    []seenReq
	tickets map[string]bool // issued ticket → used
	issued  int
	sockets int
}

func newFake(t *testing.T) *fakeT3 {
	f := &fakeT3{
		t:          t,
		descriptor: synth(t, "descriptor-protocol-2").body(),
		wsProtocol: "2",
		tickets:    map[string]bool{},
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeT3) client(t *testing.T, name string, opts Options) *Client {
	t.Helper()
	c, err := NewClient(name, f.srv.URL, testToken, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (f *fakeT3) requests() []seenReq {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenReq(nil), f.seen...)
}

func write(w http.ResponseWriter, status int, contentType, body string) {
	if contentType != "" {
		w.Header().Set("Content-Type", contentType)
	}
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func writeEx(w http.ResponseWriter, e fxExchange) {
	ct := e.ResponseHeaders["content-type"]
	if ct == "" && e.body() != "" {
		ct = "application/json"
	}
	write(w, e.Status, ct, e.body())
}

// auth classifies the credential like T3 would: the real token, the recorded
// bad one, or none.
func auth(r *http.Request) string {
	switch r.Header.Get("Authorization") {
	case "Bearer " + testToken:
		return "good"
	case "":
		return "none"
	default:
		return "bad"
	}
}

func (f *fakeT3) serve(w http.ResponseWriter, r *http.Request) {
	t := f.t
	f.mu.Lock()
	f.seen = append(f.seen, seenReq{method: r.Method, path: r.URL.EscapedPath(), rawQuery: r.URL.RawQuery, header: r.Header.Clone()})
	f.mu.Unlock()

	path := r.URL.EscapedPath()
	if path == "/.well-known/t3/environment" {
		write(w, 200, "application/json", f.descriptor)
		return
	}
	if path == "/ws" {
		f.serveWS(w, r)
		return
	}
	if f.hang {
		<-r.Context().Done()
		return
	}
	if path == "/api/auth/session" {
		writeEx(w, rec(t, "01-http-descriptor-and-session.json", map[string]int{"none": 2, "bad": 3, "good": 4}[auth(r)]))
		return
	}
	switch auth(r) {
	case "none":
		writeEx(w, rec(t, "02-http-reads-empty.json", 0))
		return
	case "bad":
		writeEx(w, rec(t, "02-http-reads-empty.json", 1))
		return
	}
	if r.Method == http.MethodPost && path == "/api/auth/websocket-ticket" {
		f.mu.Lock()
		f.issued++
		tk := fmt.Sprintf("ticket-%d", f.issued)
		f.tickets[tk] = false
		f.mu.Unlock()
		e := rec(t, "03-http-project-ticket-scopes.json", 4)
		write(w, e.Status, "application/json", strings.Replace(e.body(), "REDACTED", tk, 1))
		return
	}
	if strings.HasPrefix(path, "/api/orchestration/") || path == "/api/projects" {
		// The protocol-2 gate: orchestration reads need the header.
		if strings.HasPrefix(path, "/api/orchestration/") && r.Header.Get("x-t3-orchestration-protocol") != "2" {
			writeEx(w, synth(t, "read-without-protocol-header"))
			return
		}
	}
	switch {
	case path == "/api/orchestration/shell":
		switch {
		case f.internalError:
			write(w, 500, "application/json", `{"_tag":"EnvironmentInternalError","code":"internal_error","reason":"orchestration_snapshot_failed","traceId":"0af7651916cd43dd8448eb211c80319c"}`)
		case f.readOnly:
			writeEx(w, rec(t, "03-http-project-ticket-scopes.json", 10))
		case f.echoToken:
			write(w, 400, "application/json", `{"_tag":"EnvironmentRequestInvalidError","code":"invalid_request","message":"bad header Bearer `+testToken+`"}`)
		default:
			writeEx(w, rec(t, "11-http-reads-populated.json", 0))
		}
	case path == "/api/projects":
		writeEx(w, rec(t, "11-http-reads-populated.json", 3))
	case strings.HasPrefix(path, "/api/orchestration/threads/"):
		f.serveThread(w, r, strings.TrimPrefix(path, "/api/orchestration/threads/"))
	default:
		write(w, 503, "text/plain", "No static directory configured and no dev URL set.")
	}
}

// threadBodies maps the recorded thread ids to their recorded bodies.
func threadBodies(t *testing.T) map[string]string {
	out := map[string]string{}
	for _, e := range loadFx(t, filepath.Join(recorded, "11-http-reads-populated.json")).Exchanges {
		if _, id, ok := strings.Cut(e.URL, "/api/orchestration/threads/"); ok {
			out[id] = e.body()
		}
	}
	return out
}

// oddThreadID exercises path escaping: T3 thread ids may hold ':' and '%'.
const oddThreadID = "thread:odd%id/with slash"

func (f *fakeT3) serveThread(w http.ResponseWriter, r *http.Request, rest string) {
	t := f.t
	seg, suffix, _ := strings.Cut(rest, "/")
	id, err := url.PathUnescape(seg)
	if err != nil {
		write(w, 400, "text/plain", "bad escape")
		return
	}
	bodies := threadBodies(t)
	if id == oddThreadID {
		id = "thread-edec8901-ce32-45b4-82ca-65ecac9ec39b"
	}
	body, ok := bodies[id]
	if !ok {
		writeEx(w, rec(t, "02-http-reads-empty.json", 6))
		return
	}
	switch suffix {
	case "":
		write(w, 200, "application/json", body)
	case "bounded":
		if f.preGate {
			writeEx(w, rec(t, "02-http-reads-empty.json", 7))
			return
		}
		// The synthetic gate exchange only sketches the projection; take the
		// recorded one and add the bounded fields.
		write(w, 200, "application/json", strings.TrimSuffix(body, "}")+`,"historyCursor":"opaque-cursor","hasMoreHistory":true,"latestLocalTurnOrdinal":1}`)
	case "history":
		if r.URL.Query().Get("cursor") == "garbage" {
			writeEx(w, synth(t, "history-bad-cursor"))
			return
		}
		writeEx(w, synth(t, "thread-history"))
	default:
		write(w, 503, "text/plain", "No static directory configured and no dev URL set.")
	}
}

func (f *fakeT3) serveWS(w http.ResponseWriter, r *http.Request) {
	t := f.t
	q := r.URL.Query()
	// T3 checks the protocol before any credential (ws.ts).
	if q.Get("orchestrationProtocol") != f.wsProtocol {
		body := f.wsBody
		if body == "" {
			body = synth(t, "ws-without-protocol-param").body()
		}
		write(w, 426, "application/json", body)
		return
	}
	f.mu.Lock()
	used, issued := f.tickets[q.Get("wsTicket")]
	if issued && !used {
		f.tickets[q.Get("wsTicket")] = true
	}
	f.sockets++
	n := f.sockets
	f.mu.Unlock()
	if !issued || used || f.rejectTickets {
		writeEx(w, rec(t, "04-ws-upgrade-auth.json", 3))
		return
	}
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		t.Errorf("accept: %v", err)
		return
	}
	defer func() { _ = ws.CloseNow() }()
	ws.SetReadLimit(-1)
	p := &wsPeer{t: t, ws: ws, in: make(chan t3rpc.ClientMessage, 256), closed: make(chan struct{})}
	go p.readLoop()
	if f.ws != nil {
		f.ws(n, p)
	}
	<-p.closed
}

// wsPeer is the server side of one socket: Pings are answered, everything
// else is handed to the script.
type wsPeer struct {
	t      *testing.T
	ws     *websocket.Conn
	in     chan t3rpc.ClientMessage
	closed chan struct{}
}

func (p *wsPeer) readLoop() {
	defer close(p.closed)
	for {
		_, data, err := p.ws.Read(context.Background())
		if err != nil {
			return
		}
		var m t3rpc.ClientMessage
		if err := m.UnmarshalJSON(data); err != nil {
			p.t.Errorf("server: undecodable %s: %v", data, err)
			continue
		}
		if m.IsPing() {
			p.send(`{"_tag":"Pong"}`)
			continue
		}
		p.in <- m
	}
}

func (p *wsPeer) request() (t3rpc.Request, bool) {
	select {
	case m := <-p.in:
		if !m.IsRequest() {
			p.t.Errorf("server: want a Request, got %v", m.Type)
			return t3rpc.Request{}, false
		}
		return m.Request, true
	case <-p.closed:
		return t3rpc.Request{}, false
	case <-time.After(safety):
		p.t.Errorf("server: no request within %v", safety)
		return t3rpc.Request{}, false
	}
}

func (p *wsPeer) send(frame string) {
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	_ = p.ws.Write(ctx, websocket.MessageText, []byte(frame))
}

func (p *wsPeer) drop() { _ = p.ws.CloseNow() }

func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	t.Cleanup(cancel)
	return ctx
}
