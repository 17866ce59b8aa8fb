//go:build linux

package t3fake

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/sys/unix"
)

// The send time OnItemSent gives is when the item's write began, never later than the moment the
// peer could have its bytes: the load harness measures latencies from it, and the time after the
// write can come after the peer's answer (a goroutine waits for a core after its write).
//
// Made certain here with a write that cannot finish before the peer reads: the fake's sockets
// get a small send buffer, and the client reads nothing until the shell snapshot (~400 KB, far
// more than both sockets' buffers) has started to arrive. The client takes its clock then, and
// only then reads: the snapshot's send time must be before that clock. A time taken after the
// write is always later (the write's last bytes wait for the client's reads).
func TestItemSendTimeIsWhenItsWriteBegan(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	tl, ok := s.hs.Listener.(*net.TCPListener)
	if !ok {
		t.Fatalf("the fake's listener is a %T", s.hs.Listener)
	}
	// Accepted sockets inherit the listener's send buffer; a set size also stops its autotuning.
	raw, err := tl.SyscallConn()
	if err == nil {
		err = setSockInt(raw, unix.SO_SNDBUF, 4096)
	}
	if err != nil {
		t.Fatalf("the listener's send buffer: %v", err)
	}
	pid := s.AddProject("api", "/srv/api")
	for i := range 200 {
		s.AddThread(pid, fmt.Sprintf("%03d %s", i, strings.Repeat("x", 2000)), "idle")
	}
	var mu sync.Mutex
	var snapshotAt time.Time
	s.OnItemSent(func(kind string, _ int64, at time.Time) {
		if kind == "shell:snapshot" {
			mu.Lock()
			snapshotAt = at
			mu.Unlock()
		}
	})

	conns := make(chan *net.TCPConn, 1)
	client := &http.Client{Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			// A set receive buffer (64 KiB, the kernel doubles it) whatever the machine's default,
			// far less than the snapshot.
			d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
				return setSockInt(rc, unix.SO_RCVBUF, 64<<10)
			}}
			c, err := d.DialContext(ctx, network, addr)
			if tc, ok := c.(*net.TCPConn); ok {
				conns <- tc
			}
			return c, err
		},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), deadlock)
	defer cancel()
	u := s.WebSocketURL() + "?wsTicket=" + mintTicket(t, s, s.Token()) + "&orchestrationProtocol=2"
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: client})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(-1)
	tc := <-conns
	req := `{"_tag":"Request","id":"1","tag":"orchestration.subscribeShell","payload":{"requestCompletionMarker":true},"headers":[]}`
	if err := ws.Write(ctx, websocket.MessageText, []byte(req)); err != nil {
		t.Fatal(err)
	}
	// Wait, reading nothing, until more has arrived than any frame but the snapshot holds: its
	// write has begun.
	for inq := 0; inq < 16<<10; inq = sockInq(t, tc) {
		if ctx.Err() != nil {
			t.Fatalf("the snapshot did not start to arrive (%d bytes waiting)", inq)
		}
		time.Sleep(time.Millisecond)
	}
	readFrom := time.Now()
	for {
		_, data, err := ws.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		if strings.Contains(string(data), `"snapshot"`) {
			break
		}
	}
	// The hook runs after the write returns, which the reads above let happen.
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return !snapshotAt.IsZero() })
	mu.Lock()
	defer mu.Unlock()
	if !snapshotAt.Before(readFrom) {
		t.Errorf("the snapshot's send time is %v after the client began to read it; want the time its write began, before",
			snapshotAt.Sub(readFrom))
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	end := time.Now().Add(deadlock)
	for !cond() {
		if time.Now().After(end) {
			t.Fatal("the condition never held")
		}
		time.Sleep(time.Millisecond)
	}
}

// setSockInt sets the SOL_SOCKET option opt of raw's socket to v.
func setSockInt(raw syscall.RawConn, opt, v int) error {
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, v) }); err != nil {
		return err
	}
	return serr
}

// sockInq is how many bytes wait unread in c's receive queue.
func sockInq(t *testing.T, c syscall.Conn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var ierr error
	if err := raw.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCINQ) }); err != nil || ierr != nil {
		t.Fatalf("SIOCINQ: %v %v", err, ierr)
	}
	return n
}
