package effectrpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// The first request of the recorded basic run, byte for byte: ids are decimal
// strings, headers is [], a nil payload is {}.
func TestRequestFrameMatchesRecording(t *testing.T) {
	want := fixtureFrames(t, "05-ws-basic-run.json")[1]
	if want.Dir != "send" || !strings.Contains(want.Data, "server.getConfig") {
		t.Fatalf("fixture changed: %+v", want)
	}
	got := make(chan string, 1)
	ts := newServer(t, func(p *peer) {
		r, ok := p.recv()
		if !ok {
			return
		}
		got <- r.raw
		p.send(exitOK(idKey(r.msg.Request.ID), `{}`))
	})
	c := dial(t, ts, Options{})
	if err := c.Call(tctx(t), "server.getConfig", nil, nil); err != nil {
		t.Fatal(err)
	}
	if raw := <-got; raw != want.Data {
		t.Fatalf("request frame\n got %s\nwant %s", raw, want.Data)
	}
}

// Concurrent calls share the socket; replies come back out of order, one of
// them with a numeric requestId, and each reaches its own caller.
func TestCallMultiplexedOutOfOrder(t *testing.T) {
	const n = 3
	ts := newServer(t, func(p *peer) {
		var reqs []t3rpc.Request
		for range n {
			r, ok := p.request()
			if !ok {
				return
			}
			if !r.ID.IsString() {
				t.Errorf("request id %v is not a string", r.ID)
			}
			reqs = append(reqs, r)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			r := reqs[i]
			var in struct{ N int }
			if err := json.Unmarshal(r.Payload, &in); err != nil {
				t.Errorf("payload %s: %v", r.Payload, err)
			}
			value := fmt.Sprintf(`{"sequence":%d}`, 100+in.N)
			if i == 1 {
				// T3 echoes ids verbatim; a numeric echo must still match.
				num, _ := strconv.Atoi(r.ID.String)
				p.send(fmt.Sprintf(`{"_tag":"Exit","requestId":%d,"exit":{"_tag":"Success","value":%s}}`, num, value))
				continue
			}
			p.send(exitOK(r.ID.String, value))
		}
	})
	c := dial(t, ts, Options{})

	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var res t3rpc.DispatchResult
			err := c.Call(tctx(t), "orchestration.dispatchCommand", json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)), &res)
			if err != nil {
				t.Errorf("call %d: %v", i, err)
				return
			}
			if res.Sequence != int64(100+i) {
				t.Errorf("call %d got sequence %d", i, res.Sequence)
			}
		}()
	}
	wg.Wait()
}

// A frame may carry an array of messages: chunks and exits of different
// requests together.
func TestArrayFrames(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		ids := map[string]string{}
		for range 3 {
			r, ok := p.request()
			if !ok {
				return
			}
			ids[r.Method] = r.ID.String
		}
		s, a, b := ids["test.stream"], ids["test.a"], ids["test.b"]
		bNum, _ := strconv.Atoi(b)
		p.send("[" + chunk(s, `1`, `2`) + "," + exitOK(a, `"a"`) + "," +
			fmt.Sprintf(`{"_tag":"Exit","requestId":%d,"exit":{"_tag":"Success","value":"b"}}`, bNum) + "]")
		r, ok := p.recv()
		if !ok {
			return
		}
		if !r.msg.IsAck() || idKey(r.msg.Ack.RequestId) != s {
			t.Errorf("want Ack %s, got %s", s, r.raw)
		}
		p.send(" [" + chunk(s, `3`) + "," + exitOK(s, "null") + "] ")
	})
	c := dial(t, ts, Options{})

	var got []string
	streamErr := make(chan error, 1)
	go func() {
		streamErr <- c.Stream(tctx(t), "test.stream", nil, func(values []jx.Raw) error {
			for _, v := range values {
				got = append(got, string(v))
			}
			return nil
		})
	}()
	var wg sync.WaitGroup
	for _, m := range []string{"test.a", "test.b"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s string
			var raw json.RawMessage
			if err := c.Call(tctx(t), m, nil, &raw); err != nil {
				t.Errorf("%s: %v", m, err)
				return
			}
			if err := json.Unmarshal(raw, &s); err != nil || "test."+s != m {
				t.Errorf("%s got %s", m, raw)
			}
		}()
	}
	wg.Wait()
	if err := <-streamErr; err != nil {
		t.Fatalf("stream: %v", err)
	}
	if strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("chunks %v", got)
	}
}

