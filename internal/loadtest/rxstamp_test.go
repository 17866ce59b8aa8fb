package loadtest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// The kernel turns receive stamps on for every socket while at least one asks for them, and
// turns them off again in a work item of its own when the last one closes: with stamped sockets
// coming and going (as tests make them), a segment can arrive in a moment when nothing is
// stamped. So each test repeats its exchange until a read comes stamped (at most stampTries
// times; an implementation that never stamps fails) and checks the times of that exchange. In
// the harness the clients' and the receiver's sockets stay open for the whole run, and the
// report counts the stamped answers (n of wake_rx_latency and event_rx_latency).
const stampTries = 10

// checkStamped runs exchange until it comes back stamped, at most stampTries times, and checks
// that the stamp at fell after the bytes were written (before) and before they were read (readAt).
func checkStamped(t *testing.T, exchange func() (at, before, readAt time.Time)) {
	t.Helper()
	for try := 1; try <= stampTries; try++ {
		at, before, readAt := exchange()
		if at.IsZero() {
			continue
		}
		if at.Before(before) || !at.Before(readAt) {
			t.Fatalf("stamp %s: want after the write began (%s) and before the read (%s)", at.Format(time.StampMicro), before.Format(time.StampMicro), readAt.Format(time.StampMicro))
		}
		return
	}
	t.Fatalf("no receive stamp in %d exchanges", stampTries)
}

// TestRxStampIsWhenTheBytesArrived: the server writes an answer's end, and the client reads it
// only a while later. The mark holds when the bytes reached the client's socket: after the server
// began writing them and before the client read them (the pause between is 200 ms, so the order
// cannot come from scheduling). Without the stamps the mark would stay empty, and with the read's
// own time it would fall after the pause began.
func TestRxStampIsWhenTheBytesArrived(t *testing.T) {
	wrote := make(chan time.Time, 1)
	const end = "data: {\"result\":1}\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("event: message\n"))
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
		before := time.Now()
		w.Write([]byte(end))
		w.(http.Flusher).Flush()
		wrote <- before
	}))
	defer srv.Close()
	tr := &http.Transport{DialContext: dialRx}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: rxTransport{base: tr}}

	checkStamped(t, func() (at, before, readAt time.Time) {
		ctx, m := withRxMark(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		before = <-wrote
		time.Sleep(200 * time.Millisecond)
		readAt = time.Now()
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(body) < len(end) || string(body[len(body)-len(end):]) != end {
			t.Fatalf("body %q", body)
		}
		return m.time(), before, readAt
	})
}

// TestRxTransportPassesOthersThrough: a request without a mark is the base transport's, and its
// body is not wrapped.
func TestRxTransportPassesOthersThrough(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer srv.Close()
	tr := &http.Transport{DialContext: dialRx}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: rxTransport{base: tr}}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, wrapped := resp.Body.(*rxBody); wrapped {
		t.Fatal("an unmarked request's body was wrapped")
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != "ok" {
		t.Fatalf("body %q", b)
	}
}

// TestRxListenerStampsWhatItAccepts: on the receiver's side, a connection accepted through
// rxListener holds the stamp of the bytes it read: after the client sent them, before the
// server read them (200 ms later). Its reads end as a plain connection's do.
func TestRxListenerStampsWhatItAccepts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := rxListener{ln}
	defer rl.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sc, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	if _, ok := sc.(*rxConn); !ok {
		t.Fatalf("accepted %T, want a stamped connection", sc)
	}
	if !rxTime(sc).IsZero() {
		t.Fatal("a stamp before anything was read")
	}
	buf := make([]byte, 64)
	checkStamped(t, func() (at, before, readAt time.Time) {
		before = time.Now()
		if _, err := c.Write([]byte("POST /hook")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		readAt = time.Now()
		n, err := sc.Read(buf)
		if err != nil || string(buf[:n]) != "POST /hook" {
			t.Fatalf("read %q, %v", buf[:n], err)
		}
		return rxTime(sc), before, readAt
	})
	// A read past its deadline fails as a plain connection's does, and the peer's close is an
	// end of file.
	sc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	var ne net.Error
	if _, err := sc.Read(buf); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("past the deadline: %v, want a timeout", err)
	}
	sc.SetReadDeadline(time.Time{})
	c.Close()
	if _, err := sc.Read(buf); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want io.EOF", err)
	}
}
