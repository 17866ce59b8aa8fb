package effectrpc

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// rawServer is a WebSocket server on 127.0.0.1 that writes frames as raw bytes, so that a test
// decides which frames reach the client in one TCP write (and so arrive together), or that a
// frame arrives in two parts. Each client frame it reads is one entry of frames: its messages.
type rawServer struct {
	*httptest.Server
	conns  chan *rawPeer
	closed chan struct{}
	once   sync.Once
}

type rawPeer struct {
	t      testing.TB
	nc     net.Conn
	br     *bufio.Reader
	frames chan []t3rpc.ClientMessage
}

func newRawServer(t testing.TB) *rawServer {
	rs := &rawServer{conns: make(chan *rawPeer, 1), closed: make(chan struct{})}
	rs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha1.Sum([]byte(r.Header.Get("Sec-WebSocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
		nc, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		defer func() { _ = nc.Close() }()
		fmt.Fprintf(nc, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
			base64.StdEncoding.EncodeToString(h[:]))
		p := &rawPeer{t: t, nc: nc, br: brw.Reader, frames: make(chan []t3rpc.ClientMessage, 64)}
		rs.conns <- p
		p.readLoop()
		<-rs.closed
	}))
	t.Cleanup(func() {
		rs.once.Do(func() { close(rs.closed) })
		rs.Close()
	})
	return rs
}