// The Ack for a chunk goes out only after the handler returned. The handler
// makes a unary call of its own; on the wire that Request must come before
// the Ack, which an implementation acking on receipt would get wrong.
func TestAckAfterHandler(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		s, ok := p.request()
		if !ok {
			return
		}
		for i := 1; i <= 3; i++ {
			p.send(chunk(s.ID.String, strconv.Itoa(i)))
			r, ok := p.recv()
			if !ok {
				return
			}
			if !r.msg.IsRequest() || r.msg.Request.Method != "test.probe" {
				t.Errorf("chunk %d: want the handler's probe before any Ack, got %s", i, r.raw)
				return
			}
			p.send(exitOK(idKey(r.msg.Request.ID), "{}"))
			r, ok = p.recv()
			if !ok {
				return
			}
			if !r.msg.IsAck() || idKey(r.msg.Ack.RequestId) != s.ID.String {
				t.Errorf("chunk %d: want Ack, got %s", i, r.raw)
				return
			}
		}
		p.send(exitOK(s.ID.String, ""))
	})
	c := dial(t, ts, Options{})
	n := 0
	err := c.Stream(tctx(t), "test.stream", nil, func(values []jx.Raw) error {
		n++
		if string(values[0]) != strconv.Itoa(n) {
			t.Errorf("chunk %d has %s", n, values[0])
		}
		return c.Call(tctx(t), "test.probe", nil, nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 {
		t.Fatalf("handler ran %d times", n)
	}
}

// While one stream's handler is stuck, another stream and a unary call still
// get their messages.
func TestSlowHandlerBlocksNothingElse(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		ids := map[string]string{}
		exited := 0
		for exited < 2 {
			r, ok := p.recv()
			if !ok {
				return
			}
			switch {
			case r.msg.IsRequest():
				id := r.msg.Request.ID.String
				ids[id] = r.msg.Request.Method
				switch r.msg.Request.Method {
				case "test.slow", "test.fast":
					p.send(chunk(id, `"`+r.msg.Request.Method+`"`))
				case "test.unary":
					p.send(exitOK(id, `{}`))
				}
			case r.msg.IsAck():
				p.send(exitOK(idKey(r.msg.Ack.RequestId), ""))
				exited++
			}
		}
	})
	c := dial(t, ts, Options{})

	release := make(chan struct{})
	slowEntered := make(chan struct{})
	fastGot := make(chan struct{})
	errs := make(chan error, 2)
	go func() {
		errs <- c.Stream(tctx(t), "test.slow", nil, func([]jx.Raw) error {
			close(slowEntered)
			<-release
			return nil
		})
	}()
	<-slowEntered
	go func() {
		errs <- c.Stream(tctx(t), "test.fast", nil, func([]jx.Raw) error {
			close(fastGot)
			return nil
		})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	defer cancel()
	if err := c.Call(ctx, "test.unary", nil, nil); err != nil {
		t.Fatalf("unary call while a handler is stuck: %v", err)
	}
	select {
	case <-fastGot:
	case <-time.After(safety):
		t.Fatal("the other stream got nothing while a handler was stuck")
	}
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func TestPingPongKeepsSocket(t *testing.T) {
	ts := newServer(t, func(p *peer) { p.recv() })
	c := dial(t, ts, Options{PingInterval: 100 * time.Millisecond, PongTimeout: safety})
	for range 3 {
		select {
		case <-ts.pinged:
		case <-time.After(safety):
			t.Fatal("no Ping")
		}
	}
	// Pongs came back, so the socket is alive. (PongTimeout is generous: a
	// loaded machine may answer late; TestLatePongKeepsSocket is about that.)
	if err := c.Err(); err != nil {
		t.Fatalf("socket closed although T3 answered every Ping: %v", err)
	}
}

// A Pong that comes after the next Ping would have been due (T3 on a starved
// machine) keeps the socket: it is dead only when no Pong came within
// PongTimeout of a Ping.
func TestLatePongKeepsSocket(t *testing.T) {
	ts := newServer(t, func(p *peer) { p.recv() })
	const interval = 40 * time.Millisecond
	ts.pongDelay.Store(int64(interval * 3 / 2)) // every Pong later than the next tick
	c := dial(t, ts, Options{PingInterval: interval, PongTimeout: safety})
	for ts.pongs.Load() < 4 {
		select {
		case <-ts.pinged:
		case <-c.Done():
			t.Fatalf("socket closed although every Pong came, late: %v", c.Err())
		case <-time.After(safety):
			t.Fatal("no Ping")
		}
	}
	if err := c.Err(); err != nil {
		t.Fatalf("socket closed although every Pong came, late: %v", err)
	}
	if p, g := ts.pings.Load(), ts.pongs.Load(); p > g+1 {
		t.Fatalf("%d Pings for %d Pongs: a Ping went out while one was unanswered", p, g)
	}
}

func TestPongTimeoutDefault(t *testing.T) {
	if got := (Options{PingInterval: 3 * time.Second}).withDefaults().PongTimeout; got != 6*time.Second {
		t.Fatalf("PongTimeout = %v, want two intervals", got)
	}
	if got := (Options{}).withDefaults().PongTimeout; got != 2*DefaultPingInterval {
		t.Fatalf("PongTimeout = %v, want two intervals", got)
	}
}

func TestNoPongKillsSocket(t *testing.T) {
	ts := newServer(t, func(p *peer) { p.recv() })
	ts.noPong.Store(true)
	c := dial(t, ts, Options{PingInterval: 20 * time.Millisecond})
	callErr := make(chan error, 1)
	go func() { callErr <- c.Call(tctx(t), "test.hang", nil, nil) }()
	waitDone(t, c)
	if err := c.Err(); !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "no Pong") {
		t.Fatalf("Err() = %v", err)
	}
	if err := <-callErr; !errors.Is(err, ErrClosed) {
		t.Fatalf("in-flight call: %v", err)
	}
	if err := c.Call(tctx(t), "test.after", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after death: %v", err)
	}
}

// Cancelling a stream's context sends the Interrupt frame T3's client sends.
func TestStreamCancelSendsInterrupt(t *testing.T) {
	interrupt := make(chan string, 1)
	ts := newServer(t, func(p *peer) {
		s, ok := p.request()
		if !ok {
			return
		}
		p.send(chunk(s.ID.String, `{"kind":"synchronized"}`))
		for {
			r, ok := p.recv()
			if !ok {
				return
			}
			if r.msg.IsInterrupt() {
				interrupt <- r.raw
				p.send(recordedExit(t, "05-ws-basic-run.json", "14", s.ID.String))
				return
			}
		}
	})
	c := dial(t, ts, Options{})
	ctx, cancel := context.WithCancel(tctx(t))
	err := c.Stream(ctx, "orchestration.subscribeShell", nil, func([]jx.Raw) error {
		cancel()
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stream = %v, want context.Canceled", err)
	}
	if got := <-interrupt; got != `{"_tag":"Interrupt","requestId":"0","interruptors":[]}` {
		t.Fatalf("interrupt frame %s", got)
	}
}

// Cancelling a unary call interrupts it; the late Exit is ignored and the
// socket stays usable.
func TestCallCancelSendsInterrupt(t *testing.T) {
	gotReq := make(chan struct{})
	ts := newServer(t, func(p *peer) {
		r, ok := p.request()
		if !ok {
			return
		}
		close(gotReq)
		m, ok := p.recv()
		if !ok {
			return
		}
		if !m.msg.IsInterrupt() || idKey(m.msg.Interrupt.RequestId) != r.ID.String {
			t.Errorf("want Interrupt for %s, got %s", r.ID.String, m.raw)
		}
		p.send(exitOK(r.ID.String, `{"late":true}`))
		r2, ok := p.request()
		if !ok {
			return
		}
		p.send(exitOK(r2.ID.String, `{"sequence":7}`))
	})
	c := dial(t, ts, Options{})
	ctx, cancel := context.WithCancel(tctx(t))
	go func() { <-gotReq; cancel() }()
	if err := c.Call(ctx, "test.slow", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Call = %v", err)
	}
	var res t3rpc.DispatchResult
	if err := c.Call(tctx(t), "test.next", nil, &res); err != nil || res.Sequence != 7 {
		t.Fatalf("next call: %v %+v", err, res)
	}
}

// A failed handler ends the stream with its error and interrupts the request; so does an
// error from StreamAheadOnRead's onRead, which never hands the chunk to the handler then, and
// one from the rest of a StreamInline handler; none is acknowledged.
func TestHandlerErrorInterrupts(t *testing.T) {
	boom := errors.New("sink failed")
	for name, stream := range map[string]func(c *Conn) error{
		"handler": func(c *Conn) error {
			return c.Stream(tctx(t), "test.stream", nil, func([]jx.Raw) error { return boom })
		},
		"onRead": func(c *Conn) error {
			return c.StreamAheadOnRead(tctx(t), "test.stream", nil, 2,
				func([]jx.Raw) (bool, error) { return false, boom },
				func([]jx.Raw) error { t.Error("the handler got a chunk onRead failed on"); return nil })
		},
		"inline rest": func(c *Conn) error {
			return c.StreamInline(tctx(t), "test.stream", nil, func(Chunk) func() error {
				return func() error { return boom }
			})
		},
	} {
		t.Run(name, func(t *testing.T) {
			ts := newServer(t, func(p *peer) {
				s, ok := p.request()
				if !ok {
					return
				}
				p.send(chunk(s.ID.String, `1`))
				r, ok := p.recv()
				if !ok {
					return
				}
				if !r.msg.IsInterrupt() {
					t.Errorf("want Interrupt after a failed %s, got %s", name, r.raw)
				}
			})
			if err := stream(dial(t, ts, Options{})); err != boom {
				t.Fatalf("stream = %v, want %v", err, boom)
			}
		})
	}
}

// Exit causes from real recordings map to *Error.
func TestExitCauses(t *testing.T) {
	cases := []struct {
		name, file, id string
		want           Error
	}{
		{"dispatch rejected", "05-ws-basic-run.json", "11", Error{
			Kind: KindFail, Tag: "OrchestrationV2DispatchCommandError",
			Message:     "Run run-does-not-exist is not interruptible.",
			CommandID:   "cmd-827cb858-fd40-438f-912b-70e81bd44a38",
			CommandType: "run.interrupt",
			Detail:      "Run run-does-not-exist is not interruptible.",
		}},
		{"missing scope", "09-ws-missing-scope.json", "1", Error{
			Kind: KindFail, Tag: "EnvironmentAuthorizationError",
			Message:       "The authenticated token is missing required scope: orchestration:operate.",
			RequiredScope: "orchestration:operate",
		}},
		{"payload decode defect", "05-ws-basic-run.json", "7", Error{
			Kind: KindDie, Message: "Missing key\n  at [\"createdBy\"]",
		}},
		{"unknown method", "05-ws-basic-run.json", "12", Error{
			Kind: KindDie, Message: "Unknown request tag: orchestration.doesNotExist",
		}},
		{"interrupted", "05-ws-basic-run.json", "14", Error{Kind: KindInterrupt}},
	}
	ts := newServer(t, func(p *peer) {
		for _, tc := range cases {
			r, ok := p.request()
			if !ok {
				return
			}
			p.send(recordedExit(t, tc.file, tc.id, r.ID.String))
		}
	})
	c := dial(t, ts, Options{})
	for _, tc := range cases {
		err := c.Call(tctx(t), "orchestration.dispatchCommand", nil, nil)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("%s: %v is not *Error", tc.name, err)
		}
		want := tc.want
		want.Method = "orchestration.dispatchCommand"
		if *e != want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, *e, want)
		}
		if want.Message != "" && !strings.Contains(e.Error(), want.Message) {
			t.Errorf("%s: Error() %q lacks T3's message", tc.name, e.Error())
		}
	}
}

