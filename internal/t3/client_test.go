package t3

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

func TestHandshakeProtocol2(t *testing.T) {
	f := newFake(t)
	d, err := f.client(t, "build", Options{}).Handshake(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if d.EnvironmentID != "070c6e7b-7282-44d6-8b30-dc750800468f" || d.Label != "build-box" || d.ServerVersion != "0.1.0" ||
		d.Protocol != 2 || d.OS != "linux" || d.Arch != "x64" || len(d.Capabilities) == 0 {
		t.Fatalf("%+v", d)
	}
}

func TestHandshakeRefusesOtherProtocols(t *testing.T) {
	cases := []struct {
		name, machine, body, want string
	}{
		{"synthetic protocol 1", "mac", synth(t, "descriptor-protocol-1").body(),
			`machine "mac" runs T3 Code 0.0.45 (orchestration protocol 1); t3code-mcp needs T3 Code 0.1.0 or later (protocol 2)`},
		// The recorded pre-gate build has no orchestrationProtocolVersion: protocol 1.
		{"recorded pre-gate build", "vm", rec(t, "01-http-descriptor-and-session.json", 0).body(),
			`machine "vm" runs T3 Code 0.0.31 (orchestration protocol 1); t3code-mcp needs T3 Code 0.1.0 or later (protocol 2)`},
		{"newer protocol", "next", `{"environmentId":"e","label":"l","serverVersion":"0.3.0","orchestrationProtocolVersion":3}`,
			`machine "next" runs T3 Code 0.3.0 (orchestration protocol 3); this t3code-mcp speaks protocol 2 only: update t3code-mcp`},
	}
	for _, tc := range cases {
		f := newFake(t)
		f.descriptor = tc.body
		_, err := f.client(t, tc.machine, Options{}).Handshake(tctx(t))
		var inc *IncompatibleError
		if !errors.As(err, &inc) || err.Error() != tc.want {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// One variant put the protocol inside capabilities; it counts when the top
// level is silent.
func TestHandshakeProtocolInCapabilities(t *testing.T) {
	f := newFake(t)
	f.descriptor = `{"environmentId":"e","label":"l","serverVersion":"0.1.0","capabilities":{"repositoryIdentity":true,"orchestrationProtocolVersion":2}}`
	d, err := f.client(t, "x", Options{}).Handshake(tctx(t))
	if err != nil || d.Protocol != 2 {
		t.Fatalf("%v %+v", err, d)
	}
}

func TestSession(t *testing.T) {
	f := newFake(t)
	s, err := f.client(t, "vm", Options{}).Session(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Authenticated || len(s.Scopes) != 8 || s.Scopes[0] != "orchestration:read" || s.ExpiresAt == "" || s.Method != "bearer-access-token" {
		t.Fatalf("%+v", s)
	}
	c, err := NewClient("vm", f.srv.URL, "not-a-real-token", Options{})
	if err != nil {
		t.Fatal(err)
	}
	// T3 never answers 401 here: an unknown token is just not authenticated.
	if s, err := c.Session(tctx(t)); err != nil || s.Authenticated {
		t.Fatalf("bad token: %v %+v", err, s)
	}
}

func TestReads(t *testing.T) {
	f := newFake(t)
	c := f.client(t, "vm", Options{})
	ctx := tctx(t)

	if _, err := c.Handshake(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Session(ctx); err != nil {
		t.Fatal(err)
	}
	shell, err := c.Shell(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if shell.SnapshotSequence != 154 || len(shell.Threads) < 3 || len(shell.Projects) != 1 {
		t.Fatalf("shell %d threads=%d projects=%d", shell.SnapshotSequence, len(shell.Threads), len(shell.Projects))
	}
	th, err := c.Thread(ctx, "thread-6dcf45e8-edb5-4e41-bef9-584ba76aa7d3")
	if err != nil {
		t.Fatal(err)
	}
	if th.SnapshotSequence != 154 || th.Projection.Thread.ID != "thread-6dcf45e8-edb5-4e41-bef9-584ba76aa7d3" {
		t.Fatalf("thread %+v", th.Projection.Thread)
	}
	b, _, err := c.threadBounded(ctx, "thread-edec8901-ce32-45b4-82ca-65ecac9ec39b", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cur, ok := b.HistoryCursor.Get(); !ok || cur != "opaque-cursor" || !b.HasMoreHistory.Or(false) {
		t.Fatalf("bounded %+v", b)
	}
	h, err := c.ThreadHistory(ctx, "thread-edec8901-ce32-45b4-82ca-65ecac9ec39b", "opaque-cursor")
	if err != nil {
		t.Fatal(err)
	}
	if h.SnapshotSequence != 41 || len(h.Items) != 0 || h.HasMoreHistory.Or(true) {
		t.Fatalf("history %+v", h)
	}
	ps, err := c.Projects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || ps[0].Title != "fixtures" {
		t.Fatalf("projects %+v", ps)
	}
	// ':' '%' '/' and ' ' in a thread id reach T3 escaped, as one path segment.
	odd, err := c.Thread(ctx, oddThreadID)
	if err != nil {
		t.Fatalf("odd id: %v", err)
	}
	if odd.Projection.Thread.ID != "thread-edec8901-ce32-45b4-82ca-65ecac9ec39b" {
		t.Fatal("odd id not routed")
	}

	reqs := f.requests()
	if len(reqs) != 8 {
		t.Fatalf("%d requests, want 8 (one per call)", len(reqs))
	}
	checkHeaders(t, reqs)
}

// checkHeaders: the descriptor goes without a credential; every /api request
// carries the bearer token; orchestration reads and projects carry the
// protocol header; the token never travels in a URL.
func checkHeaders(t *testing.T, reqs []seenReq) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("no requests seen")
	}
	for _, r := range reqs {
		if strings.Contains(r.path+"?"+r.rawQuery, testToken) {
			t.Errorf("token in URL of %s %s", r.method, r.path)
		}
		authz := r.header.Get("Authorization")
		switch {
		case r.path == "/.well-known/t3/environment", r.path == "/ws":
			if authz != "" {
				t.Errorf("%s sent Authorization", r.path)
			}
		case strings.HasPrefix(r.path, "/api/"):
			if authz != "Bearer "+testToken {
				t.Errorf("%s %s: Authorization %q", r.method, r.path, authz)
			}
		}
		needsProto := strings.HasPrefix(r.path, "/api/orchestration/") || r.path == "/api/projects"
		if got := r.header.Get("x-t3-orchestration-protocol"); needsProto && got != "2" {
			t.Errorf("%s %s: x-t3-orchestration-protocol %q", r.method, r.path, got)
		}
	}
}

// The fake enforces the gate like a released server: without the header an
// orchestration read is a 400.
func TestGateWithoutHeaderIs400(t *testing.T) {
	f := newFake(t)
	req, _ := http.NewRequestWithContext(tctx(t), http.MethodGet, f.srv.URL+"/api/orchestration/shell", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestHTTPErrors(t *testing.T) {
	ctx := tctx(t)

	f := newFake(t)
	bad, err := NewClient("vm", f.srv.URL, "not-a-real-token", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = bad.Shell(ctx)
	wantErr(t, err, 401, "auth_invalid", `token for machine "vm" is invalid or expired`, IssueCommand, "token_env")

	none, err := NewClient("vm", f.srv.URL, "", Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = none.Shell(ctx)
	wantErr(t, err, 0, CodeNoToken, `no token for machine "vm"`, IssueCommand)

	c := f.client(t, "vm", Options{})
	_, err = c.Thread(ctx, "thread-does-not-exist")
	wantErr(t, err, 404, "not_found", `thread "thread-does-not-exist" not found on machine "vm"`)

	_, err = c.ThreadHistory(ctx, "thread-edec8901-ce32-45b4-82ca-65ecac9ec39b", "garbage")
	wantErr(t, err, 400, "invalid_request", "invalid_history_cursor")

	f.readOnly = true
	_, err = c.Shell(ctx)
	wantErr(t, err, 403, "insufficient_scope", `token for machine "vm" lacks scope "orchestration:operate"`, IssueCommand)
	f.readOnly = false

	f.internalError = true
	_, err = c.Shell(ctx)
	wantErr(t, err, 500, "internal_error", `T3 on machine "vm" had an internal error during shell (reason: orchestration_snapshot_failed)`)
	f.internalError = false

	// The recorded pre-gate build answers /bounded with a text/plain 503.
	f.preGate = true
	_, _, err = c.threadBounded(ctx, "thread-edec8901-ce32-45b4-82ca-65ecac9ec39b", nil)
	wantErr(t, err, 503, "", "HTTP 503", "No static directory configured")
	f.preGate = false

	// A server that repeats the token back must not get it into a message.
	f.echoToken = true
	_, err = c.Shell(ctx)
	wantErr(t, err, 400, "invalid_request", "REDACTED")
	f.echoToken = false
}

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	c, err := NewClient("gone", "http://"+addr, testToken, Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Shell(tctx(t))
	wantErr(t, err, 0, CodeUnreachable, `machine "gone" at http://`+addr+` is unreachable (`, "refused")
	_, err = c.DialRPC(tctx(t))
	wantErr(t, err, 0, CodeUnreachable, `machine "gone" at http://`+addr+` is unreachable`)

	// The HTTP timeout (not the caller's context) ends a hanging request.
	f := newFake(t)
	f.hang = true
	slow := f.client(t, "slow", Options{Timeout: 50 * time.Millisecond})
	_, err = slow.Shell(tctx(t))
	wantErr(t, err, 0, CodeTimeout, `machine "slow" at `+f.srv.URL+` is unreachable (no answer to shell within 50ms)`)

	// The caller's own cancel is reported as such.
	ctx, cancel := context.WithCancel(tctx(t))
	cancel()
	_, err = slow.Shell(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestNewClientValidates(t *testing.T) {
	for _, u := range []string{"ftp://x", "localhost:3773", "http://user:hunter2@host:1"} {
		_, err := NewClient("m", u, testToken, Options{})
		if err == nil || strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), `machine "m"`) {
			t.Errorf("%s: %v", u, err)
		}
	}
	c, err := NewClient("m", "https://t3.example:8443/prefix/", " "+testToken+"\n", Options{})
	if err != nil || c.URL() != "https://t3.example:8443/prefix" || c.token != testToken {
		t.Fatalf("%v %s", err, c.URL())
	}
}

// wantErr checks a *Error's status, code and message, and that the token is
// nowhere in it.
func wantErr(t *testing.T, err error, status int, code string, contains ...string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%v (%T) is not *t3.Error", err, err)
	}
	if e.Status != status || e.Code != code {
		t.Errorf("status %d code %q, want %d %q: %s", e.Status, e.Code, status, code, e.Message)
	}
	for _, s := range contains {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("message %q lacks %q", err.Error(), s)
		}
	}
	if strings.Contains(err.Error(), testToken) {
		t.Errorf("token leaked: %s", err.Error())
	}
}

// Every log line of a busy client, at debug level, is free of the token.
func TestLogsNeverCarryToken(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	f := newFake(t)
	f.ws = func(n int, p *wsPeer) {
		if r, ok := p.request(); ok {
			p.send(recordedExit(t, "05-ws-basic-run.json", "0", r.ID.String))
		}
	}
	// Pings every 20 ms for debug lines; a Pong may be late on a loaded machine.
	c := f.client(t, "vm", Options{Logger: log, RPC: effectrpc.Options{PingInterval: 20 * time.Millisecond, PongTimeout: safety}})
	ctx := tctx(t)
	_, _ = c.Handshake(ctx)
	_, _ = c.Shell(ctx)
	conn, err := c.DialRPC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetConfig(ctx, conn); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	if buf.Len() == 0 {
		t.Fatal("nothing logged at debug level; the test would prove nothing")
	}
	if strings.Contains(buf.String(), testToken) || strings.Contains(buf.String(), "ticket-1") {
		t.Fatalf("secret in logs:\n%s", buf.String())
	}
}

// A machine on this host is asked for uncompressed answers (T3 gzips when
// asked, and Go's transport asks by default: CPU on both sides for nothing on
// a loopback link); one over the network keeps the transport's gzip; the
// machine's compression key overrides either.
func TestLoopbackMachineAsksForUncompressedAnswers(t *testing.T) {
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.Store(r.Header.Get("Accept-Encoding"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"schemaVersion":2,"snapshotSequence":1,"threads":[]}`))
	}))
	t.Cleanup(srv.Close)
	for _, u := range []string{srv.URL, strings.Replace(srv.URL, "127.0.0.1", "localhost", 1)} {
		c, err := NewClient("m", u, "tok", Options{})
		if err != nil {
			t.Fatal(err)
		}
		got.Store("")
		_, _ = c.Shell(tctx(t)) // the answer's shape does not matter here
		if v := got.Load(); v != "identity" {
			t.Fatalf("%s: Accept-Encoding %q, want identity", u, v)
		}
	}
	// compression = "gzip" on a loopback URL (a tunnel to a distant machine): the
	// transport's own Accept-Encoding, gzip.
	c, err := NewClient("m", srv.URL, "tok", Options{Compression: "gzip"})
	if err != nil {
		t.Fatal(err)
	}
	_, _ = c.Shell(tctx(t))
	if v := got.Load(); v != "gzip" {
		t.Fatalf(`compression "gzip": Accept-Encoding %q, want gzip`, v)
	}
	for host, want := range map[string]bool{
		"127.0.0.1": true, "127.3.4.5": true, "::1": true, "localhost": true, "LocalHost": true,
		"10.0.0.7": false, "192.168.1.20": false, "100.64.1.2": false, "t3.example.com": false, "": false, "::": false,
	} {
		if got := isLoopback(host); got != want {
			t.Errorf("isLoopback(%q) = %v, want %v", host, got, want)
		}
		for compression, want := range map[string]bool{"": want, "auto": want, "gzip": false, "none": true} {
			if got := uncompressed(compression, host); got != want {
				t.Errorf("uncompressed(%q, %q) = %v, want %v", compression, host, got, want)
			}
		}
	}
}
