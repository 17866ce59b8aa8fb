package t3fake

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

type tokenSource string

func (t tokenSource) Bearer(context.Context, t3api.OperationName) (t3api.Bearer, error) {
	return t3api.Bearer{Token: string(t)}, nil
}

func errBody(t *testing.T, r httpResp) (tag, code, reason string) {
	t.Helper()
	m := asMap(t, []byte(r.body))
	if str(m, "traceId") == "" {
		t.Errorf("error body without traceId: %s", r.body)
	}
	return str(m, "_tag"), str(m, "code"), str(m, "reason")
}

// goGet runs a read on its own goroutine and delivers its status (0 on a transport error).
func goGet(u, tok string) <-chan int {
	out := make(chan int, 1)
	go func() {
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			out <- 0
			return
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("x-t3-orchestration-protocol", "2")
		res, err := httpClient.Do(req)
		if err != nil {
			out <- 0
			return
		}
		res.Body.Close()
		out <- res.StatusCode
	}()
	return out
}

func TestDescriptorAndProtocolSwitch(t *testing.T) {
	s := StartT(t, Options{Label: "build-box"})
	api, err := t3api.NewClient(s.URL(), tokenSource(s.Token()), t3api.WithClient(httpClient))
	if err != nil {
		t.Fatal(err)
	}
	d, err := api.GetEnvironment(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.Label != "build-box" || d.ServerVersion != "0.1.0" || d.OrchestrationProtocolVersion.Value != 2 || d.EnvironmentId != s.EnvironmentID() {
		t.Errorf("descriptor %+v", d)
	}
	other := StartT(t, Options{Label: "other"})
	if other.EnvironmentID() == s.EnvironmentID() {
		t.Error("two labels share an environment id")
	}

	s.SetProtocol(1)
	d, err = api.GetEnvironment(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if d.OrchestrationProtocolVersion.Set || d.ServerVersion != "0.0.45" {
		t.Errorf("protocol-1 descriptor %+v", d)
	}
	// No gates on a protocol-1 server.
	if r := doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/shell", map[string]string{"Authorization": "Bearer " + s.Token()}, ""); r.status != 200 {
		t.Errorf("protocol-1 read without header: %d", r.status)
	}
	ws, _, err := websocket.Dial(context.Background(), s.WebSocketURL(), &websocket.DialOptions{
		HTTPClient: httpClient, HTTPHeader: map[string][]string{"Authorization": {"Bearer " + s.Token()}},
	})
	if err != nil {
		t.Fatalf("protocol-1 upgrade without parameter: %v", err)
	}
	_ = ws.CloseNow()
	s.SetProtocol(2)
	if r := doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/shell", map[string]string{"Authorization": "Bearer " + s.Token()}, ""); r.status != 400 {
		t.Errorf("protocol-2 read without header: %d", r.status)
	}
}

func TestUpgradeGateAndAuth(t *testing.T) {
	s := StartT(t, Options{TicketTTL: time.Hour})
	base := s.URL() + "/ws"
	get := func(query string, h map[string]string) httpResp {
		return doHTTP(t, nil, "GET", base+query, h, "")
	}
	tk := mintTicket(t, s, s.Token())
	// The protocol gate comes first and does not spend the ticket.
	r := get("?wsTicket="+tk, nil)
	if r.status != 426 || r.body != `{"code":"orchestration_protocol_incompatible","message":"Update this client to one that supports orchestration protocol 2.","orchestrationProtocolVersion":2}` {
		t.Errorf("426: %d %s", r.status, r.body)
	}
	for _, c := range []struct {
		query  string
		header map[string]string
		reason string
	}{
		{"?orchestrationProtocol=2", nil, "missing_credential"},
		{"?orchestrationProtocol=2&wsTicket=not-a-real-ticket", nil, "invalid_credential"},
		{"?orchestrationProtocol=2", map[string]string{"Authorization": "Bearer not-a-real-token"}, "invalid_credential"},
	} {
		r := get(c.query, c.header)
		if tag, code, reason := errBody(t, r); r.status != 401 || tag != "EnvironmentAuthInvalidError" || code != "auth_invalid" || reason != c.reason {
			t.Errorf("%s: %d %s", c.query, r.status, r.body)
		}
	}
	dialURL := func(u string, h map[string][]string) error {
		ws, _, err := websocket.Dial(context.Background(), u, &websocket.DialOptions{HTTPClient: httpClient, HTTPHeader: h})
		if err == nil {
			_ = ws.CloseNow()
		}
		return err
	}
	wsURL := s.WebSocketURL() + "?orchestrationProtocol=2&wsTicket=" + tk
	if err := dialURL(wsURL, nil); err != nil {
		t.Fatalf("ticket after a 426: %v", err)
	}
	if err := dialURL(wsURL, nil); err == nil {
		t.Error("a ticket was accepted twice")
	}
	if err := dialURL(s.WebSocketURL()+"?orchestrationProtocol=2", map[string][]string{"Authorization": {"Bearer " + s.Token()}}); err != nil {
		t.Errorf("Bearer upgrade: %v", err)
	}

	short := StartT(t, Options{TicketTTL: time.Nanosecond})
	if err := dialURL(short.WebSocketURL()+"?orchestrationProtocol=2&wsTicket="+mintTicket(t, short, short.Token()), nil); err == nil {
		t.Error("an expired ticket was accepted")
	}
	// The server counts an upgrade on its own goroutine, which may finish
	// after the client's dial returned.
	deadline := time.Now().Add(5 * time.Second)
	got := s.Stats()
	for (got.WSConnections != 2 || got.HTTPRequests["GET /ws"] != 7) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
		got = s.Stats()
	}
	if got.TicketsIssued != 1 || got.WSConnections != 2 || got.HTTPRequests["GET /ws"] != 7 {
		t.Errorf("stats %+v", got)
	}
}

