package effectrpc

import (
	"bytes"
	"io"
	"net"
	"testing"
)

// chunkedConn is a net.Conn whose reads return the stream in pieces of the sizes given (a socket's
// reads end where the data that had arrived ends).
type chunkedConn struct {
	net.Conn
	data  []byte
	sizes []byte
}

func (c *chunkedConn) Read(b []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := len(c.data)
	if len(c.sizes) > 0 {
		n = min(n, int(c.sizes[0])*37+1)
		c.sizes = c.sizes[1:]
	}
	n = copy(b, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// FuzzPeekConn: whatever the peer sends (frames or garbage, in any pieces), a peekConn hands on
// exactly the bytes that came, in order, to readers asking for any sizes: it only ever limits how
// far one read goes. And when it says a whole data frame is buffered, one is.
func FuzzPeekConn(f *testing.F) {
	f.Add(append(serverFrame(`{"_tag":"Chunk"}`), serverFrame(`{"_tag":"Exit"}`)...), []byte{0, 1, 2}, []byte{4, 3})
	f.Add(append(serverFrame(string(make([]byte, 70000))), 0x89, 0, 0x81, 1, 'x'), []byte{9, 200}, []byte{255, 1})
	f.Add([]byte("{garbage"), []byte{}, []byte{1})
	f.Fuzz(func(t *testing.T, data, sizes, reads []byte) {
		pc := &peekConn{Conn: &chunkedConn{data: bytes.Clone(data), sizes: sizes}, buf: make([]byte, 64)}
		pc.arm()
		var got []byte
		for i := 0; ; i++ {
			n := 1
			if len(reads) > 0 {
				n = int(reads[i%len(reads)])*3 + 1
			}
			b := make([]byte, n)
			k, err := pc.Read(b)
			got = append(got, b[:k]...)
			if pc.ready.Load() {
				if _, _, ok, bad := frameSize(pc.buf[pc.r:pc.w]); !ok || bad {
					t.Fatal("ready without a whole frame buffered")
				}
			}
			if err != nil {
				break
			}
			if k == 0 && i > len(data)+10 {
				t.Fatal("no progress")
			}
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("handed on %d bytes, %x; the peer sent %d, %x", len(got), got, len(data), data)
		}
	})
}

// frameSize reads the three header lengths and refuses what a server never sends.
func TestFrameSize(t *testing.T) {
	for _, c := range []struct {
		b          []byte
		hlen, size int64
		ok, bad    bool
	}{
		{b: []byte{0x81}},
		{b: []byte{0x81, 5}, hlen: 2, size: 5, ok: true},
		{b: []byte{0x81, 126, 1}},
		{b: []byte{0x81, 126, 1, 0}, hlen: 4, size: 256, ok: true},
		{b: []byte{0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0}, hlen: 10, size: 65536, ok: true},
		{b: []byte{0x82, 127, 0x80, 0, 0, 0, 0, 1, 0, 0}, bad: true},
		{b: []byte{0x81, 0x85}, bad: true},      // masked
		{b: []byte{0xc1, 5}, bad: true},         // RSV1: no compression negotiated
		{b: []byte{0x83, 5}, bad: true},         // reserved opcode
		{b: []byte("{\"_tag"), bad: true},       // JSON, not a header
		{b: []byte{0x89, 0}, hlen: 2, ok: true}, // ping
	} {
		hlen, size, ok, bad := frameSize(c.b)
		if hlen != c.hlen || size != c.size || ok != c.ok || bad != c.bad {
			t.Errorf("frameSize(%x) = %d, %d, %v, %v; want %d, %d, %v, %v", c.b, hlen, size, ok, bad, c.hlen, c.size, c.ok, c.bad)
		}
	}
}