// Recorded success values decode into generated types.
func TestRecordedSuccessValues(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		r, ok := p.request()
		if !ok {
			return
		}
		p.send(recordedExit(t, "05-ws-basic-run.json", "0", r.ID.String))
		r, ok = p.request()
		if !ok {
			return
		}
		p.send(recordedExit(t, "05-ws-basic-run.json", "2", r.ID.String))
	})
	c := dial(t, ts, Options{})
	var cfg t3rpc.ServerConfig
	if err := c.Call(tctx(t), "server.getConfig", nil, &cfg); err != nil {
		t.Fatal(err)
	}
	if env, ok := cfg.Environment.Get(); !ok || env.ServerVersion != "0.0.31" || len(cfg.Providers) == 0 {
		t.Fatalf("config %+v", cfg)
	}
	var res t3rpc.DispatchResult
	if err := c.Call(tctx(t), "orchestration.dispatchCommand", nil, &res); err != nil || res.Sequence != 2 {
		t.Fatalf("dispatch: %v %+v", err, res)
	}
}

func TestBigFrames(t *testing.T) {
	big := `"` + strings.Repeat("x", 3<<20) + `"`
	ts := newServer(t, func(p *peer) {
		r, ok := p.request()
		if !ok {
			return
		}
		p.send(exitOK(r.ID.String, big))
		s, ok := p.request()
		if !ok {
			return
		}
		p.send(chunk(s.ID.String, big, `1`))
		if m, ok := p.recv(); ok && m.msg.IsAck() {
			p.send(exitOK(s.ID.String, ""))
		}
	})
	c := dial(t, ts, Options{})
	var raw json.RawMessage
	if err := c.Call(tctx(t), "test.big", nil, &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) != len(big) {
		t.Fatalf("value of %d bytes, want %d", len(raw), len(big))
	}
	var sizes []int
	err := c.Stream(tctx(t), "test.bigstream", nil, func(values []jx.Raw) error {
		for _, v := range values {
			sizes = append(sizes, len(v))
		}
		return nil
	})
	if err != nil || len(sizes) != 2 || sizes[0] != len(big) {
		t.Fatalf("stream: %v %v", err, sizes)
	}
}