func TestSessionTicketsAndSwitches(t *testing.T) {
	s := StartT(t, Options{ReadOnlyToken: "ro"})
	sess := func(h map[string]string) map[string]any {
		r := doHTTP(t, nil, "GET", s.URL()+"/api/auth/session", h, "")
		if r.status != 200 {
			t.Fatalf("session: %d", r.status)
		}
		return asMap(t, []byte(r.body))
	}
	if m := sess(nil); m["authenticated"] != false || len(m) != 1 {
		t.Errorf("no token: %v", m)
	}
	if m := sess(bearer("not-a-real-token")); m["authenticated"] != false {
		t.Errorf("bad token: %v", m)
	}
	if m := sess(bearer(s.Token())); m["authenticated"] != true || mustJSON(m["scopes"]) != `["orchestration:read","orchestration:operate"]` ||
		m["sessionMethod"] != "bearer-access-token" || str(m, "expiresAt") == "" {
		t.Errorf("full token: %v", m)
	}
	if m := sess(bearer("ro")); mustJSON(m["scopes"]) != `["orchestration:read"]` {
		t.Errorf("read-only token: %v", m)
	}

	ticketURL := s.URL() + "/api/auth/websocket-ticket"
	if r := doHTTP(t, nil, "POST", ticketURL, nil, ""); r.status != 401 {
		t.Errorf("ticket without token: %d", r.status)
	}
	r := doHTTP(t, nil, "POST", ticketURL, bearer(s.Token()), "")
	if m := asMap(t, []byte(r.body)); r.status != 200 || str(m, "ticket") == "" || str(m, "expiresAt") == "" || r.header.Get("Cache-Control") != "no-store" {
		t.Errorf("ticket: %d %s", r.status, r.body)
	}
	s.RefuseTickets(true)
	r = doHTTP(t, nil, "POST", ticketURL, bearer(s.Token()), "")
	if tag, _, reason := errBody(t, r); r.status != 500 || tag != "EnvironmentInternalError" || reason != "websocket_ticket_issuance_failed" {
		t.Errorf("refused ticket: %d %s", r.status, r.body)
	}
	s.RefuseTickets(false)

	s.SetUnauthorized(true)
	for _, u := range []string{"/api/orchestration/shell", "/api/projects"} {
		r := doHTTP(t, nil, "GET", s.URL()+u, bearer(s.Token()), "")
		if _, _, reason := errBody(t, r); r.status != 401 || reason != "invalid_credential" {
			t.Errorf("unauthorized %s: %d %s", u, r.status, r.body)
		}
	}
	if m := sess(bearer(s.Token())); m["authenticated"] != false {
		t.Errorf("session while unauthorized: %v", m)
	}
	s.SetUnauthorized(false)
	c := dial(t, s, s.Token(), nil)

	// StopPongs: a Ping sent before a call gets no Pong ahead of the call's Exit.
	s.StopPongs(true)
	c.ping()
	c.call("server.probe", `{}`)
	if len(c.other) != 0 {
		t.Errorf("pong while stopped: %v", c.other)
	}
	s.StopPongs(false)
	c.barrier()

	s.DropConnections()
	for {
		if _, open := <-c.in; !open {
			break
		}
	}
	for s.Stats().WSOpen != 0 {
		runtime.Gosched() // the server notices the drop on its own goroutines
	}
	c2 := dial(t, s, s.Token(), nil)
	c2.call("server.probe", `{}`)
}

