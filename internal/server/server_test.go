package server_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/server"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const testToken = "inbound-bearer-Zq81xVd0"

// start serves the real handler (no machines) on a 127.0.0.1 listener.
func start(t *testing.T, o server.Options) *httptest.Server {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	f := fleet.New(&config.Config{}, st, fleet.Options{Logger: log})
	d := &tools.Deps{Fleet: f, Threads: st, Keys: store.DispatchKeys{Store: st}, Logger: log}
	srv := server.NewMCPServer(d, "test")
	o.Logger = log
	if o.Registry == nil {
		o.Registry = prometheus.NewRegistry()
	}
	hs := httptest.NewServer(server.Handler(srv, f, o))
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		_ = st.Close()
	})
	return hs
}

// initialize is a raw MCP initialize request, as the first POST of a session.
const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

func post(t *testing.T, hs *httptest.Server, host string, header http.Header, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, hs.URL+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range header {
		req.Header[k] = v
	}
	if host != "" {
		req.Host = host
	}
	resp, err := hs.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, resp.Header, string(b)
}

func get(t *testing.T, hs *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := hs.Client().Get(hs.URL + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func bearer(v string) http.Header { return http.Header{"Authorization": {v}} }

// With T3CODE_MCP_TOKEN set, /mcp refuses requests without the exact bearer
// and says what to send; the token never appears in the refusal.
func TestBearerRequiredOnMCP(t *testing.T) {
	hs := start(t, server.Options{Token: testToken})
	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"no header", nil},
		{"empty bearer", bearer("Bearer ")},
		{"wrong token", bearer("Bearer not-the-token")},
		{"prefix of the token", bearer("Bearer " + testToken[:len(testToken)-1])},
		{"token plus extra", bearer("Bearer " + testToken + "x")},
		{"other scheme", bearer("Basic " + testToken)},
		{"token without scheme", bearer(testToken)},
		{"token in another header", http.Header{"X-Api-Key": {testToken}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, hdr, body := post(t, hs, "", tc.header, initialize)
			if code != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401: %s", code, body)
			}
			if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("WWW-Authenticate = %q", hdr.Get("WWW-Authenticate"))
			}
			if !strings.Contains(body, "Authorization: Bearer") || !strings.Contains(body, "T3CODE_MCP_TOKEN") {
				t.Errorf("body does not say what to send: %s", body)
			}
			if strings.Contains(body, testToken) {
				t.Errorf("the refusal echoes the token: %s", body)
			}
		})
	}
	// GET (the SSE stream) and DELETE (session end) are guarded the same way.
	for _, m := range []string{http.MethodGet, http.MethodDelete} {
		req, _ := http.NewRequest(m, hs.URL+"/mcp", nil)
		resp, err := hs.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s /mcp without bearer: %d, want 401", m, resp.StatusCode)
		}
	}
	// The right token opens the door: the raw initialize is answered.
	for _, h := range []string{"Bearer " + testToken, "bearer " + testToken, "Bearer  " + testToken + " "} {
		if code, _, body := post(t, hs, "", bearer(h), initialize); code != http.StatusOK {
			t.Errorf("Authorization %q: status %d: %s", h, code, body)
		}
	}
}

type headerRT struct {
	h    http.Header
	base http.RoundTripper
}

func (r headerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range r.h {
		req.Header[k] = v
	}
	return r.base.RoundTrip(req)
}

func connect(ctx context.Context, hs *httptest.Server, h http.Header) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp", HTTPClient: &http.Client{Transport: headerRT{h, hs.Client().Transport}}}
	return c.Connect(ctx, tr, nil)
}