func TestReadLimit(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		r, ok := p.request()
		if !ok {
			return
		}
		p.send(exitOK(r.ID.String, `"`+strings.Repeat("y", 4096)+`"`))
	})
	c := dial(t, ts, Options{ReadLimit: 1024})
	err := c.Call(tctx(t), "test.big", nil, nil)
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "read limit") {
		t.Fatalf("Call = %v", err)
	}
}

func TestDefectIsFatal(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		if _, ok := p.request(); !ok {
			return
		}
		p.send(`{"_tag":"Defect","defect":{"message":"Invalid request id"}}`)
	})
	c := dial(t, ts, Options{})
	err := c.Call(tctx(t), "test.any", nil, nil)
	var e *Error
	if !errors.Is(err, ErrClosed) || !errors.As(err, &e) || e.Kind != KindDefect || e.Message != "Invalid request id" {
		t.Fatalf("Call = %v", err)
	}
	waitDone(t, c)
	if !errors.Is(c.Err(), ErrClosed) {
		t.Fatalf("Err() = %v", c.Err())
	}
}

// ClientProtocolError fails what is in flight; the socket stays.
func TestClientProtocolError(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		for range 2 {
			if _, ok := p.request(); !ok {
				return
			}
		}
		p.send(`{"_tag":"ClientProtocolError","error":{"_tag":"RpcClientError","reason":"Protocol","message":"bad frame"}}`)
		r, ok := p.request()
		if !ok {
			return
		}
		p.send(exitOK(r.ID.String, `{}`))
	})
	c := dial(t, ts, Options{})
	var wg sync.WaitGroup
	var failed atomic.Int32
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Stream(tctx(t), "test.stream", nil, func([]jx.Raw) error { return nil })
			var e *Error
			if errors.As(err, &e) && e.Kind == KindProtocol && e.Message == "bad frame" {
				failed.Add(1)
			} else {
				t.Errorf("Stream = %v", err)
			}
		}()
	}
	wg.Wait()
	if failed.Load() != 2 {
		t.Fatal("in-flight requests not failed")
	}
	if err := c.Call(tctx(t), "test.after", nil, nil); err != nil {
		t.Fatalf("socket unusable after ClientProtocolError: %v", err)
	}
}

