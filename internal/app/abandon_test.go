package app_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// conns records the client's TCP connections so a test can cut them, as a
// network failure or a killed client would.
type conns struct {
	mu   sync.Mutex
	list []net.Conn
}

func (c *conns) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		c.mu.Lock()
		c.list = append(c.list, conn)
		c.mu.Unlock()
	}
	return conn, err
}

func (c *conns) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conn := range c.list {
		_ = conn.Close()
	}
	c.list = nil
}

// rawClient is an MCP client over HTTP whose connections the test can cut.
func rawClient(t *testing.T, h *harness, cs *conns) *mcp.ClientSession {
	t.Helper()
	tr := &http.Transport{DialContext: cs.dial}
	t.Cleanup(tr.CloseIdleConnections)
	mc := mcp.NewClient(&mcp.Implementation{Name: "abandoning-agent", Version: "1"}, nil)
	s, err := mc.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{Transport: tr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// metric reads one gauge from /metrics.
func (h *harness) metric(name string) string {
	h.t.Helper()
	resp, err := http.Get(h.http.URL + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	for _, line := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			return f[1]
		}
	}
	return ""
}

// TestAbandonedWaitsEndAtOnce: a wait whose client gave up — cancelled the
// call (or timed out on its side, which cancels it), closed its session, or
// lost its connection — ends at once and frees its slot: the active-waits
// gauge returns to 0 although every wait asked for an hour (issue 13.4).
func TestAbandonedWaitsEndAtOnce(t *testing.T) {
	leakCheck(t)
	h := newHarness(t, harnessOpts{settings: nil})
	h.waitOnline("mac")
	c := h.client("setup")
	d := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptHang})
	tid := str(d, "thread_id")
	waitArgs := &mcp.CallToolParams{Name: "t3_wait", Arguments: map[string]any{"thread_id": tid, "timeout": 3600}}

	blocked := func(n int) {
		t.Helper()
		eventually(t, 20*time.Second, "the waits to block", func() bool { return h.app.Deps.ActiveWaits() == n }, nil)
		// A blocked wait keeps its thread current from a subscription.
		eventually(t, 20*time.Second, "the wait's thread subscription", func() bool { return h.fake.Stats().ThreadStreams == 1 }, nil)
	}
	freed := func(how string) {
		t.Helper()
		eventually(t, 20*time.Second, how+": the wait slots to be freed", func() bool { return h.app.Deps.ActiveWaits() == 0 }, nil)
		if g := h.metric("t3code_mcp_active_waits"); g != "0" {
			t.Fatalf("%s: t3code_mcp_active_waits is %q", how, g)
		}
		// And its subscription closed, on T3 too.
		eventually(t, 20*time.Second, how+": the thread subscription to close", func() bool {
			return h.fake.Stats().ThreadStreams == 0 && h.app.Fleet.WaitFeeds() == 0
		}, nil)
	}

	t.Run("cancelled", func(t *testing.T) {
		cs := rawClient(t, h, &conns{})
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan error, 1)
		go func() { _, err := cs.CallTool(ctx, waitArgs); ended <- err }()
		blocked(1)
		cancel()
		<-ended
		freed("cancel")
	})
	t.Run("client timeout", func(t *testing.T) {
		cs := rawClient(t, h, &conns{})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ended := make(chan error, 1)
		go func() {
			// The client's own deadline, as an inspector's 60 s: it cancels
			// the request when it passes. Expired here by hand so that the
			// test does not depend on timing.
			dctx, dcancel := context.WithDeadline(ctx, time.Now().Add(time.Hour))
			defer dcancel()
			_, err := cs.CallTool(dctx, waitArgs)
			ended <- err
		}()
		blocked(1)
		cancel()
		<-ended
		freed("client timeout")
	})
	t.Run("session closed", func(t *testing.T) {
		// The session ends (DELETE /mcp with its id, as a client that shuts
		// down sends; go-sdk's own Close waits for its calls first) while
		// its wait is blocked.
		cs := rawClient(t, h, &conns{})
		ended := make(chan error, 1)
		go func() { _, err := cs.CallTool(context.Background(), waitArgs); ended <- err }()
		blocked(1)
		req, _ := http.NewRequest(http.MethodDelete, h.http.URL+"/mcp", nil)
		req.Header.Set("Mcp-Session-Id", cs.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		freed("session closed")
		<-ended
	})
	t.Run("connection dropped", func(t *testing.T) {
		cn := &conns{}
		cs := rawClient(t, h, cn)
		go func() { _, _ = cs.CallTool(context.Background(), waitArgs) }()
		go func() { _, _ = cs.CallTool(context.Background(), waitArgs) }()
		blocked(2)
		cn.cut()
		freed("connection dropped")
	})
	c.ok("t3_interrupt", map[string]any{"thread_id": tid})
}