func TestHTTPReads(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 2, ReadOnlyToken: "ro"})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	tid := "thread:with%odd/chars"
	c.success(c.call("orchestration.dispatchCommand", createThreadPayload("c1", tid, pid)))
	c.success(c.call("orchestration.dispatchCommand", dispatchPayload("c2", tid, "m-1", "hello")))
	s.StepAll()

	shellURL := s.URL() + "/api/orchestration/shell"
	if r := doHTTP(t, nil, "GET", shellURL, nil, ""); r.status != 401 {
		t.Errorf("no token: %d", r.status)
	}
	r := doHTTP(t, nil, "GET", shellURL, map[string]string{"Authorization": "Bearer " + s.Token()}, "")
	if tag, code, reason := errBody(t, r); r.status != 400 || tag != "EnvironmentRequestInvalidError" || code != "invalid_request" || reason != "invalid_request" {
		t.Errorf("no protocol header: %d %s", r.status, r.body)
	}
	if r := doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/snapshot", bearer(s.Token()), ""); r.status != 503 {
		t.Errorf("a route T3 does not have: %d %s", r.status, r.body)
	}
	r = doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/nope", bearer(s.Token()), "")
	if tag, code, reason := errBody(t, r); r.status != 404 || tag != "EnvironmentResourceNotFoundError" || code != "not_found" || reason != "thread_not_found" {
		t.Errorf("unknown thread: %d %s", r.status, r.body)
	}

	// The connector's own generated client decodes every body.
	api, err := t3api.NewClient(s.URL(), tokenSource(s.Token()), t3api.WithClient(httpClient))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	shellRes, err := api.GetShell(ctx, t3api.GetShellParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2})
	if err != nil {
		t.Fatal(err)
	}
	snap, isSnap := shellRes.(*t3api.ShellSnapshot)
	if !isSnap || snap.SnapshotSequence != s.Head() || len(snap.Threads) != 1 || snap.Threads[0].Status != "completed" {
		t.Fatalf("shell %#v", shellRes)
	}
	thRes, err := api.GetThread(ctx, t3api.GetThreadParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2, ThreadId: tid})
	if err != nil {
		t.Fatal(err)
	}
	full, isFull := thRes.(*t3api.ThreadSnapshot)
	if !isFull || full.Projection.Thread.ID != tid || len(full.Projection.TurnItems) != 5 {
		t.Fatalf("thread %#v", thRes)
	}
	bRes, err := api.GetThreadBounded(ctx, t3api.GetThreadBoundedParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2, ThreadId: tid})
	if err != nil {
		t.Fatal(err)
	}
	b := bRes.(*t3api.BoundedThreadSnapshot)
	if len(b.Projection.TurnItems) != 2 || !b.HasMoreHistory.Value || b.HistoryCursor.Null || b.LatestLocalTurnOrdinal.Value != 1000005 || b.PayloadBudgetExceeded.Or(true) {
		t.Fatalf("bounded %+v", b)
	}
	var ordinals []int64
	for _, it := range b.Projection.TurnItems {
		ordinals = append(ordinals, it.Ordinal)
	}
	cursor := b.HistoryCursor.Value
	for pages := 0; ; pages++ {
		hRes, err := api.GetThreadHistory(ctx, t3api.GetThreadHistoryParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2, ThreadId: tid, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		h := hRes.(*t3api.ThreadHistoryPage)
		var page []int64
		for _, it := range h.Items {
			page = append(page, it.Ordinal)
		}
		ordinals = append(page, ordinals...)
		if !h.HasMoreHistory.Value {
			if !h.NextCursor.Null || pages != 1 {
				t.Errorf("last page %+v after %d pages", h, pages)
			}
			break
		}
		cursor = h.NextCursor.Value
	}
	if !slices.Equal(ordinals, []int64{1000001, 1000002, 1000003, 1000004, 1000005}) {
		t.Errorf("bounded + history ordinals %v", ordinals)
	}
	r = doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/"+url.PathEscape(tid)+"/history?cursor=garbage", bearer(s.Token()), "")
	if _, _, reason := errBody(t, r); r.status != 400 || reason != "invalid_history_cursor" {
		t.Errorf("bad cursor: %d %s", r.status, r.body)
	}
	pRes, err := api.ListProjects(ctx, t3api.ListProjectsParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2})
	if err != nil {
		t.Fatal(err)
	}
	if pl := pRes.(*t3api.ProjectList); len(pl.Projects) != 1 || pl.Projects[0].ID != pid || !pl.Projects[0].DeletedAt.Null {
		t.Errorf("projects %+v", pl)
	}

	mutate := s.URL() + "/api/projects/mutate"
	body := `{"type":"project.create","commandId":"c","projectId":"project-web","title":"web","workspaceRoot":"/srv/web"}`
	r = doHTTP(t, nil, "POST", mutate, bearer("ro"), body)
	if m := asMap(t, []byte(r.body)); r.status != 403 || m["_tag"] != "EnvironmentScopeRequiredError" || m["code"] != "insufficient_scope" || m["requiredScope"] != "orchestration:operate" {
		t.Errorf("mutate read-only: %d %s", r.status, r.body)
	}
	if r = doHTTP(t, nil, "POST", mutate, bearer(s.Token()), `{"type":"project.create","title":"bad"}`); r.status != 400 || r.body != "" {
		t.Errorf("mutate bad body: %d %q", r.status, r.body)
	}
	if r = doHTTP(t, nil, "POST", mutate, bearer(s.Token()), body); r.status != 200 || str(asMap(t, []byte(r.body)), "id") != "project-web" {
		t.Errorf("mutate: %d %s", r.status, r.body)
	}
}

