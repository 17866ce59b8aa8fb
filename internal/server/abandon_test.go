package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestToolCallIDs: the ids of tools/call requests in a POST body, one message
// or a batch; notifications, other methods and malformed bodies give none.
func TestToolCallIDs(t *testing.T) {
	for body, want := range map[string]string{
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_wait"}}`:                                                                     `7`,
		`{"jsonrpc":"2.0","id":"a-1","method":"tools/call"}`:                                                                                             `"a-1"`,
		`[{"jsonrpc":"2.0","id":1,"method":"tools/call"},{"jsonrpc":"2.0","id":2,"method":"tools/list"},{"jsonrpc":"2.0","id":3,"method":"tools/call"}]`: `1,3`,
		`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`:                                                                  ``,
		`{"jsonrpc":"2.0","id":null,"method":"tools/call"}`:                                                                                              ``,
		`{"jsonrpc":"2.0","id":4,"method":"initialize"}`:                                                                                                 ``,
		`not json`: ``,
		``:         ``,
	} {
		var got []string
		for _, id := range toolCallIDs([]byte(body)) {
			got = append(got, string(id))
		}
		if strings.Join(got, ",") != want {
			t.Errorf("%s: ids %v, want %s", body, got, want)
		}
	}
}

// FuzzToolCallIDs: any POST body is read without a panic, and every id found
// is valid JSON that a cancel notification can carry back.
func FuzzToolCallIDs(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_wait","arguments":{"thread_id":"t"}}}`))
	f.Add([]byte(`[{"jsonrpc":"2.0","id":"x","method":"tools/call"},{"jsonrpc":"2.0","method":"notifications/initialized"}]`))
	f.Add([]byte(`{"id":{"nested":true},"method":"tools/call"}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, id := range toolCallIDs(body) {
			if !json.Valid(id) {
				t.Fatalf("id %q is not JSON", id)
			}
			if _, err := json.Marshal(map[string]any{"requestId": id}); err != nil {
				t.Fatalf("id %q cannot be sent back: %v", id, err)
			}
		}
	})
}

// posted is what the handler behind abandonedCalls saw of a cancel notification.
type posted struct {
	host, session, body string
}

// abandon serves one tools/call (id 7) on session s1 with the given Host
// through abandonedCalls, drops its connection while it runs, and returns the
// cancel notification the wrapper posted for it.
func abandon(t *testing.T, host string) posted {
	t.Helper()
	cancels := make(chan posted, 1)
	running, cancelled := make(chan struct{}), make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), "notifications/cancelled") {
			cancels <- posted{host: r.Host, session: r.Header.Get("Mcp-Session-Id"), body: string(body)}
			close(cancelled)
			return
		}
		close(running)
		<-cancelled // the call runs until it is cancelled
	})
	ctx, drop := context.WithCancel(context.Background())
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/mcp",
		strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_wait"}}`))
	req.Host = host
	req.Header.Set("Mcp-Session-Id", "s1")
	served := make(chan struct{})
	go func() {
		defer close(served)
		abandonedCalls(next, 1<<20).ServeHTTP(httptest.NewRecorder(), req)
	}()
	<-running
	drop()
	<-served
	select {
	case c := <-cancels:
		return c
	default:
		t.Fatal("no notifications/cancelled was posted for the abandoned call")
		return posted{}
	}
}

// The cancel of an abandoned call goes to its session with the Host its client
// sent (Go keeps Host out of the header map), and a request without a Host
// still has its call cancelled.
func TestAbandonedCallIsCancelledWithItsHost(t *testing.T) {
	for _, host := range []string{"127.0.0.1:8080", "localhost", ""} {
		c := abandon(t, host)
		if c.host != host || c.session != "s1" || !strings.Contains(c.body, `"requestId":7`) {
			t.Errorf("Host %q: cancel posted with Host %q, session %q, body %s; want the call's Host, session s1 and requestId 7", host, c.host, c.session, c.body)
		}
	}
}

// A POST of a session is read at most to the body limit
// (T3CODE_MCP_MAX_BODY_BYTES): a larger one is answered 413 naming the limit,
// as the SDK's handler answers, and never reaches it.
func TestAbandonedCallsBoundTheBody(t *testing.T) {
	const limit = 64
	reached := false
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = true })
	src := &countingReader{r: strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"pad":"` + strings.Repeat("a", 1<<20) + `"}}`)}
	req := httptest.NewRequest(http.MethodPost, "/mcp", src)
	req.Header.Set("Mcp-Session-Id", "s1")
	rec := httptest.NewRecorder()
	abandonedCalls(next, limit).ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(rec.Body.String(), "64") || reached {
		t.Fatalf("1 MiB body, limit %d: %d %q (handler reached: %v), want 413 naming the limit", limit, rec.Code, rec.Body.String(), reached)
	}
	if src.n > limit+1 {
		t.Fatalf("read %d bytes of a body over a %d-byte limit", src.n, limit)
	}
}

// countingReader counts the bytes read from r.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}
