package effectrpc

import (
	"context"
	"encoding/binary"
	"net"
	"net/http"
	"net/url"
	"sync/atomic"
)

// peekConn is the TCP connection under a plain ws:// socket, read through a buffer of its own so
// that the read loop can tell whether the next frame has already arrived whole (ready): if it has,
// the Acks the loop owes can wait for that frame's and go out with them in one frame (Conn.flushAcks)
// — the next read cannot wait for anything this side still owes T3. One read of the socket also
// takes every frame already there (the library's reader fills 4 KiB at a time).
//
// It hands the library no byte past the end of the frame it is in (the WebSocket framing is
// parsed here as the bytes go by): so once the library has read a message to its end, none of the
// next frame's bytes sit in the library's own buffer, and what this buffer holds is all that
// arrived. Until armed (the handshake is done) it only passes reads through. A frame header that
// cannot be a server's (masked, reserved bits, an unknown opcode) means the framing was lost
// track of (bytes the HTTP client read ahead with the handshake's response): ready then stays
// false for good, which only stops the coalescing.
//
// Reads come from one goroutine at a time (the library's read lock); ready is read by the read
// loop, hence atomic.
type peekConn struct {
	net.Conn
	buf   []byte
	r, w  int   // unread bytes: buf[r:w]
	left  int64 // bytes of the current frame (header included) not yet handed out
	armed bool
	lost  bool
	ready atomic.Bool
}

// noPeek turns peekConn off (benchmarks compare with a socket read as before).
var noPeek = false

// peekBuffer is a peekConn's buffer: several of a busy stream's chunks (a few hundred bytes to a
// few KiB each) and the Acks' and Exits' frames between them.
const peekBuffer = 8 << 10

func (p *peekConn) arm() { p.armed = true }

func (p *peekConn) Read(b []byte) (int, error) {
	if !p.armed || p.lost {
		if p.r < p.w {
			n := copy(b, p.buf[p.r:p.w])
			p.r += n
			return n, nil
		}
		return p.Conn.Read(b)
	}
	if p.left == 0 {
		// At a frame's start: its header tells how far the library may read.
		if err := p.header(); err != nil {
			if p.r < p.w {
				// The stream ended (or failed) inside a header: the bytes that came are handed
				// on first, the error with the next read, as the socket itself would.
				n := copy(b, p.buf[p.r:p.w])
				p.r += n
				return n, nil
			}
			return 0, err
		}
		if p.lost {
			return p.Read(b)
		}
	}
	if int64(len(b)) > p.left {
		b = b[:p.left]
	}
	var n int
	if p.r == p.w {
		if p.left >= int64(len(p.buf)) {
			// A large frame's payload: straight into the library's buffer, not through this one.
			var err error
			n, err = p.Conn.Read(b)
			p.left -= int64(n)
			return n, err
		}
		if err := p.fill(); err != nil {
			return 0, err
		}
	}
	n = copy(b, p.buf[p.r:p.w])
	p.r += n
	p.left -= int64(n)
	if p.left == 0 {
		p.ready.Store(p.wholeDataFrame())
	}
	return n, nil
}

// fill reads what the socket has after the unread bytes, moving them to the buffer's start.
func (p *peekConn) fill() error {
	if p.r > 0 {
		p.w = copy(p.buf, p.buf[p.r:p.w])
		p.r = 0
	}
	n, err := p.Conn.Read(p.buf[p.w:])
	p.w += n
	if n > 0 {
		return nil
	}
	return err
}

// header reads until the next frame's header is buffered and sets left to the frame's size; a
// header no server sends sets lost.
func (p *peekConn) header() error {
	p.ready.Store(false)
	for {
		hlen, size, ok, bad := frameSize(p.buf[p.r:p.w])
		if bad {
			p.lost = true
			return nil
		}
		if ok {
			p.left = hlen + size
			return nil
		}
		if err := p.fill(); err != nil {
			return err
		}
	}
}

// wholeDataFrame reports whether the unread bytes begin with a whole unfragmented text or binary
// frame: the library's next Reader and the read of that message to its end then take only
// buffered bytes. A control frame (which the library answers and then reads on) or a fragment
// does not count.
func (p *peekConn) wholeDataFrame() bool {
	b := p.buf[p.r:p.w]
	hlen, size, ok, bad := frameSize(b)
	if !ok || bad || int64(len(b)) < hlen+size {
		return false
	}
	fin, op := b[0]&0x80 != 0, b[0]&0x0f
	return fin && (op == 1 || op == 2)
}

// frameSize reads a server frame's header at the start of b (RFC 6455, 5.2): its length and its
// payload's. ok is false while b holds less than the whole header; bad is set for a header a
// server never sends here (masked, a reserved bit: no extension is negotiated without
// compression, an undefined opcode, a length over 2^63).
func frameSize(b []byte) (hlen, size int64, ok, bad bool) {
	if len(b) < 2 {
		return 0, 0, false, false
	}
	op := b[0] & 0x0f
	if b[0]&0x70 != 0 || b[1]&0x80 != 0 || (op > 2 && op < 8) || op > 10 {
		return 0, 0, false, true
	}
	switch n := b[1] & 0x7f; n {
	case 126:
		if len(b) < 4 {
			return 0, 0, false, false
		}
		return 4, int64(binary.BigEndian.Uint16(b[2:4])), true, false
	case 127:
		if len(b) < 10 {
			return 0, 0, false, false
		}
		v := binary.BigEndian.Uint64(b[2:10])
		if v>>63 != 0 {
			return 0, 0, false, true
		}
		return 10, int64(v), true, false
	default:
		return 2, int64(n), true, false
	}
}

// peekClient returns a client for the handshake whose connection is a peekConn, and where to find
// that connection once dialled (nil when none was made): for ws:// through an *http.Transport
// (or none: http.DefaultTransport) without a proxy. Otherwise (wss://: the peekConn would sit
// under TLS, where the frames cannot be seen; another RoundTripper; a proxy) it returns hc and the
// socket is read as before, its Acks going out one frame each.
func peekClient(hc *http.Client, rawURL string) (*http.Client, *atomic.Pointer[peekConn]) {
	if noPeek {
		return hc, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "http") {
		return hc, nil
	}
	if hc == nil {
		hc = http.DefaultClient
	}
	rt := hc.Transport
	if rt == nil {
		rt = http.DefaultTransport
	}
	tr, ok := rt.(*http.Transport)
	if !ok || tr.DialTLSContext != nil {
		return hc, nil
	}
	if tr.Proxy != nil {
		pu := *u
		pu.Scheme = "http"
		if p, err := tr.Proxy(&http.Request{URL: &pu}); err != nil || p != nil {
			return hc, nil
		}
	}
	tr = tr.Clone()
	dial := tr.DialContext
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	got := new(atomic.Pointer[peekConn])
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		pc := &peekConn{Conn: nc, buf: make([]byte, peekBuffer)}
		got.Store(pc)
		return pc, nil
	}
	c := *hc
	c.Transport = tr
	return &c, got
}
