package loadtest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// This file: when an MCP answer's bytes reached the harness's host, by the kernel's clock.
//
// A wake's latency ends when the harness's client has read and decoded t3_wait's answer. On this
// machine's two cores the client shares the CPU with the harness's 100 fake T3s, so that end
// also counts the harness's own wait for a core after the bytes arrived (half of the slowest
// wakes' time, by a trace of both processes: docs/benchmarks.md, "One lock for every machine's
// chunks"). The kernel stamps each segment as it is received (SO_TIMESTAMPNS): that stamp is
// when the connector's answer reached the client's socket, whatever the client's process was
// doing. The report gives both ends (wake_latency and wake_rx_latency). The webhook receiver's
// connections are stamped the same way, for the events (event_latency and event_rx_latency).

// rxConn is a TCP connection whose reads keep the kernel's receive time of the newest bytes read.
// Reads on one connection are serial (net/http's read loop, fasthttp's serving goroutine), so
// the control-message buffer is the connection's own.
type rxConn struct {
	// net.Conn, not *net.TCPConn: the connection's other reads (TCPConn's WriteTo, which io.Copy
	// would take) would bypass Read and its stamps.
	net.Conn
	raw  syscall.RawConn
	oob  []byte
	last atomic.Int64 // unix nanoseconds of the newest segment read; 0: its read came unstamped
}

// stampReceives turns the kernel's receive stamps on for c and returns it as an rxConn; c
// itself where the kernel refuses them (its reads then carry no stamp, and the _rx_ figures are
// absent).
func stampReceives(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS_OLD, 1)
	}); err != nil || serr != nil {
		return c
	}
	return &rxConn{Conn: tc, raw: raw, oob: make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))}
}

// dialRx dials a TCP connection with receive stamps on (the MCP clients' transport).
func dialRx(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return stampReceives(c), nil
}

// rxListener accepts connections with receive stamps on (the webhook receiver's).
type rxListener struct{ net.Listener }

func (l rxListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return stampReceives(c), nil
}

// rxTime is the receive stamp of the newest bytes read on c; the zero time if c has none.
func rxTime(c net.Conn) time.Time {
	if rc, ok := c.(*rxConn); ok {
		return stampTime(rc.last.Load())
	}
	return time.Time{}
}

// stampTime is a stamp in unix nanoseconds as a time, 0 (none) as the zero time; stampNanos is
// its inverse. Stamps are held and sent between the split harness's processes as nanoseconds.
func stampTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func stampNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Read reads as the connection's Read does (the poller waits, deadlines hold) with recvmsg, and
// keeps the stamp that came with the bytes.
func (c *rxConn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n, oobn int
	var rerr error
	if err := c.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = unix.Recvmsg(int(fd), p, c.oob, 0)
		return rerr != unix.EAGAIN
	}); err != nil {
		return 0, err // the poller's: closed, or past the deadline (already a *net.OpError)
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: os.NewSyscallError("recvmsg", rerr)}
	}
	if n == 0 {
		return 0, io.EOF
	}
	// A read without a stamp (the kernel stamps nothing while no socket asks, and turns stamps
	// back on in a work item of its own) leaves the newest bytes' time unknown: 0, not the
	// stamp of older bytes, which would make their answer look early.
	c.last.Store(rxStamp(c.oob[:oobn]))
	return n, nil
}

// rxStamp is the SCM_TIMESTAMPNS stamp among the control messages oob, in unix nanoseconds; 0 if
// there is none.
func rxStamp(oob []byte) int64 {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS_OLD &&
			len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return ts.Nano()
		}
	}
	return 0
}

// rxMark takes, for one call, the receive stamp of the last bytes of its HTTP answer.
type rxMark struct{ at atomic.Int64 }

type rxMarkKey struct{}

// withRxMark is ctx with a mark that a call made with it fills.
func withRxMark(ctx context.Context) (context.Context, *rxMark) {
	m := &rxMark{}
	return context.WithValue(ctx, rxMarkKey{}, m), m
}

// time is the stamp taken; the zero time if the answer came with none.
func (m *rxMark) time() time.Time { return stampTime(m.at.Load()) }

// rxTransport is an http.RoundTripper that, for a request whose context holds an rxMark, stamps
// the mark with the receive time of each answer byte the caller reads: after the last read, the
// mark holds when the answer's end reached the socket. Other requests pass through.
type rxTransport struct{ base http.RoundTripper }

func (t rxTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	m, _ := req.Context().Value(rxMarkKey{}).(*rxMark)
	if m == nil {
		return t.base.RoundTrip(req)
	}
	var conn atomic.Pointer[rxConn]
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			if c, ok := i.Conn.(*rxConn); ok {
				conn.Store(c)
			}
		},
	}))
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	if c := conn.Load(); c != nil {
		resp.Body = &rxBody{ReadCloser: resp.Body, conn: c, mark: m}
	}
	return resp, nil
}

// rxBody is an answer's body that stamps its call's mark on every read that returned bytes. The
// stamp is the connection's newest: when the bytes read were already buffered by an earlier read,
// it is that read's or a later one's, so the stamp is never earlier than the bytes' arrival. When
// the connection's newest read came unstamped the mark is cleared (0), so that the answer is left
// out of the _rx_ figures rather than given the time of its earlier bytes.
type rxBody struct {
	io.ReadCloser
	conn *rxConn
	mark *rxMark
}

func (b *rxBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.mark.at.Store(b.conn.last.Load())
	}
	return n, err
}
