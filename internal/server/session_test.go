package server_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/server"
)

// TestAnUnknownSessionIsNotFound: a replica that never saw a session (it lives on another replica
// behind the load balancer, or this one restarted) answers its id with HTTP 404, as the MCP
// streamable HTTP transport says, so the client starts a new session with initialize; and that
// initialize, on this replica, works. The bearer and the body limit in front of the SDK keep the
// answer as it is.
func TestAnUnknownSessionIsNotFound(t *testing.T) {
	o := server.Options{Token: testToken, MaxBodyBytes: 1 << 20}
	a, b := start(t, o), start(t, o)
	code, h, body := post(t, a, "", bearer("Bearer "+testToken), initialize)
	sid := h.Get("Mcp-Session-Id")
	if code != http.StatusOK || sid == "" {
		t.Fatalf("initialize on replica a: %d %q %s", code, sid, body)
	}
	withSession := bearer("Bearer " + testToken)
	withSession.Set("Mcp-Session-Id", sid)
	withSession.Set("Mcp-Protocol-Version", "2025-06-18")
	// The session works where it was made...
	if code, _, body := post(t, a, "", withSession, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); code != http.StatusOK {
		t.Fatalf("tools/list on replica a: %d %s", code, body)
	}
	// ...and is not found elsewhere, for every method the transport uses.
	if code, _, body := post(t, b, "", withSession, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); code != http.StatusNotFound {
		t.Fatalf("POST with a session replica b never saw: %d %s, want 404", code, body)
	}
	for _, method := range []string{http.MethodGet, http.MethodDelete} {
		req, err := http.NewRequest(method, b.URL+"/mcp", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = withSession.Clone()
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := b.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("%s with a session replica b never saw: %d, want 404", method, resp.StatusCode)
		}
	}
	// The client re-initializes: a new session on replica b.
	code, h, body = post(t, b, "", bearer("Bearer "+testToken), initialize)
	if code != http.StatusOK || h.Get("Mcp-Session-Id") == "" || h.Get("Mcp-Session-Id") == sid || !strings.Contains(body, "serverInfo") {
		t.Fatalf("initialize on replica b: %d %q %s", code, h.Get("Mcp-Session-Id"), body)
	}
}
