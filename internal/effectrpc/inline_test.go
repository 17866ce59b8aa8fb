package effectrpc

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// StreamInline: a Chunk the handler finishes on the read loop is acknowledged at once; a Chunk
// whose handler returns a rest is acknowledged only after the rest returned. The rests here make
// a unary call of their own (on the stream's goroutine: the read loop is free to bring its reply),
// and on the wire that Request must come before the Chunk's Ack.
func TestStreamInlineAcksDoneChunksAtOnceAndTheRestAfterIt(t *testing.T) {
	const chunks = 6
	ts := newServer(t, func(p *peer) {
		s, ok := p.request()
		if !ok {
			return
		}
		id := s.ID.String
		for i := 1; i <= chunks; i++ {
			p.send(chunk(id, strconv.Itoa(i)))
			r, ok := p.recv()
			if !ok {
				return
			}
			if i%2 == 0 { // a rest: its probe first
				if !r.msg.IsRequest() || r.msg.Request.Method != "test.probe" {
					t.Errorf("chunk %d (a rest): want the rest's probe before the Ack, got %s", i, r.raw)
					return
				}
				p.send(exitOK(idKey(r.msg.Request.ID), "{}"))
				if r, ok = p.recv(); !ok {
					return
				}
			}
			if !r.msg.IsAck() || idKey(r.msg.Ack.RequestId) != id {
				t.Errorf("chunk %d: want its Ack, got %s", i, r.raw)
				return
			}
		}
		p.send(exitOK(id, ""))
	})
	c := dial(t, ts, Options{})
	var got []string
	err := c.StreamInline(tctx(t), "test.stream", nil, func(ch Chunk) func() error {
		v := string(ch.Values[0])
		got = append(got, v)
		if n, _ := strconv.Atoi(v); n%2 == 1 {
			return nil
		}
		return func() error {
			if string(ch.Values[0]) != v {
				return fmt.Errorf("the rest of chunk %s reads %s", v, ch.Values[0])
			}
			return c.Call(tctx(t), "test.probe", nil, nil)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "1,2,3,4,5,6" {
		t.Fatalf("handler saw %v, want 1..6 in order", got)
	}
}

// A Chunk that comes while an earlier one's rest has not run yet (a server that does not wait for
// the Ack) is handled on the stream's goroutine after that rest, whole: the handler never runs
// twice at once, sees the Chunks in order, and each Chunk is acknowledged once, after its work.
func TestStreamInlineChunkBehindARestWaitsForIt(t *testing.T) {
	ts := newServer(t, func(p *peer) {
		s, ok := p.request()
		if !ok {
			return
		}
		id := s.ID.String
		p.send("[" + chunk(id, "1") + "," + chunk(id, "2") + "]")
		p.send(chunk(id, "3"))
		// The rest of chunk 1 asks for test.sync: its reply comes after chunks 2 and 3 on the
		// socket, so once the rest has it, the read loop has dispatched both.
		r, ok := p.recv()
		if !ok {
			return
		}
		if !r.msg.IsRequest() || r.msg.Request.Method != "test.sync" {
			t.Errorf("want the rest's test.sync before any Ack, got %s", r.raw)
			return
		}
		p.send(exitOK(idKey(r.msg.Request.ID), "{}"))
		for i := 1; i <= 3; i++ {
			r, ok := p.recv()
			if !ok {
				return
			}
			if !r.msg.IsAck() || idKey(r.msg.Ack.RequestId) != id {
				t.Errorf("want Ack %d, got %s", i, r.raw)
				return
			}
		}
		p.send(exitOK(id, ""))
	})
	c := dial(t, ts, Options{})
	var (
		mu       sync.Mutex
		order    []string
		inFlight atomic.Int32
	)
	note := func(s string) {
		if inFlight.Add(1) != 1 {
			t.Errorf("%s runs beside other handler work", s)
		}
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	err := c.StreamInline(tctx(t), "test.stream", nil, func(ch Chunk) func() error {
		v := string(ch.Values[0])
		note("chunk " + v)
		defer inFlight.Add(-1)
		if v != "1" {
			return nil
		}
		return func() error {
			err := c.Call(tctx(t), "test.sync", nil, nil)
			note("rest 1")
			inFlight.Add(-1)
			if string(ch.Values[0]) != "1" {
				return fmt.Errorf("chunk 1's rest reads %s once later frames were read", ch.Values[0])
			}
			return err
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ","); got != "chunk 1,rest 1,chunk 2,chunk 3" {
		t.Fatalf("handler work in the order %s, want chunk 1,rest 1,chunk 2,chunk 3", got)
	}
}