func TestHTTPFaults(t *testing.T) {
	s := StartT(t, Options{})
	shellURL := s.URL() + "/api/orchestration/shell"
	s.HTTPFail(503)
	r := doHTTP(t, nil, "GET", shellURL, bearer(s.Token()), "")
	if tag, code, reason := errBody(t, r); r.status != 503 || tag != "EnvironmentInternalError" || code != "internal_error" || reason != "orchestration_snapshot_failed" {
		t.Errorf("HTTPFail: %d %s", r.status, r.body)
	}
	s.HTTPFail(0)

	s.HTTPHang(true)
	status := goGet(shellURL, s.Token())
	for s.Stats().HTTPRequests["GET /api/orchestration/shell"] != 2 {
		runtime.Gosched() // until the request is inside the server, hanging
	}
	s.HTTPHang(false)
	if st := <-status; st != 200 {
		t.Errorf("released read: %d", st)
	}

	// A hanging read ends with the client's own deadline, and with Close.
	s.HTTPHang(true)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", shellURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+s.Token())
	req.Header.Set("x-t3-orchestration-protocol", "2")
	done := make(chan error, 1)
	go func() {
		res, err := httpClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		done <- err
	}()
	for s.Stats().HTTPRequests["GET /api/orchestration/shell"] != 3 {
		runtime.Gosched()
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("a cancelled hanging read succeeded")
	}
}