// An Exit this client cannot decode still ends its request.
func TestUndecodableExitFailsRequest(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		r, ok := p.request()
		if !ok {
			return
		}
		p.send(fmt.Sprintf(`{"_tag":"Exit","requestId":%q,"exit":{"_tag":"Sideways"}}`, r.ID.String))
	})
	c := dial(t, ts, Options{})
	var e *Error
	if err := c.Call(tctx(t), "test.x", nil, nil); !errors.As(err, &e) || e.Kind != KindProtocol {
		t.Fatalf("Call = %v", err)
	}
}

func TestSocketLostMidStream(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		s, ok := p.request()
		if !ok {
			return
		}
		p.send(chunk(s.ID.String, `1`))
		if _, ok := p.recv(); ok {
			p.drop()
		}
	})
	c := dial(t, ts, Options{})
	n := 0
	err := c.Stream(tctx(t), "test.stream", nil, func([]jx.Raw) error { n++; return nil })
	if !errors.Is(err, ErrClosed) || n != 1 {
		t.Fatalf("Stream = %v after %d chunks", err, n)
	}
}

func TestCloseUnblocksWaiters(t *testing.T) {
	gotReq := make(chan struct{})
	ts := newServer(t, func(p *peer) {
		if _, ok := p.request(); ok {
			close(gotReq)
		}
		p.recv()
	})
	c := dial(t, ts, Options{})
	errc := make(chan error, 1)
	go func() { errc <- c.Call(tctx(t), "test.hang", nil, nil) }()
	<-gotReq
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != ErrClosed {
		t.Fatalf("Call = %v", err)
	}
	if c.Err() != ErrClosed {
		t.Fatalf("Err() = %v", c.Err())
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// Generated types work as payload by value or pointer; raw JSON passes through.
func TestPayloadForms(t *testing.T) {
	cmd := t3rpc.RunInterruptCommand{
		Type: t3rpc.RunInterruptCommandTypeRunInterrupt, CommandId: "cmd-1", ThreadId: "thread-1",
		RunId: "run:thread:thread-1:ordinal:1", Reason: t3rpc.NewOptString("stop"),
	}
	want := `{"type":"run.interrupt","commandId":"cmd-1","threadId":"thread-1","runId":"run:thread:thread-1:ordinal:1","reason":"stop"}`
	payloads := []any{cmd, &cmd, json.RawMessage(want)}
	ts := newServer(t, func(p *peer) {
		for range payloads {
			r, ok := p.request()
			if !ok {
				return
			}
			if string(r.Payload) != want {
				t.Errorf("payload %s", r.Payload)
			}
			p.send(exitOK(r.ID.String, `{}`))
		}
	})
	c := dial(t, ts, Options{})
	for _, pl := range payloads {
		if err := c.Call(tctx(t), "test.cmd", pl, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Call(tctx(t), "test.bad", json.RawMessage(`{"x":`), nil); err == nil {
		t.Fatal("invalid raw JSON accepted")
	}
}

func TestUpgradeErrors(t *testing.T) {
	cases := []struct {
		status int
		body   string
		want   string
	}{
		{401, `{"_tag":"EnvironmentAuthInvalidError","code":"auth_invalid","reason":"invalid_credential","traceId":"bdf32a94b103d00c5a8a053f253336a0"}`, "invalid_credential"},
		{426, `{"code":"orchestration_protocol_incompatible","message":"Update this client to one that supports orchestration protocol 2.","orchestrationProtocolVersion":2}`, "Update this client"},
		{503, "No static directory configured and no dev URL set.", "HTTP 503"},
	}
	for _, tc := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		_, err := Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws?wsTicket=SECRET-TICKET&orchestrationProtocol=2", Options{})
		srv.Close()
		var ue *UpgradeError
		if !errors.As(err, &ue) || ue.Status != tc.status || string(ue.Body) != tc.body {
			t.Fatalf("%d: %v", tc.status, err)
		}
		if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "SECRET-TICKET") {
			t.Errorf("%d: message %q", tc.status, err.Error())
		}
	}
}

// The wsTicket in the URL is a credential: a dial error must not print it.
func TestDialErrorHidesTicket(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, err = Dial(context.Background(), "ws://"+addr+"/ws?wsTicket=SECRET-TICKET&orchestrationProtocol=2", Options{})
	if err == nil {
		t.Fatal("dial to a closed port succeeded")
	}
	if strings.Contains(err.Error(), "SECRET-TICKET") {
		t.Fatalf("ticket leaked: %v", err)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Fatalf("message lacks the address: %v", err)
	}
}

// Every frame T3 sent in the recordings decodes, with nothing undecodable.
func TestDecodeRecordedFrames(t *testing.T) {
	frames := allRecvFrames(t)
	if len(frames) < 100 {
		t.Fatalf("only %d recorded frames", len(frames))
	}
	for _, f := range frames {
		msgs, err := decodeFrame([]byte(f))
		if err != nil || len(msgs) != 1 || msgs[0].err != nil {
			t.Fatalf("frame %.200s: %v %+v", f, err, msgs)
		}
	}
}

// StreamChunks lends a chunk's values (slices of the frame's buffer) until its handler returns,
// and the frame is not reused before then, even when the read loop has read later frames
// meanwhile; Stream's values are the handler's to keep. Each frame carries a chunk of each
// stream, all frames the same length (a reused buffer would overwrite a lent value in place): the
// lent handler holds chunk i until the keeping handler has seen chunk i+1 (the read loop is past
// frame i), then checks its values; the keeping handler keeps every value it got and they are
// checked at the end, after every frame was read.
func TestLentChunkValuesOutliveLaterFrames(t *testing.T) {
	const frames = 20
	lentValue := func(i int) string { return fmt.Sprintf(`"lent-%04d"`, i) }
	keptValue := func(i int) string { return fmt.Sprintf(`"kept-%04d"`, i) }
	ts := newServer(t, func(p *peer) {
		ids := map[string]string{}
		for range 2 {
			r, ok := p.request()
			if !ok {
				return
			}
			ids[r.Method] = r.ID.String
		}
		for i := range frames {
			p.send("[" + chunk(ids["test.lent"], lentValue(i)) + "," + chunk(ids["test.kept"], keptValue(i)) + "]")
		}
		for range 2 * frames { // the Acks
			if _, ok := p.recv(); !ok {
				return
			}
		}
		p.send("[" + exitOK(ids["test.lent"], "") + "," + exitOK(ids["test.kept"], "") + "]")
	})
	c := dial(t, ts, Options{})

	keptSeen := make(chan int, frames)
	var kept []jx.Raw
	keptErr := make(chan error, 1)
	go func() {
		keptErr <- c.Stream(tctx(t), "test.kept", nil, func(values []jx.Raw) error {
			kept = append(kept, values...) // no copy: Stream's values are the handler's
			keptSeen <- len(kept)
			return nil
		})
	}()
	n := 0
	err := c.StreamChunks(tctx(t), "test.lent", nil, func(ch Chunk) error {
		want := lentValue(n)
		if n+1 < frames {
			// Until the read loop has dispatched frame n+1.
			for seen := 0; seen < n+2; {
				select {
				case seen = <-keptSeen:
				case <-time.After(safety):
					return fmt.Errorf("chunk %d of the other stream never came", n+1)
				}
			}
		}
		if len(ch.Values) != 1 || string(ch.Values[0]) != want {
			return fmt.Errorf("lent chunk %d reads %q after later frames, want %s", n, ch.Values, want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-keptErr; err != nil {
		t.Fatal(err)
	}
	if n != frames || len(kept) != frames {
		t.Fatalf("%d lent chunks, %d kept values; want %d each", n, len(kept), frames)
	}
	for i, v := range kept {
		if string(v) != keptValue(i) {
			t.Fatalf("kept value %d reads %s once later frames were read, want %s", i, v, keptValue(i))
		}
	}
}

// expectStreamAck reads the peer's next message and reports whether it is the Ack of stream id
// (what names the moment in the failure).
func expectStreamAck(t *testing.T, p *peer, id, what string) bool {
	t.Helper()
	r, ok := p.recv()
	if !ok {
		return false
	}
	if !r.msg.IsAck() || idKey(r.msg.Ack.RequestId) != id {
		t.Errorf("%s: want the stream's Ack, got %s", what, r.raw)
		return false
	}
	return true
}

// StreamAhead acknowledges a Chunk as the read loop queues it, while the handler is still busy
// with an earlier one, up to ahead Chunks waiting; the Ack of one beyond that waits until the
// handler has taken one. The handler sees every Chunk in order.
func TestStreamAheadAcksOnReceiptUpToItsBound(t *testing.T) {
	sent3 := make(chan struct{})
	ts := newServer(t, func(p *peer) {
		var once sync.Once
		defer once.Do(func() { close(sent3) }) // a script that failed early lets the test go on
		s, ok := p.request()
		if !ok {
			return
		}
		id := s.ID.String
		expectAck := func(what string) bool { return expectStreamAck(t, p, id, what) }
		// Chunk 1 is in the handler, which does not return: its Ack comes all the same.
		p.send(chunk(id, "1"))
		if !expectAck("chunk 1, handler busy with it") {
			return
		}
		// Chunk 2 waits alone: acknowledged too.
		p.send(chunk(id, "2"))
		if !expectAck("chunk 2, one waiting") {
			return
		}
		// Chunk 3 would be the second waiting: no Ack yet.
		p.send(chunk(id, "3"))
		once.Do(func() { close(sent3) })
		// Two probes: the first one's Exit follows chunk 3 on the socket, so when the client
		// sends the second, its read loop has queued chunk 3; an Ack for it would come first.
		for _, want := range []string{"test.probe1", "test.probe2"} {
			r, ok := p.recv()
			if !ok {
				return
			}
			if !r.msg.IsRequest() || r.msg.Request.Method != want {
				t.Errorf("with two chunks waiting: want the %s Request, got %s", want, r.raw)
				return
			}
			p.send(exitOK(idKey(r.msg.Request.ID), "{}"))
		}
		// The handler is released: chunk 2 taken, chunk 3's owed Ack goes out.
		if !expectAck("chunk 3, after the handler took chunk 2") {
			return
		}
		p.send(exitOK(id, ""))
	})
	c := dial(t, ts, Options{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- c.StreamAhead(tctx(t), "test.stream", nil, 1, func(values []jx.Raw) error {
			got = append(got, string(values[0]))
			<-release
			return nil
		})
	}()
	<-sent3
	for _, probe := range []string{"test.probe1", "test.probe2"} {
		if err := c.Call(tctx(t), probe, nil, nil); err != nil {
			t.Fatalf("%s: %v", probe, err)
		}
	}
	releaseOnce.Do(func() { close(release) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("handler saw %v, want 1,2,3", got)
	}
}

// The owed Ack of an ahead stream goes out when the handler takes a Chunk, not when it is done
// with it: with the handler busy on chunk 1 and chunks 2 and 3 waiting (3's Ack owed), chunk 1's
// handler returning and chunk 2's starting pays chunk 3's Ack while chunk 2's handler still runs.
// It was paid only after a handler returned, so a handler that waited for T3's next Chunk (here:
// chunk 2's, which is released only once the server saw that Ack) waited for ever; under load
// TestStreamAheadAcksOnReceiptUpToItsBound met it when chunk 2 came before the handler had taken
// chunk 1.
func TestStreamAheadPaysTheOwedAckWhenTheHandlerTakesAChunk(t *testing.T) {
	sent3, acked3 := make(chan struct{}), make(chan struct{})
	ts := newServer(t, func(p *peer) {
		var once3, onceAck sync.Once
		defer once3.Do(func() { close(sent3) }) // a script that failed early lets the test go on
		defer onceAck.Do(func() { close(acked3) })
		s, ok := p.request()
		if !ok {
			return
		}
		id := s.ID.String
		for _, c := range []string{"1", "2"} {
			p.send(chunk(id, c))
			if !expectStreamAck(t, p, id, "chunk "+c) {
				return
			}
		}
		p.send(chunk(id, "3")) // the handler has chunk 1, chunk 2 waits: 3's Ack is owed
		once3.Do(func() { close(sent3) })
		// The probe's Exit follows chunk 3 on the socket: when the client has it, chunk 3 is
		// queued (the test releases chunk 1 only then).
		r, ok := p.recv()
		if !ok {
			return
		}
		if !r.msg.IsRequest() || r.msg.Request.Method != "test.probe" {
			t.Errorf("with two chunks waiting: want the test.probe Request, got %s", r.raw)
			return
		}
		p.send(exitOK(idKey(r.msg.Request.ID), "{}"))
		if !expectStreamAck(t, p, id, "chunk 3, once the handler took chunk 2") {
			return
		}
		onceAck.Do(func() { close(acked3) })
		p.send(exitOK(id, ""))
	})
	c := dial(t, ts, Options{})
	release := map[string]chan struct{}{"1": make(chan struct{}), "2": make(chan struct{}), "3": make(chan struct{})}
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- c.StreamAhead(tctx(t), "test.stream", nil, 1, func(values []jx.Raw) error {
			v := string(values[0])
			got = append(got, v)
			if ch, ok := release[strings.Trim(v, `"`)]; ok {
				<-ch
			}
			return nil
		})
	}()
	<-sent3
	if err := c.Call(tctx(t), "test.probe", nil, nil); err != nil {
		t.Fatalf("test.probe: %v", err)
	}
	close(release["1"])
	<-acked3 // chunk 2's handler is still waiting for release["2"] here
	close(release["2"])
	close(release["3"])
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "1,2,3" {
		t.Fatalf("handler saw %v, want 1,2,3", got)
	}
}

// StreamAheadOnRead offers a Chunk to onRead on the read loop only while nothing of the stream
// waits in the queue or in the handler: a Chunk onRead takes is acknowledged at once and never
// reaches the handler; one it refuses goes to the handler; one that comes while the handler is
// busy is queued behind it, never offered to onRead out of order. Every Chunk is acknowledged.
func TestStreamAheadOnReadKeepsOrder(t *testing.T) {
	acked3 := make(chan struct{})
	ts := newServer(t, func(p *peer) {
		var once sync.Once
		defer once.Do(func() { close(acked3) }) // a script that failed early lets the test go on
		s, ok := p.request()
		if !ok {
			return
		}
		id := s.ID.String
		expectAck := func(what string) bool { return expectStreamAck(t, p, id, what) }
		for _, v := range []string{"1", "2", "3"} {
			p.send(chunk(id, v))
			if !expectAck("chunk " + v) {
				return
			}
		}
		once.Do(func() { close(acked3) })
		p.send(exitOK(id, ""))
	})
	c := dial(t, ts, Options{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	defer releaseOnce.Do(func() { close(release) })
	var mu sync.Mutex
	var offered, handled []string
	done := make(chan error, 1)
	go func() {
		done <- c.StreamAheadOnRead(tctx(t), "test.stream", nil, 2,
			func(values []jx.Raw) (bool, error) {
				mu.Lock()
				defer mu.Unlock()
				offered = append(offered, string(values[0]))
				return string(values[0]) != "2", nil // "2" is left to the handler
			},
			func(values []jx.Raw) error {
				mu.Lock()
				handled = append(handled, string(values[0]))
				mu.Unlock()
				<-release // busy until chunk 3 has come and been acknowledged
				return nil
			})
	}()
	<-acked3
	releaseOnce.Do(func() { close(release) })
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(offered, ","); got != "1,2" {
		t.Errorf("onRead was offered %s, want 1,2 (chunk 3 came while the handler had chunk 2)", got)
	}
	if got := strings.Join(handled, ","); got != "2,3" {
		t.Errorf("the handler saw %s, want 2,3", got)
	}
}

// A refused upgrade leaves no connection behind: the answer's connection, read to its end, would
// otherwise wait in the idle pool of the transport Dial made for the handshake (peekClient's
// clone, used for nothing else) until its idle timeout, one per failed dial of a reconnect loop.
func TestRefusedUpgradeClosesItsConnection(t *testing.T) {
	var closed atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("restarting"))
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateClosed {
			closed.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	for range 3 {
		var ue *UpgradeError
		if _, err := Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", Options{}); !errors.As(err, &ue) || ue.Status != http.StatusServiceUnavailable {
			t.Fatalf("dial: %v", err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for closed.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 3 refused upgrades' connections closed: the others wait in an idle pool", closed.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
