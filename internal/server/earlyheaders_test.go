package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// TestEarlyAnswerHeaders: a POST with one tools/call gets a call stream whose
// answer headers the tool can send before the answer (a blocked t3_wait); the
// name is always the server's (a client's is dropped), a batch or another
// request gets none, a JSON answer or one already begun is left alone, and
// nothing is written once the request is over.
func TestEarlyAnswerHeaders(t *testing.T) {
	const call = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_wait"}}`
	serve := func(body, contentType string, inside func(w http.ResponseWriter, r *http.Request)) (*httptest.ResponseRecorder, string) {
		t.Helper()
		var name string
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			name = r.Header.Get(tools.CallStreamHeader)
			w.Header().Set("Content-Type", contentType) // as the go-sdk does before the tool runs
			inside(w, r)
		})
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		req.Header.Set("Mcp-Session-Id", "s1")
		req.Header.Set(tools.CallStreamHeader, "the-clients-own")
		rec := httptest.NewRecorder()
		abandonedCalls(next, 1<<20).ServeHTTP(rec, req)
		return rec, name
	}

	t.Run("sse", func(t *testing.T) {
		var flushedEarly bool
		rec, name := serve(call, "text/event-stream", func(w http.ResponseWriter, r *http.Request) {
			tools.SendCallHeaders(r.Header)
			tools.SendCallHeaders(r.Header) // once only
			flushedEarly = w.(interface{ Unwrap() http.ResponseWriter }).Unwrap().(*httptest.ResponseRecorder).Flushed
			_, _ = w.Write([]byte("event: message\ndata: {}\n\n"))
			_ = http.NewResponseController(w).Flush()
		})
		if name == "" || name == "the-clients-own" {
			t.Fatalf("call stream name %q: want one of the server's", name)
		}
		if !flushedEarly || rec.Code != http.StatusOK || rec.Body.String() != "event: message\ndata: {}\n\n" {
			t.Fatalf("flushed before the answer %v, status %d, body %q", flushedEarly, rec.Code, rec.Body.String())
		}
		// Over: the name no longer sends anything.
		tools.SendCallHeaders(http.Header{tools.CallStreamHeader: {name}})
		if rec.Body.String() != "event: message\ndata: {}\n\n" {
			t.Fatal("a call stream wrote after its request was over")
		}
	})
	t.Run("status after the early headers", func(t *testing.T) {
		next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			tools.SendCallHeaders(r.Header)
			w.WriteHeader(http.StatusNotFound) // as the go-sdk's error status of a newer protocol would
			_, _ = w.Write([]byte("event: message\ndata: {}\n\n"))
		})
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(call))
		req.Header.Set("Mcp-Session-Id", "s1")
		cw := &statusCounter{ResponseRecorder: httptest.NewRecorder()}
		abandonedCalls(next, 1<<20).ServeHTTP(cw, req)
		if cw.statuses != 1 || cw.Code != http.StatusOK {
			t.Fatalf("%d statuses written, the answer's %d: want one, 200 (a later one is too late)", cw.statuses, cw.Code)
		}
	})
	t.Run("json answer", func(t *testing.T) {
		rec, _ := serve(call, "application/json", func(w http.ResponseWriter, r *http.Request) {
			tools.SendCallHeaders(r.Header)
			if rec := w.(interface{ Unwrap() http.ResponseWriter }).Unwrap().(*httptest.ResponseRecorder); rec.Flushed {
				t.Error("headers sent early for a JSON answer")
			}
			w.WriteHeader(http.StatusAccepted)
		})
		if rec.Code != http.StatusAccepted {
			t.Fatalf("status %d, want the SDK's own", rec.Code)
		}
	})
	t.Run("answer begun", func(t *testing.T) {
		rec, _ := serve(call, "text/event-stream", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusBadRequest)
			tools.SendCallHeaders(r.Header)
		})
		if rec.Code != http.StatusBadRequest {
			t.Fatalf("status %d, want the SDK's own", rec.Code)
		}
	})
	for what, body := range map[string]string{
		"batch":        `[` + call + `]`,
		"notification": `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
	} {
		t.Run(what, func(t *testing.T) {
			_, name := serve(body, "text/event-stream", func(w http.ResponseWriter, r *http.Request) {})
			if name != "" {
				t.Fatalf("call stream %q for a %s", name, what)
			}
		})
	}
}

// statusCounter counts the statuses written to it (net/http logs each one after the first).
type statusCounter struct {
	*httptest.ResponseRecorder
	statuses int
}

func (s *statusCounter) WriteHeader(code int) {
	s.statuses++
	s.ResponseRecorder.WriteHeader(code)
}