// A real MCP client gets in with the token, and not without it.
func TestRealClientWithAndWithoutToken(t *testing.T) {
	hs := start(t, server.Options{Token: testToken})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if s, err := connect(ctx, hs, nil); err == nil {
		s.Close()
		t.Fatal("connected without a token")
	} else if !strings.Contains(err.Error(), "401") && !strings.Contains(strings.ToLower(err.Error()), "unauthorized") {
		t.Fatalf("error without a token does not say unauthorized: %v", err)
	}
	if s, err := connect(ctx, hs, bearer("Bearer wrong")); err == nil {
		s.Close()
		t.Fatal("connected with a wrong token")
	}
	s, err := connect(ctx, hs, bearer("Bearer "+testToken))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lt, err := s.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(lt.Tools) != len(tools.All()) {
		t.Fatalf("%d tools listed, want %d", len(lt.Tools), len(tools.All()))
	}
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "t3_machines"})
	if err != nil || res.IsError {
		t.Fatalf("t3_machines: %v %+v", err, res)
	}
}

// /healthz, /metrics and / stay open when /mcp is guarded: probes and
// scrapers carry no MCP token. They reveal no secret (see the app's secrets
// test for that).
func TestHealthStaysOpen(t *testing.T) {
	hs := start(t, server.Options{Token: testToken})
	code, body := get(t, hs, "/healthz")
	if code != http.StatusOK {
		t.Fatalf("/healthz: %d", code)
	}
	var h map[string]any
	if err := json.Unmarshal([]byte(body), &h); err != nil || h["ok"] != true {
		t.Fatalf("/healthz body %q: %v", body, err)
	}
	if code, _ := get(t, hs, "/metrics"); code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	if code, body := get(t, hs, "/"); code != http.StatusOK || !strings.Contains(body, "/mcp") {
		t.Fatalf("/: %d %q", code, body)
	}
	if code, _ := get(t, hs, "/nope"); code != http.StatusNotFound {
		t.Fatalf("/nope: %d", code)
	}
}

// The SDK's DNS-rebinding protection stays on: a request that reached the
// loopback listener under a foreign Host name (a browser tricked by a
// rebinding DNS name) is refused, with and without a token configured.
func TestDNSRebindingRefused(t *testing.T) {
	for _, token := range []string{"", testToken} {
		hs := start(t, server.Options{Token: token})
		auth := bearer("Bearer " + token)
		if token == "" {
			auth = nil
		}
		for _, host := range []string{"evil.example", "evil.example:80", "attacker.test:" + strings.Split(hs.Listener.Addr().String(), ":")[1]} {
			code, _, body := post(t, hs, host, auth, initialize)
			if code != http.StatusForbidden {
				t.Errorf("token set %v, Host %q: status %d, want 403 (%s)", token != "", host, code, body)
			}
			if !strings.Contains(body, "Host") {
				t.Errorf("403 body does not name the Host header: %q", body)
			}
		}
		for _, host := range []string{"", "localhost", "127.0.0.1"} {
			if code, _, body := post(t, hs, host, auth, initialize); code != http.StatusOK {
				t.Errorf("token set %v, Host %q: status %d (%s)", token != "", host, code, body)
			}
		}
	}
}

// A body above MaxBodyBytes is refused with 413 before it is parsed; one just
// below is served.
func TestBodyLimit(t *testing.T) {
	const limit = 4096
	hs := start(t, server.Options{MaxBodyBytes: limit})
	pad := func(n int) string {
		// initialize with a padded clientInfo name: valid JSON of exactly n bytes.
		base := strings.Replace(initialize, `"raw"`, `""`, 1)
		return strings.Replace(base, `""`, `"`+strings.Repeat("a", n-len(base))+`"`, 1)
	}
	if b := pad(limit); len(b) != limit {
		t.Fatalf("pad: %d bytes", len(b))
	}
	if code, _, body := post(t, hs, "", nil, pad(limit)); code != http.StatusOK {
		t.Fatalf("body of exactly the limit: %d %s", code, body)
	}
	code, _, body := post(t, hs, "", nil, pad(limit+1))
	if code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "4096") {
		t.Fatalf("body one byte over: %d %q, want 413 naming the limit", code, body)
	}
	code, _, _ = post(t, hs, "", nil, pad(limit*64))
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("big body: %d, want 413", code)
	}
	// The server is fine afterwards.
	if code, _ := get(t, hs, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz after 413s: %d", code)
	}
}
