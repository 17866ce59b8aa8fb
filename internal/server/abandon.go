package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"

	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// abandonedCalls cancels the tool calls of a POST /mcp whose client went away
// (dropped connection, closed stream) before their answers were written. The
// SDK keeps running such a call until it returns — for t3_wait up to its
// timeout, an hour at most, holding a slot of T3CODE_MCP_MAX_WAITS — because
// a stateful session might resume the stream. No resumption is offered here
// (no event store), so a call whose stream is gone has no reader: it is
// cancelled through the SDK's own path, a notifications/cancelled for each
// call id posted into the session, exactly as a client that cancels sends.
func abandonedCalls(next http.Handler, maxBody int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(tools.CallStreamHeader) // only ever the one set below
		session := r.Header.Get("Mcp-Session-Id")
		if r.Method != http.MethodPost || session == "" || r.Body == nil {
			next.ServeHTTP(w, r)
			return
		}
		// Read at most maxBody (T3CODE_MCP_MAX_BODY_BYTES), answering a body
		// over it, or one that cannot be read, as the SDK's handler would.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		_ = r.Body.Close()
		if err != nil {
			if mbe, ok := errors.AsType[*http.MaxBytesError](err); ok {
				http.Error(w, fmt.Sprintf("request body exceeds %d bytes", mbe.Limit), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "failed to read body", http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		ids := toolCallIDs(body)
		if len(ids) == 0 {
			next.ServeHTTP(w, r)
			return
		}
		// What the cancels carry, taken before the SDK has the request.
		header, host := r.Header.Clone(), r.Host
		// The connection closed while the call ran (the server cancels a request's context
		// only then, before the handler returns): the cancels run on a goroutine of their own,
		// started only then — a call answered in time starts none.
		gone := make(chan struct{})
		stop := context.AfterFunc(r.Context(), func() {
			defer close(gone)
			for _, id := range ids {
				cancelCall(next, header, host, id)
			}
		})
		if len(ids) == 1 && !isBatch(body) {
			// A tool that blocks sends the answer's headers then (tools.OpenCallStream).
			ew := &earlyWriter{w: w}
			unregister := tools.OpenCallStream(r.Header, ew.sendHeaders)
			defer func() {
				unregister()
				ew.end() // a tool still running must not write after the request
			}()
			w = ew
		}
		next.ServeHTTP(w, r)
		if !stop() {
			<-gone // the cancels began: they are done before the request is
		}
	})
}

// toolCallIDs returns the JSON-RPC ids of the tools/call requests in a POST
// body (one message or a batch); nil when there are none.
func toolCallIDs(body []byte) []json.RawMessage {
	type msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
	}
	var msgs []msg
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		if json.Unmarshal(trimmed, &msgs) != nil {
			return nil
		}
	} else {
		var m msg
		if json.Unmarshal(trimmed, &m) != nil {
			return nil
		}
		msgs = []msg{m}
	}
	var ids []json.RawMessage
	for _, m := range msgs {
		if m.Method == "tools/call" && len(m.ID) > 0 && string(m.ID) != "null" {
			ids = append(ids, m.ID)
		}
	}
	return ids
}

// cancelCall posts notifications/cancelled for call id into the session the
// call's headers name, through the SDK handler, with the call's Host (Go keeps
// it in Request.Host, never in the header map; an empty one stays empty).
func cancelCall(h http.Handler, header http.Header, host string, id json.RawMessage) {
	body, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0", "method": "notifications/cancelled",
		"params": map[string]any{"requestId": id, "reason": "the client's connection closed"},
	})
	req, err := http.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
	if err != nil {
		return
	}
	for _, k := range []string{"Mcp-Session-Id", "Mcp-Protocol-Version", "Authorization"} {
		if v := header.Get(k); v != "" {
			req.Header.Set(k, v)
		}
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	h.ServeHTTP(discard{header: http.Header{}}, req)
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{ header http.Header }

func (d discard) Header() http.Header         { return d.header }
func (d discard) Write(p []byte) (int, error) { return len(p), nil }
func (d discard) WriteHeader(int)             {}

// isBatch reports whether a POST body is a JSON-RPC batch.
func isBatch(body []byte) bool {
	b := bytes.TrimSpace(body)
	return len(b) > 0 && b[0] == '['
}

// earlyWriter is the ResponseWriter of a POST with one tools/call: the call's
// tool may send the answer's status and headers before the answer
// (sendHeaders, from the tool's goroutine), so every write is under one lock.
type earlyWriter struct {
	mu    sync.Mutex
	w     http.ResponseWriter
	wrote bool // the status line is written (by sendHeaders or the SDK)
	early bool // sendHeaders wrote it: 200, whatever status the SDK sets afterwards
}

func (e *earlyWriter) Header() http.Header { return e.w.Header() }

func (e *earlyWriter) Write(p []byte) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.wrote = true
	return e.w.Write(p)
}

func (e *earlyWriter) WriteHeader(code int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.early {
		// The answer went out as 200 text/event-stream when the tool blocked; a status set
		// after that (the go-sdk's error statuses of newer protocol versions) can no longer be
		// sent, and passing it on would only make net/http log a superfluous WriteHeader.
		return
	}
	e.wrote = true
	e.w.WriteHeader(code)
}

// FlushError is what http.ResponseController's Flush calls (the go-sdk
// flushes each SSE event so).
func (e *earlyWriter) FlushError() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return http.NewResponseController(e.w).Flush()
}

// Unwrap gives http.ResponseController the connection's writer for what is
// not a write (deadlines).
func (e *earlyWriter) Unwrap() http.ResponseWriter { return e.w }

// end is called once the request is over: nothing is written after it.
func (e *earlyWriter) end() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.wrote = true
}

// sendHeaders writes and flushes the status and headers of an SSE answer
// that has not begun: the go-sdk set them before it handed the call to the
// tool, and an SSE answer is 200 whatever the call's result (a tool's error
// is a result too). Anything else (an answer begun, a JSON answer) is left
// to the SDK.
func (e *earlyWriter) sendHeaders() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wrote || e.w.Header().Get("Content-Type") != "text/event-stream" {
		return
	}
	e.wrote, e.early = true, true
	e.w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(e.w).Flush()
}
