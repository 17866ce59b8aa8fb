package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-faster/jx"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ---- MCP clients ----

// agents are MCP client sessions over streamable HTTP (the go-sdk client), one per simulated
// agent, sharing one HTTP transport sized for every concurrent call.
type agents struct {
	sessions []*mcp.ClientSession
	tr       *http.Transport
}

func newAgents(ctx context.Context, base string, n, conns int) (*agents, error) {
	a := &agents{tr: &http.Transport{
		Proxy:               nil,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
	}}
	hc := &http.Client{Transport: a.tr}
	for i := 0; i < n; i++ {
		c := mcp.NewClient(&mcp.Implementation{Name: "t3code-load", Version: "1"}, nil)
		s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc}, nil)
		if err != nil {
			a.close()
			return nil, fmt.Errorf("MCP session %d: %w", i, err)
		}
		a.sessions = append(a.sessions, s)
	}
	return a, nil
}

func (a *agents) close() {
	for _, s := range a.sessions {
		_ = s.Close()
	}
	a.tr.CloseIdleConnections()
}

// call runs a tool on session i and returns its structured content as JSON.
func (a *agents) call(ctx context.Context, i int, tool string, args map[string]any) (json.RawMessage, error) {
	res, err := a.sessions[i%len(a.sessions)].CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", tool, err)
	}
	if res.IsError {
		text := ""
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				text += t.Text
			}
		}
		return nil, fmt.Errorf("%s failed: %s", tool, text)
	}
	return json.Marshal(res.StructuredContent)
}

// waitResult is the part of t3_wait's structured result the harness reads.
type waitResult struct {
	Reason string `json:"reason"`
	State  struct {
		ThreadID  string `json:"thread_id"`
		LatestRun struct {
			ID     string `json:"id"`
			Status string `json:"status"`
		} `json:"latest_run"`
	} `json:"state"`
}

// ---- webhook receiver ----

// delivery is one webhook the receiver accepted.
type delivery struct {
	id, typ, thread, run string
	at                   time.Time
}

// receiver is the local webhook endpoint (T3CODE_MCP_HOOK_URL): it answers 204 at once and keeps
// the arrival time of each event, first delivery only, and the order in which each thread's runs'
// events arrived. While down (the outage phase) it answers 503 to everything, as a receiver
// behind a proxy whose backend is gone does.
type receiver struct {
	srv *http.Server
	ln  net.Listener
	url string

	down    atomic.Bool
	refused atomic.Int64 // deliveries answered 503 while down

	mu       sync.Mutex
	seen     map[string]bool
	byRun    map[string]delivery
	byThread map[string][]string // thread → run ids, in the order their first events arrived
	total    int
	dups     int
	bad      int
}

func newReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{ln: ln, url: "http://" + ln.Addr().String() + "/hook", seen: map[string]bool{}, byRun: map[string]delivery{}, byThread: map[string][]string{}}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	if r.down.Load() {
		r.refused.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	body, err := io.ReadAll(io.LimitReader(req.Body, 1<<20))
	at := time.Now()
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	d := delivery{at: at}
	err = jx.DecodeBytes(body).ObjBytes(func(dec *jx.Decoder, k []byte) error {
		switch string(k) {
		case "id", "type", "thread_id", "run_id":
			v, err := dec.Str()
			switch string(k) {
			case "id":
				d.id = v
			case "type":
				d.typ = v
			case "thread_id":
				d.thread = v
			case "run_id":
				d.run = v
			}
			return err
		}
		return dec.Skip()
	})
	r.mu.Lock()
	switch {
	case err != nil || d.id == "" || d.id != req.Header.Get("webhook-id"):
		r.bad++
	case r.seen[d.id]:
		r.dups++
	default:
		r.seen[d.id] = true
		r.total++
		if d.run != "" {
			if _, ok := r.byRun[d.run]; !ok {
				r.byRun[d.run] = d
				r.byThread[d.thread] = append(r.byThread[d.thread], d.run)
			}
		}
	}
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// count is how many distinct events arrived.
func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total
}

func (r *receiver) forRun(runID string) (delivery, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	d, ok := r.byRun[runID]
	return d, ok
}

// arrivals is the order in which thread's runs' first events arrived.
func (r *receiver) arrivals(thread string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.byThread[thread]...)
}

func (r *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.srv.Shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		_ = r.srv.Close()
	}
}
