package loadtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-faster/jx"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/valyala/fasthttp"
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
		DialContext:         dialRx, // the answers' receive stamps: rxstamp.go
	}}
	hc := &http.Client{Transport: rxTransport{base: a.tr}}
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
	at                   time.Time // the handler took it
	rx                   time.Time // its last bytes reached the receiver's socket, the kernel's stamp (zero: none)
}

// receiver is the local webhook endpoint (T3CODE_MCP_HOOK_URL): it answers 204 at once and keeps
// the arrival time of each event, first delivery only, and the order in which each thread's runs'
// events arrived. While down (the outage phase) it answers 503 to everything, as a receiver
// behind a proxy whose backend is gone does.
//
// It is served by fasthttp, not net/http: at 5,000 deliveries/s net/http's per-request work
// (a Request and its header map, a goroutine's bufio, the response's flush) took about a quarter
// of a core of the two the connector shares with the harness (docs/benchmarks.md, "The
// harness's cost, evening"); fasthttp reuses its request contexts and buffers. What it checks and
// records per delivery is the same.
type receiver struct {
	srv *fasthttp.Server
	ln  net.Listener
	url string

	down    atomic.Bool
	refused atomic.Int64 // deliveries answered 503 while down
	conns   atomic.Int64 // connections accepted

	mu       sync.Mutex
	seen     map[string]bool
	byRun    map[string]delivery
	byThread map[string][]string // thread → run ids, in the order their first events arrived
	total    int
	dups     int
	bad      int
	served   chan struct{} // closed when Serve returns

	// fwd, in the split harness's child (remote.go), takes each delivery, refusal and new
	// connection to the parent instead of this receiver's own bookkeeping.
	fwd *lineWriter
}

// receiverHint is the number of events the receiver's maps are made for: a phase at full scale
// brings 15,000-75,000, and maps grown one delivery at a time cost the receiver ~1 µs more per
// delivery while the maps are new (BenchmarkReceiverRecord), with the collector held off during a
// phase (phasegc.go) the grown-out tables' garbage stays until the next.
const receiverHint = 1 << 16

// reset empties the receiver's maps, made for hint events.
func (r *receiver) reset(hint int) {
	r.seen = make(map[string]bool, hint)
	r.byRun = make(map[string]delivery, hint)
	r.byThread = make(map[string][]string, hint)
}

// maxHookBody bounds a delivery's body; a larger one is counted bad (fasthttp refuses one over
// its own 4 MiB limit before the handler).
const maxHookBody = 1 << 20

func newReceiver() (*receiver, error) { return newForwardingReceiver(nil) }

// newForwardingReceiver is newReceiver with fwd (nil: none) set before it serves.
func newForwardingReceiver(fwd *lineWriter) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ln = rxListener{ln} // each delivery's receive stamp: rxstamp.go
	r := &receiver{ln: ln, url: "http://" + ln.Addr().String() + "/hook", served: make(chan struct{}), fwd: fwd}
	r.reset(receiverHint)
	r.srv = &fasthttp.Server{
		Handler:               r.serve,
		ReadTimeout:           10 * time.Second, // a request's headers and body
		IdleTimeout:           2 * time.Minute,  // a kept-alive connection between requests
		NoDefaultDate:         true,             // no clock goroutine; nothing reads it
		NoDefaultServerHeader: true,
		NoDefaultContentType:  true,
		CloseOnShutdown:       true,
		Logger:                discardLogger{}, // a connection's read errors: the connector counts its own failures
		ConnState: func(_ net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateNew {
				r.conns.Add(1)
				if r.fwd != nil {
					r.fwd.send("C")
				}
			}
		},
	}
	go func() {
		defer close(r.served)
		_ = r.srv.Serve(ln)
	}()
	return r, nil
}

// serve takes one delivery; fasthttp calls it with the whole body read, so at is when the
// webhook was received (as before: after its body).
func (r *receiver) serve(ctx *fasthttp.RequestCtx) {
	if r.down.Load() {
		r.refused.Add(1)
		if r.fwd != nil {
			r.fwd.send("X")
		}
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		return
	}
	at := time.Now()
	if trace.IsEnabled() {
		// The event's arrival in a -trace, joined with the connector's marks (outbox/tracemarks.go).
		trace.Log(context.Background(), "loadtest.received", string(ctx.Request.Header.Peek("webhook-id")))
	}
	body := ctx.PostBody()
	var d delivery
	err := errBodyTooLarge
	if len(body) <= maxHookBody {
		d, err = decodeDelivery(body)
	}
	// The request was read whole before this handler, and a client of HTTP/1.1 sends no other
	// request on the connection before its answer: the connection's newest stamp is the
	// delivery's last bytes'.
	d.at, d.rx = at, rxTime(ctx.Conn())
	if r.fwd != nil {
		r.fwd.delivery(d, badDelivery(d, err, ctx.Request.Header.Peek("webhook-id")))
	} else {
		r.record(d, err, ctx.Request.Header.Peek("webhook-id"))
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

var errBodyTooLarge = errors.New("webhook body too large")

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}

// decodeDelivery reads the fields the harness joins on from a webhook body.
func decodeDelivery(body []byte) (delivery, error) {
	var d delivery
	dec := jx.GetDecoder()
	defer jx.PutDecoder(dec)
	dec.ResetBytes(body)
	err := dec.ObjBytes(func(dec *jx.Decoder, k []byte) error {
		var dst *string
		switch string(k) {
		case "id":
			dst = &d.id
		case "type":
			dst = &d.typ
		case "thread_id":
			dst = &d.thread
		case "run_id":
			dst = &d.run
		default:
			return dec.Skip()
		}
		v, err := dec.Str()
		*dst = v
		return err
	})
	return d, err
}

// record counts a delivery: bad (undecodable, no id, or an id the webhook-id header does not
// repeat), a duplicate of an event already received, or a new event, whose run's first event
// is kept with its arrival time and its place in the thread's order.
// badDelivery reports whether a delivery counts as bad: its body did not decode (err), had no
// id, or its webhook-id header did not repeat the id.
func badDelivery(d delivery, err error, webhookID []byte) bool {
	return err != nil || d.id == "" || d.id != string(webhookID)
}

func (r *receiver) record(d delivery, err error, webhookID []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case badDelivery(d, err, webhookID):
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
}

// stats is what the receiver has taken so far.
func (r *receiver) stats() Receiver {
	r.mu.Lock()
	defer r.mu.Unlock()
	return Receiver{Distinct: r.total, Duplicates: r.dups, Bad: r.bad, Refused: r.refused.Load(), Connections: r.conns.Load()}
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
	if r.srv == nil { // the split harness's mirror: the child serves
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.srv.ShutdownWithContext(ctx) // closes the listener, then the idle connections
	if ctx.Err() != nil {
		_ = r.ln.Close()
	}
	<-r.served
}
