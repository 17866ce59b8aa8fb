package app_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// answerHeadersRT notes when the answer's status and headers of a POST that
// calls t3_wait reached the client (RoundTrip returns with them, before the body).
type answerHeadersRT struct {
	base    http.RoundTripper
	headers atomic.Int32
	sse     atomic.Bool
}

func (r *answerHeadersRT) RoundTrip(req *http.Request) (*http.Response, error) {
	isWait := false
	if req.Method == http.MethodPost && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, err
		}
		isWait = bytes.Contains(body, []byte(`"t3_wait"`))
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := r.base.RoundTrip(req)
	if isWait && err == nil {
		r.sse.Store(resp.Header.Get("Content-Type") == "text/event-stream" && resp.StatusCode == http.StatusOK)
		r.headers.Add(1)
	}
	return resp, err
}

// TestABlockedWaitSendsItsAnswersHeaders: once t3_wait blocks on a run that is
// not over, the client has the answer's status and SSE headers (so that at the
// wake it reads one event, not the headers and the event); the result comes on
// that stream when the run settles, and a wait that ends at once is answered
// as before.
func TestABlockedWaitSendsItsAnswersHeaders(t *testing.T) {
	leakCheck(t)
	h := manualHarness(t)
	c := h.client("setup")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptDone})
	tid := str(d, "thread_id")

	rt := &answerHeadersRT{base: &http.Transport{}}
	t.Cleanup(rt.base.(*http.Transport).CloseIdleConnections)
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "early-headers", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{Transport: rt}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })

	type answer struct {
		res *mcp.CallToolResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "t3_wait", Arguments: map[string]any{"thread_id": tid, "timeout": 3600}})
		done <- answer{res, err}
	}()
	eventually(t, 20*time.Second, "the wait to block", func() bool { return h.app.Deps.ActiveWaits() == 1 }, nil)
	eventually(t, 20*time.Second, "the blocked wait's answer headers at the client", func() bool { return rt.headers.Load() == 1 }, nil)
	if !rt.sse.Load() {
		t.Fatal("the early answer is not 200 text/event-stream")
	}
	select {
	case a := <-done:
		t.Fatalf("the wait returned before its run settled: %+v %v", a.res, a.err)
	default:
	}
	h.fake.StepAll()
	a := <-done
	if a.err != nil || a.res.IsError {
		t.Fatalf("wait: %v %+v", a.err, a.res)
	}
	if sc, _ := a.res.StructuredContent.(map[string]any); sc["reason"] != "completed" {
		t.Fatalf("wait result %v", a.res.StructuredContent)
	}

	// A wait that ends at once (the run is over) answers with its headers, as before.
	rowCaughtUp(t, h, tid, map[string]any{"reason": "completed", "state": map[string]any{"status": "completed"}})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "t3_wait", Arguments: map[string]any{"thread_id": tid, "timeout": 5}})
	if err != nil || res.IsError {
		t.Fatalf("second wait: %v %+v", err, res)
	}
	if sc, _ := res.StructuredContent.(map[string]any); sc["reason"] != "completed" || rt.headers.Load() != 2 || !rt.sse.Load() {
		t.Fatalf("second wait %v, %d answers' headers, sse %v", res.StructuredContent, rt.headers.Load(), rt.sse.Load())
	}
}
