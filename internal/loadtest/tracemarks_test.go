package loadtest

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"runtime/trace"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestTraceMarksNameEachArrival checks the harness's two marks in a -trace (-harness-trace),
// which scripts/tracejoin and scripts/wakejoin join with the connector's: loadtest.received
// names each webhook's event id as the receiver takes it, loadtest.t3_wait each t3_wait answer's
// thread as the agent receives it. A mark renamed or dropped fails here.
func TestTraceMarksNameEachArrival(t *testing.T) {
	r, err := newReceiver()
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()

	// A stand-in MCP server whose t3_wait reports the run settled at once.
	srv := mcp.NewServer(&mcp.Implementation{Name: "stand-in", Version: "1"}, nil)
	type waitIn struct {
		ThreadID string `json:"thread_id"`
		Timeout  int    `json:"timeout"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "t3_wait"}, func(_ context.Context, _ *mcp.CallToolRequest, in waitIn) (*mcp.CallToolResult, map[string]any, error) {
		return nil, map[string]any{"reason": "completed", "state": map[string]any{
			"thread_id": in.ThreadID, "latest_run": map[string]any{"id": "run-traced", "status": "completed"}}}, nil
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	defer hs.Close()
	ctx := context.Background()
	ag, err := newAgents(ctx, hs.URL, 1, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer ag.close()
	h := &harness{agents: ag}

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	var buf bytes.Buffer
	if err := trace.Start(&buf); err != nil {
		t.Skipf("a runtime trace runs already (go test -trace): %v", err)
	}
	status := postHook(t, client, r.url, "evt_traced", hookBody("evt_traced", "thread-hook", "run-hook"))
	w := h.awaitRun(ctx, 0, &run{thread: "thread-waited", id: "run-traced"})
	trace.Stop()
	if status != http.StatusNoContent || w.err != nil {
		t.Fatalf("delivery status %d, wait %+v", status, w)
	}
	for _, want := range []string{"loadtest.received", "evt_traced", "loadtest.t3_wait", "thread-waited"} {
		if !bytes.Contains(buf.Bytes(), []byte(want)) {
			t.Errorf("no %q in the trace", want)
		}
	}
}
