package loadtest

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestRxStampIsWhenTheBytesArrived: the server writes an answer's end, and the client reads it
// only a while later. The mark holds when the bytes reached the client's socket: after the server
// began writing them and before the client read them (the pause between is 200 ms, so the order
// cannot come from scheduling). Without the stamps the mark would be empty, and with the read's
// own time it would fall after the pause began.
func TestRxStampIsWhenTheBytesArrived(t *testing.T) {
	wrote := make(chan time.Time, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("event: message\n"))
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond)
		before := time.Now()
		w.Write([]byte("data: {\"result\":1}\n\n"))
		w.(http.Flusher).Flush()
		wrote <- before
	}))
	defer srv.Close()
	tr := &http.Transport{DialContext: dialRx}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: rxTransport{base: tr}}

	ctx, m := withRxMark(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	before := <-wrote
	time.Sleep(200 * time.Millisecond)
	readAt := time.Now()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if want := "data: {\"result\":1}\n\n"; len(body) < len(want) || string(body[len(body)-len(want):]) != want {
		t.Fatalf("body %q", body)
	}
	at := m.time()
	if at.IsZero() {
		t.Fatal("no receive stamp on the answer")
	}
	if at.Before(before) || !at.Before(readAt) {
		t.Fatalf("stamp %s: want after the write began (%s) and before the read (%s)", at.Format(time.StampMicro), before.Format(time.StampMicro), readAt.Format(time.StampMicro))
	}
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
// server read them (200 ms later).
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
	if !rxTime(sc).IsZero() {
		t.Fatal("a stamp before anything was read")
	}
	before := time.Now()
	if _, err := c.Write([]byte("POST /hook")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	readAt := time.Now()
	buf := make([]byte, 64)
	n, err := sc.Read(buf)
	if err != nil || string(buf[:n]) != "POST /hook" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	at := rxTime(sc)
	if at.IsZero() || at.Before(before) || !at.Before(readAt) {
		t.Fatalf("stamp %v: want after the write began (%s) and before the read (%s)", at, before.Format(time.StampMicro), readAt.Format(time.StampMicro))
	}
	// The peer's close is an end of file, as on a plain connection.
	c.Close()
	if _, err := sc.Read(buf); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want io.EOF", err)
	}
}
