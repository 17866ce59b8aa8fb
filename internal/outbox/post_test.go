package outbox

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// The webhook requests go over fasthttp (post.go) unless net/http must carry them. These tests
// pin what the receiver sees and how answers are read on both paths.

// With a proxy named by the environment for the hook URL, the requests go through it (net/http's
// client, which honours it): fasthttp would have gone straight to the host.
func TestProxyFromEnvironmentCarriesTheRequests(t *testing.T) {
	var got atomic.Value
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Store(r.Method + " " + r.URL.String() + " " + r.Header.Get("Webhook-Id"))
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(proxy.Close)
	for _, k := range []string{"NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "http_proxy"} {
		t.Setenv(k, "")
	}
	t.Setenv("HTTP_PROXY", proxy.URL)
	h := start(t, Config{URL: "http://hook.invalid/events"}) // .invalid never resolves: only the proxy can answer
	if h.ob.fast != nil {
		t.Fatal("the poster was chosen though a proxy applies to the URL")
	}
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivery through the proxy", func() bool { _, _, dl := h.counts(); return dl == 1 })
	if want := "POST http://hook.invalid/events " + e.ID; got.Load() != want {
		t.Fatalf("the proxy saw %q, want %q", got.Load(), want)
	}
}

// Config.HTTPClient carries the requests when set: signed and delivered as over fasthttp.
func TestGivenHTTPClientCarriesTheRequests(t *testing.T) {
	rc := newReceiver(t)
	var trips atomic.Int64
	client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		trips.Add(1)
		return http.DefaultTransport.RoundTrip(r)
	})}
	h := start(t, Config{URL: rc.srv.URL, Secret: testSecret, HTTPClient: client})
	if h.ob.fast != nil {
		t.Fatal("the poster was chosen though Config.HTTPClient is set")
	}
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 1 })
	reqs := rc.requests()
	if trips.Load() != 1 || len(reqs) != 1 {
		t.Fatalf("round trips %d, requests %d", trips.Load(), len(reqs))
	}
	if err := verify(testSecret, reqs[0].Header, reqs[0].Body, t0); err != nil {
		t.Fatal(err)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// What the receiver sees over fasthttp: the path and query, the Standard Webhooks headers, the
// body as stored, and Basic auth from the URL's user info — unless a token is set, which wins
// (as net/http does: an Authorization header set on the request is kept).
func TestPosterSendsWhatTheReceiverExpects(t *testing.T) {
	rc := newReceiver(t)
	var paths sync.Map
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, req request) int {
		paths.Store(req.ID, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("Content-Type")+" "+r.Header.Get("User-Agent"))
		return http.StatusNoContent
	})
	u := strings.Replace(rc.srv.URL, "http://", "http://hook-user:p%40ss@", 1) + "/events?tenant=7"

	h := start(t, Config{URL: u, Secret: testSecret})
	if h.ob.fast == nil {
		t.Fatal("net/http was chosen for a loopback URL with no proxy")
	}
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 1 })
	req := rc.requests()[0]
	if err := verify(testSecret, req.Header, req.Body, t0); err != nil {
		t.Fatal(err)
	}
	if want := "Basic " + base64.StdEncoding.EncodeToString([]byte("hook-user:p@ss")); req.Header.Get("Authorization") != want {
		t.Fatalf("Authorization = %q, want %q", req.Header.Get("Authorization"), want)
	}
	if got, _ := paths.Load(e.ID); got != "POST /events?tenant=7 application/json t3code-mcp-outbox" {
		t.Fatalf("request line and headers: %q", got)
	}
	h.stop()

	h2 := start(t, Config{URL: u, Token: "tok-123"})
	e2 := mkEvent("m/b", 1)
	h2.commit(t, e2)
	eventually(t, "delivery", func() bool { _, _, dl := h2.counts(); return dl == 1 })
	for _, r := range rc.requests() {
		if r.ID == e2.ID && r.Header.Get("Authorization") != "Bearer tok-123" {
			t.Fatalf("with a token, Authorization = %q", r.Header.Get("Authorization"))
		}
	}
}