func TestItemHook(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	var mu sync.Mutex
	kinds := map[string]int{}
	var seqs []int64
	s.OnItemSent(func(kind string, seq int64, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		kinds[kind]++
		if strings.HasPrefix(kind, "thread:") && kind != "thread:snapshot" && kind != "thread:synchronized" {
			seqs = append(seqs, seq)
		}
	})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	c := dial(t, s, s.Token(), nil)
	c.subscribeReady("orchestration.subscribeShell", `{"requestCompletionMarker":true}`)
	th := c.subscribeReady("orchestration.subscribeThread", fmt.Sprintf(`{"threadId":%q}`, tid))
	if _, err := s.StartRun(tid, "go"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	c.waitItem(th, 0, isEvent("run.updated", "status", "completed"))
	c.barrier() // the hook runs right after the write, before the writer's next round
	mu.Lock()
	defer mu.Unlock()
	total := 0
	for _, n := range kinds {
		total += n
	}
	if int64(total) != s.Stats().ItemsSent || kinds["shell:snapshot"] != 1 || kinds["thread:run.updated"] != 3 || kinds["shell:thread.updated"] != 8 {
		t.Errorf("hook saw %v (total %d), stats %d", kinds, total, s.Stats().ItemsSent)
	}
	if !slices.IsSorted(seqs) || len(seqs) != 13 {
		t.Errorf("event sequences %v", seqs)
	}
	s.OnItemSent(nil)
}

func TestCloseEndsEverything(t *testing.T) {
	s, err := New(Options{StepDelay: DefaultStepDelay})
	if err != nil {
		t.Fatal(err)
	}
	pid := s.AddProject("p", "/p")
	for i := range 20 {
		if _, err := s.StartRun(s.AddThread(pid, fmt.Sprint(i), "idle"), "hang forever"); err != nil {
			t.Fatal(err)
		}
	}
	c := dial(t, s, s.Token(), nil)
	c.subscribeReady("orchestration.subscribeShell", `{}`)
	s.HTTPHang(true)
	status := goGet(s.URL()+"/api/projects", s.Token())
	for s.Stats().HTTPRequests["GET /api/projects"] != 1 {
		runtime.Gosched()
	}
	s.Close() // releases the hanging read
	<-status
	s.Close() // twice is harmless
	for {
		if _, open := <-c.in; !open {
			break
		}
	}
	if _, err := New(Options{Protocol: 3}); err == nil {
		t.Error("protocol 3 accepted")
	}
	if _, err := New(Options{Addr: "256.0.0.1:0"}); err == nil {
		t.Error("bad address accepted")
	}
}

// getBody GETs one of the fake's orchestration routes and returns status and body.
func getBody(t *testing.T, s *Server, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, s.URL()+path, nil)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	for k, v := range bearer(s.Token()) {
		req.Header.Set(k, v)
	}
	res, err := httpClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Error(err)
	}
	return res.StatusCode, b
}

// TestThreadReadsDoNotWaitForTheServerLock pins that the HTTP reads of one thread (full,
// bounded, a history page) are answered while Server.mu is held, as it is by the driver's steps
// of other threads under load: they take the thread's own lock. Were they to take Server.mu
// again, this test would hang.
func TestThreadReadsDoNotWaitForTheServerLock(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 2})
	pid := s.AddProject("payments", "/srv/payments")
	tid := s.AddThread(pid, "Fix the flaky test", "idle")
	if _, err := s.StartRun(tid, "attempt one"); err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	s.mu.Lock()
	head := s.head
	defer s.mu.Unlock()
	for _, path := range []string{"/api/orchestration/threads/" + tid, "/api/orchestration/threads/" + tid + "/bounded",
		"/api/orchestration/threads/" + tid + "/history?cursor=" + historyCursor(1_000_010)} {
		status, body := getBody(t, s, path)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		var head0 struct {
			Seq int64 `json:"snapshotSequence"`
		}
		if err := json.Unmarshal(body, &head0); err != nil || head0.Seq != head {
			t.Errorf("GET %s: snapshotSequence %d (%v), want the head %d", path, head0.Seq, err, head)
		}
	}
}

// TestThreadReadsWhileRunsStep reads threads over HTTP while runs are started and stepped on
// them and on others, for the race detector: the reads take only the thread's lock, so every
// change of what they read must happen under it. Each body must be a snapshot with its
// projection.
func TestThreadReadsWhileRunsStep(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, KeepRuns: 3})
	pid := s.AddProject("payments", "/srv/payments")
	threads := []string{s.AddThread(pid, "a", "idle"), s.AddThread(pid, "b", "idle"), s.AddThread(pid, "c", "idle")}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 30 {
			for _, tid := range threads {
				if _, err := s.StartRun(tid, fmt.Sprintf("attempt %d", i)); err != nil {
					t.Error(err)
					return
				}
			}
			s.StepAll()
		}
	}()
	reads := 0
	for running := true; running; reads++ {
		select {
		case <-done:
			running = false
		default:
		}
		tid := threads[reads%len(threads)]
		for _, path := range []string{"/api/orchestration/threads/" + tid, "/api/orchestration/threads/" + tid + "/bounded"} {
			status, body := getBody(t, s, path)
			var snap struct {
				Seq        int64           `json:"snapshotSequence"`
				Projection json.RawMessage `json:"projection"`
			}
			if status != http.StatusOK {
				t.Fatalf("GET %s: %d %s", path, status, body)
			}
			if err := json.Unmarshal(body, &snap); err != nil || snap.Seq == 0 || len(snap.Projection) == 0 {
				t.Fatalf("GET %s: %v: %.200s", path, err, body)
			}
		}
	}
	if reads < 2 {
		t.Fatalf("only %d rounds of reads", reads)
	}
}
