package effectrpc

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// safety bounds waits that should finish at once; it is never the thing tested. Generous: under
// the race detector on a starved machine (CI) a 3 MiB frame took more than 10 s (TestBigFrames).
const safety = 60 * time.Second

const fixtureDir = "../../testdata/t3/t3-v2-pr2829"

type fixtureFrame struct {
	Dir  string `json:"dir"`
	Data string `json:"data"`
}

// fixtureFrames returns the recorded frames of one fixture file, in order.
func fixtureFrames(t testing.TB, name string) []fixtureFrame {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtureDir, name))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Frames []fixtureFrame `json:"frames"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f.Frames
}

// allRecvFrames is every frame T3 sent in every recording.
func allRecvFrames(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(fixtureDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures under %s: %v", fixtureDir, err)
	}
	var out []string
	for _, f := range files {
		for _, fr := range fixtureFrames(t, filepath.Base(f)) {
			if fr.Dir == "recv" {
				out = append(out, fr.Data)
			}
		}
	}
	return out
}

// recordedExit returns the recorded Exit frame for requestID in file, with its
// requestId rewritten to newID so a scripted server can replay it verbatim.
func recordedExit(t testing.TB, file, requestID, newID string) string {
	t.Helper()
	old := fmt.Sprintf(`{"_tag":"Exit","requestId":%q,`, requestID)
	for _, fr := range fixtureFrames(t, file) {
		if fr.Dir == "recv" && strings.HasPrefix(fr.Data, old) {
			return fmt.Sprintf(`{"_tag":"Exit","requestId":%q,`, newID) + strings.TrimPrefix(fr.Data, old)
		}
	}
	t.Fatalf("%s: no recorded Exit for request %s", file, requestID)
	return ""
}

// testServer is a small Effect-RPC-speaking WebSocket server on 127.0.0.1. Each
// connection runs script with a peer; Pings are answered (unless noPong) and
// counted, every other client message is handed to the script.
type testServer struct {
	*httptest.Server
	noPong atomic.Bool
	// pongDelay, when set (nanoseconds), delays every Pong by that long (sent
	// from a timer: frames behind the Ping are still read meanwhile).
	pongDelay atomic.Int64
	pongs     atomic.Int64 // Pongs sent
	pings     atomic.Int64
	// pinged receives a value per Ping (non-blocking; capacity 64).
	pinged chan struct{}
}

func newServer(t testing.TB, script func(p *peer)) *testServer {
	t.Helper()
	ts := &testServer{pinged: make(chan struct{}, 64)}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			t.Errorf("accept: %v", err)
			return
		}
		defer func() { _ = ws.CloseNow() }()
		ws.SetReadLimit(-1)
		p := &peer{t: t, ws: ws, srv: ts, in: make(chan received, 1024), closed: make(chan struct{})}
		go p.readLoop()
		script(p)
		// Keep the socket until the client leaves, so frames the script wrote last are read.
		<-p.closed
	}))
	t.Cleanup(ts.Close)
	return ts
}

func (ts *testServer) wsURL() string { return "ws" + strings.TrimPrefix(ts.URL, "http") + "/ws" }

// dial connects a client to ts and closes it at the end of the test (before
// the server closes: cleanups run last-in first-out).
func dial(t *testing.T, ts *testServer, opts Options) *Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	c, err := Dial(ctx, ts.wsURL(), opts)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type received struct {
	msg t3rpc.ClientMessage
	raw string
}

type peer struct {
	t      testing.TB
	ws     *websocket.Conn
	srv    *testServer
	in     chan received
	closed chan struct{}
}

func (p *peer) readLoop() {
	defer close(p.closed)
	for {
		_, data, err := p.ws.Read(context.Background())
		if err != nil {
			return
		}
		var raws []string
		d := jx.DecodeBytes(data)
		if d.Next() == jx.Array {
			_ = d.Arr(func(d *jx.Decoder) error {
				r, err := d.Raw()
				raws = append(raws, string(r))
				return err
			})
		} else {
			raws = []string{string(data)}
		}
		for _, raw := range raws {
			var m t3rpc.ClientMessage
			if err := m.UnmarshalJSON([]byte(raw)); err != nil {
				p.t.Errorf("server: undecodable client message %s: %v", raw, err)
				continue
			}
			if m.IsPing() {
				p.srv.pings.Add(1)
				select {
				case p.srv.pinged <- struct{}{}:
				default:
				}
				switch d := time.Duration(p.srv.pongDelay.Load()); {
				case p.srv.noPong.Load():
				case d > 0:
					time.AfterFunc(d, p.pong)
				default:
					p.pong()
				}
				continue
			}
			p.in <- received{msg: m, raw: raw}
		}
	}
}

// pong answers a Ping, unless the client has gone.
func (p *peer) pong() {
	select {
	case <-p.closed:
		return
	default:
	}
	if p.sendErr(`{"_tag":"Pong"}`) == nil {
		p.srv.pongs.Add(1)
	}
}

// recv returns the next non-Ping client message; false once the client is gone.
func (p *peer) recv() (received, bool) {
	select {
	case r := <-p.in:
		return r, true
	case <-p.closed:
		select {
		case r := <-p.in:
			return r, true
		default:
			return received{}, false
		}
	case <-time.After(safety):
		p.t.Errorf("server: no client message within %v", safety)
		return received{}, false
	}
}

// request returns the next message, which must be a Request.
func (p *peer) request() (t3rpc.Request, bool) {
	r, ok := p.recv()
	if !ok {
		return t3rpc.Request{}, false
	}
	if !r.msg.IsRequest() {
		p.t.Errorf("server: want a Request, got %s", r.raw)
		return t3rpc.Request{}, false
	}
	return r.msg.Request, true
}

func (p *peer) send(frame string) {
	// The client may be gone already in tests about lost sockets.
	_ = p.sendErr(frame)
}

func (p *peer) sendErr(frame string) error {
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	return p.ws.Write(ctx, websocket.MessageText, []byte(frame))
}

// drop kills the TCP connection without a close handshake.
func (p *peer) drop() { _ = p.ws.CloseNow() }

func exitOK(id, value string) string {
	if value == "" {
		return fmt.Sprintf(`{"_tag":"Exit","requestId":%q,"exit":{"_tag":"Success"}}`, id)
	}
	return fmt.Sprintf(`{"_tag":"Exit","requestId":%q,"exit":{"_tag":"Success","value":%s}}`, id, value)
}

func chunk(id string, values ...string) string {
	return fmt.Sprintf(`{"_tag":"Chunk","requestId":%q,"values":[%s]}`, id, strings.Join(values, ","))
}

// tctx is a context for client calls that ends after the safety bound, so a
// broken implementation fails the test instead of hanging it.
func tctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	t.Cleanup(cancel)
	return ctx
}

func waitDone(t *testing.T, c *Conn) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(safety):
		t.Fatal("connection did not close")
	}
}