// An answer longer than what is read of it (drainBytes) is still classified by its status: a 2xx
// is a delivery (not a network failure sent again), a 503 a retry that names it.
func TestLongAnswersAreClassifiedByStatus(t *testing.T) {
	rc := newReceiver(t)
	long := strings.Repeat("x", 3*drainBytes)
	var fail atomic.Bool
	rc.setHandle(func(w http.ResponseWriter, _ *http.Request, _ request) int {
		if fail.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		} else {
			w.WriteHeader(http.StatusOK)
		}
		_, _ = io.WriteString(w, long)
		return 0
	})
	h := start(t, Config{URL: rc.srv.URL, Backoff: constBackoff(time.Hour)})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 1 })
	if got := h.event(t, e.ID); got.State != store.StateDelivered || got.Attempts != 1 {
		t.Fatalf("after a long 200: %+v", got)
	}
	fail.Store(true)
	e2 := mkEvent("m/b", 1)
	h.commit(t, e2)
	eventually(t, "the retry's record", func() bool { return h.event(t, e2.ID).Attempts == 1 })
	if got := h.event(t, e2.ID); got.State != store.StatePending || !strings.HasPrefix(got.LastError, "receiver: HTTP 503") {
		t.Fatalf("after a long 503: %+v", got)
	}
	if n := len(rc.requests()); n != 2 {
		t.Fatalf("the receiver got %d requests, want 2", n)
	}
}

// A receiver that closes a kept-alive connection after answering (its idle timeout, without
// "Connection: close") costs no attempt: the next request, which meets the closed connection,
// is sent again on a new one (retryClosed), so every event is delivered at its first attempt.
func TestReceiverClosingKeptAliveConnectionsCostsNoAttempt(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				r, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, r.Body)
				served.Add(1)
				// Keep-alive implied (HTTP/1.1, no Connection: close), then closed.
				_, _ = io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n")
			})
		}
	})
	h := start(t, Config{URL: "http://" + ln.Addr().String() + "/hook", Backoff: constBackoff(time.Hour)})
	var evs []store.Event
	for i := 1; i <= 4; i++ {
		evs = append(evs, mkEvent("m/a", i)) // one stream: each request after the previous one's record
	}
	h.commit(t, evs...)
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == len(evs) })
	for _, e := range evs {
		if got := h.event(t, e.ID); got.Attempts != 1 || got.LastError != "" {
			t.Fatalf("%s: %d attempts, last error %q", e.ID, got.Attempts, got.LastError)
		}
	}
}

// Stopping the outbox ends a request in flight at once (its connection is closed: fasthttp takes
// no context) rather than after Timeout, and records nothing for it.
func TestStopEndsRequestInFlightOverPoster(t *testing.T) {
	rc := newReceiver(t)
	sent := make(chan struct{}, 1)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	rc.setHandle(func(_ http.ResponseWriter, _ *http.Request, _ request) int {
		sent <- struct{}{}
		<-release // answers only once the test ends: the stop must not wait for it
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL, Timeout: time.Hour})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	<-sent
	h.stop() // would block for Timeout (an hour) if the request were not ended
	if got := h.event(t, e.ID); got.State != store.StatePending || got.Attempts != 0 || got.LastError != "" {
		t.Fatalf("after the stop: %+v", got)
	}
	// The next Run dials again.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.ob.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	<-sent
}

// Once the outbox stops, nothing of the webhook client stays behind: its connections are closed
// and fasthttp's cleaner goroutine (which the package's goleak check ignores, since it sleeps up
// to idleConnFor before it notices) ends by itself.
func TestPosterLeavesNoGoroutineAfterStop(t *testing.T) {
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL})
	h.commit(t, mkEvent("m/a", 1), mkEvent("m/b", 1))
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 2 })
	h.stop()
	// Under the set's lock: Run's context.AfterFunc may still be running its own stop.
	h.ob.fast.conns.mu.Lock()
	n := len(h.ob.fast.conns.open)
	h.ob.fast.conns.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d connections left open after the stop", n)
	}
	eventually(t, "fasthttp's cleaner to end", func() bool {
		buf := make([]byte, 1<<20)
		return !strings.Contains(string(buf[:runtime.Stack(buf, true)]), "connsCleaner")
	})
}

// An https receiver's certificate is verified: one no root vouches for is a network failure (the
// event stays pending), one a trusted root signed is delivered to.
func TestPosterVerifiesTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake is expected
	srv.StartTLS()
	t.Cleanup(srv.Close)

	h := start(t, Config{URL: srv.URL, Backoff: constBackoff(time.Hour)})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "the failed attempt's record", func() bool { return h.event(t, e.ID).Attempts == 1 })
	if got := h.event(t, e.ID); got.State != store.StatePending || !strings.Contains(got.LastError, "certificate") {
		t.Fatalf("an unverified certificate: %+v", got)
	}
	h.stop()

	trusted := start(t, Config{URL: srv.URL})
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	trusted.ob.fast.hc.TLSConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12} // before its first request
	e2 := mkEvent("m/b", 1)
	trusted.commit(t, e2)
	eventually(t, "delivery over TLS", func() bool { return trusted.event(t, e2.ID).State == store.StateDelivered })
}