// readLoop reads the client's (masked) frames until the socket closes.
func (p *rawPeer) readLoop() {
	defer close(p.frames)
	for {
		var h [2]byte
		if _, err := io.ReadFull(p.br, h[:]); err != nil {
			return
		}
		n := int64(h[1] & 0x7f)
		switch n {
		case 126:
			var b [2]byte
			if _, err := io.ReadFull(p.br, b[:]); err != nil {
				return
			}
			n = int64(binary.BigEndian.Uint16(b[:]))
		case 127:
			var b [8]byte
			if _, err := io.ReadFull(p.br, b[:]); err != nil {
				return
			}
			n = int64(binary.BigEndian.Uint64(b[:]))
		}
		var key [4]byte
		if _, err := io.ReadFull(p.br, key[:]); err != nil {
			return
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(p.br, data); err != nil {
			return
		}
		for i := range data {
			data[i] ^= key[i%4]
		}
		switch h[0] & 0x0f {
		case 8: // the close handshake: answered, so that the client's Close need not wait
			_, _ = p.nc.Write([]byte{0x88, 0})
			return
		case 1:
		default:
			continue // a pong
		}
		var msgs []t3rpc.ClientMessage
		raws := [][]byte{data}
		if d := jx.DecodeBytes(data); d.Next() == jx.Array {
			raws = nil
			_ = d.Arr(func(d *jx.Decoder) error {
				r, err := d.Raw()
				raws = append(raws, r)
				return err
			})
		}
		for _, raw := range raws {
			var m t3rpc.ClientMessage
			if err := m.UnmarshalJSON(raw); err != nil {
				p.t.Errorf("server: undecodable client message %s: %v", raw, err)
				continue
			}
			msgs = append(msgs, m)
		}
		p.frames <- msgs
	}
}

// next returns the client's next frame that is not a Ping.
func (p *rawPeer) next() []t3rpc.ClientMessage {
	for {
		select {
		case f, ok := <-p.frames:
			if !ok {
				p.t.Error("server: the client left")
				return nil
			}
			if len(f) == 1 && f[0].IsPing() {
				continue
			}
			return f
		case <-time.After(safety):
			p.t.Errorf("server: no client frame within %v", safety)
			return nil
		}
	}
}

// serverFrame is a text frame as a server writes it (unmasked).
func serverFrame(payload string) []byte {
	var b []byte
	switch n := len(payload); {
	case n < 126:
		b = []byte{0x81, byte(n)}
	case n < 1<<16:
		b = []byte{0x81, 126, byte(n >> 8), byte(n)}
	default:
		b = []byte{0x81, 127, 0, 0, 0, 0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	}
	return append(b, payload...)
}

// write writes bytes in one TCP write.
func (p *rawPeer) write(b ...[]byte) {
	if _, err := p.nc.Write(bytes.Join(b, nil)); err != nil {
		p.t.Errorf("server: write: %v", err)
	}
}

// acksOf returns the request ids a frame acknowledges, failing on anything else in it.
func acksOf(t *testing.T, f []t3rpc.ClientMessage) []string {
	t.Helper()
	var ids []string
	for _, m := range f {
		if !m.IsAck() {
			t.Errorf("want Acks only, got a %s", m.Type)
			continue
		}
		ids = append(ids, idKey(m.Ack.RequestId))
	}
	return ids
}

// openInline opens n inline streams whose handler is handler(stream index, chunk), returning once
// the server has all n requests (their ids, in order) and a channel of the streams' results.
func openInline(t *testing.T, c *Conn, p *rawPeer, n int, handler func(i int, ch Chunk) func() error) ([]string, chan error) {
	t.Helper()
	errs := make(chan error, n)
	var ids []string
	for i := range n {
		go func() {
			errs <- c.StreamInline(tctx(t), "test.stream", nil, func(ch Chunk) func() error { return handler(i, ch) })
		}()
		f := p.next()
		if len(f) != 1 || !f[0].IsRequest() {
			t.Fatalf("want a Request, got %v", f)
		}
		ids = append(ids, f[0].Request.ID.String)
	}
	return ids, errs
}

// Chunks of two streams that arrive together are acknowledged together: one frame, a JSON array of
// both Acks, in the order the Chunks came. A Chunk alone is acknowledged alone, as a plain object.
func TestAcksOfChunksReadTogetherGoOutInOneFrame(t *testing.T) {
	rs := newRawServer(t)
	c := dial(t, &testServer{Server: rs.Server}, Options{PingInterval: time.Hour})
	p := <-rs.conns
	if c.peek == nil {
		t.Fatal("a ws:// socket through the default transport is not peeked")
	}
	ids, errs := openInline(t, c, p, 2, func(int, Chunk) func() error { return nil })

	p.write(serverFrame(chunk(ids[1], "1")), serverFrame(chunk(ids[0], "2")))
	wantAcks(t, p, "two Chunks read together", ids[1], ids[0])
	p.write(serverFrame(chunk(ids[0], "3")))
	wantAcks(t, p, "Ack of a Chunk alone", ids[0])
	endStreams(t, p, ids, errs)
}

// An Ack is never held for a frame that has not arrived whole: T3 sends the rest of it whether or
// not it has the Ack, but a server may as well wait for the Ack first, as this one does. Nor for
// a control frame, which the library answers before it reads on.
func TestAckIsNotHeldForAFrameNotYetWhole(t *testing.T) {
	rs := newRawServer(t)
	c := dial(t, &testServer{Server: rs.Server}, Options{PingInterval: time.Hour})
	p := <-rs.conns
	ids, errs := openInline(t, c, p, 2, func(int, Chunk) func() error { return nil })

	second := serverFrame(chunk(ids[1], `"`+strings.Repeat("x", 3000)+`"`))
	p.write(serverFrame(chunk(ids[0], "1")), second[:100])
	wantAcks(t, p, "Ack ahead of a frame's first part", ids[0])
	p.write(second[100:])
	wantAcks(t, p, "Ack of the frame once whole", ids[1])
	// A Chunk, then a WebSocket ping (answered by the library with a pong, not seen here).
	p.write(serverFrame(chunk(ids[0], "2")), []byte{0x89, 0})
	wantAcks(t, p, "Ack ahead of a ping frame", ids[0])
	endStreams(t, p, ids, errs)
}

// The Ack of a Chunk whose work must be made durable first (its rest, a commit) goes out only
// after that, even when a Chunk of another stream read with it is acknowledged at once: the Acks
// are gathered only from Chunks that are done.
func TestAckOfAChunkWaitingForItsCommitIsNotSentWithOthers(t *testing.T) {
	rs := newRawServer(t)
	c := dial(t, &testServer{Server: rs.Server}, Options{PingInterval: time.Hour})
	p := <-rs.conns
	commit := make(chan struct{})
	var committed sync.Mutex // held until the commit is done
	committed.Lock()
	ids, errs := openInline(t, c, p, 2, func(i int, ch Chunk) func() error {
		if i == 0 && string(ch.Values[0]) == `"commit"` {
			return func() error {
				<-commit
				committed.Unlock()
				return nil
			}
		}
		return nil
	})

	p.write(serverFrame(chunk(ids[0], `"commit"`)), serverFrame(chunk(ids[1], "1")))
	wantAcks(t, p, "while the other stream's Chunk waits for its commit", ids[1])
	close(commit)
	wantAcks(t, p, "after the commit", ids[0])
	if !committed.TryLock() {
		t.Fatal("the Ack went out before the commit was done")
	}
	endStreams(t, p, ids, errs)
}

// endStreams ends the streams (an Exit each) and checks that each returned nil.
func endStreams(t testing.TB, p *rawPeer, ids []string, errs chan error) {
	t.Helper()
	var exits [][]byte
	for _, id := range ids {
		exits = append(exits, serverFrame(exitOK(id, "")))
	}
	p.write(exits...)
	for range ids {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// wantAcks checks that the client's next frame acknowledges the streams ids, in that order.
func wantAcks(t *testing.T, p *rawPeer, what string, ids ...string) {
	t.Helper()
	if got := acksOf(t, p.next()); strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("%s: the frame acknowledges %v, want %v", what, got, ids)
	}
}
