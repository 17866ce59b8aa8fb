package outbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/cenkalti/backoff/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// fasthttpCleaner is the webhook client's housekeeping goroutine (post.go): it closes idle
// connections and ends by itself within idleConnFor of the last one closing, which the outbox
// does when Run returns; goleak's retries wait less than that.
const fasthttpCleaner = "github.com/valyala/fasthttp.(*HostClient).connsCleaner"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(fasthttpCleaner)) }

// ---- test doubles ----

var t0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// fakeClock is the outbox's notion of now; tests move it by hand instead of sleeping.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// constBackoff retries after a fixed delay. The test clock only moves when a test moves it, so a
// retry is due at once only with a zero delay (the default in these tests); tests of scheduled
// retries use a long delay and move the clock.
type constBackoff time.Duration

func (b constBackoff) NewBackOff() backoff.BackOff {
	return backoff.NewConstantBackOff(time.Duration(b))
}

// request is what the receiver saw.
type request struct {
	ID     string
	Stream string
	N      int
	Header http.Header
	Body   []byte
}

type body struct {
	Stream string `json:"stream"`
	N      int    `json:"n"`
}

// receiver is a real HTTP endpoint on 127.0.0.1 whose behaviour a test swaps at will.
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []request
	// handle decides the answer; nil answers 204. It runs before the request is recorded as
	// accepted, and only 2xx answers are recorded in accepted.
	handle   func(w http.ResponseWriter, r *http.Request, req request) int
	accepted []request
}

func newReceiver(t *testing.T) *receiver {
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(rc.serve))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var bd body
	_ = json.Unmarshal(b, &bd)
	req := request{ID: r.Header.Get("webhook-id"), Stream: bd.Stream, N: bd.N, Header: r.Header.Clone(), Body: b}
	rc.mu.Lock()
	rc.got = append(rc.got, req)
	h := rc.handle
	rc.mu.Unlock()
	status := http.StatusNoContent
	if h != nil {
		status = h(w, r, req)
	}
	if status == 0 {
		return // the handler wrote the response
	}
	w.WriteHeader(status)
	if status/100 == 2 {
		rc.mu.Lock()
		rc.accepted = append(rc.accepted, req)
		rc.mu.Unlock()
	}
}

func (rc *receiver) setHandle(h func(w http.ResponseWriter, r *http.Request, req request) int) {
	rc.mu.Lock()
	rc.handle = h
	rc.mu.Unlock()
}

func (rc *receiver) requests() []request {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]request(nil), rc.got...)
}

func (rc *receiver) acceptedBy(stream string) []int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var ns []int
	for _, r := range rc.accepted {
		if r.Stream == stream {
			ns = append(ns, r.N)
		}
	}
	return ns
}

// harness is a store, an outbox over it and its running loop.
type harness struct {
	st    store.Store
	ob    *Outbox
	clock *fakeClock
	m     *Metrics
	logs  *syncBuffer
	stop  func()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func start(t *testing.T, cfg Config) *harness {
	t.Helper()
	return startOn(t, t.TempDir(), cfg, nil)
}

// startOn runs an outbox over the store in dir, through wrap's Queue when wrap is not nil.
func startOn(t *testing.T, dir string, cfg Config, wrap func(store.Store) Queue) *harness {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{st: st, clock: &fakeClock{t: t0}, logs: &syncBuffer{}}
	if cfg.Clock == nil {
		cfg.Clock = h.clock.Now
	}
	if cfg.Backoff == nil {
		cfg.Backoff = constBackoff(0)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.Metrics == nil {
		cfg.Metrics, err = NewMetrics(prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
	}
	h.m = cfg.Metrics
	var q Queue = st
	if wrap != nil {
		q = wrap(st)
	}
	h.ob, err = New(q, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.ob.Run(ctx); close(done) }()
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(func() { h.stop(); st.Close() })
	return h
}

func mkEvent(stream string, n int) store.Event {
	b, _ := json.Marshal(body{Stream: stream, N: n})
	return store.Event{ID: fmt.Sprintf("evt_%s_%03d", strings.ReplaceAll(stream, "/", "_"), n), Stream: stream, Body: b, CreatedAt: t0}
}

func (h *harness) commit(t *testing.T, evs ...store.Event) {
	t.Helper()
	if err := h.st.Commit(store.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	h.ob.Notify()
}

func (h *harness) event(t *testing.T, id string) store.Event {
	t.Helper()
	e, err := h.st.Get(id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// eventually polls cond; the bound is generous because it only matters when the test is broken.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventuallyWithin(t, time.Minute, what, cond) // generous: only a broken test waits it out
}

func eventuallyWithin(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (h *harness) counts() (p, d, dl int) {
	p, d, dl, _ = h.st.Counts()
	return
}

func value(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	var m dto.Metric
	_ = (<-ch).Write(&m)
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return -1
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

// ---- an independent Standard Webhooks verifier, written from the spec ----

// verify checks a request the way a receiver following the Standard Webhooks spec does: the
// signed content is "<webhook-id>.<webhook-timestamp>.<body>", HMAC-SHA256 keyed with the
// base64-decoded part of the secret after "whsec_", base64-encoded, in a space-separated list of
// "v1,<signature>" entries; the timestamp must be within 5 minutes of now.
func verify(secret string, hdr http.Header, payload []byte, now time.Time) error {
	id, ts, sigs := hdr.Get("webhook-id"), hdr.Get("webhook-timestamp"), hdr.Get("webhook-signature")
	if id == "" || ts == "" || sigs == "" {
		return errors.New("missing webhook headers")
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return errors.New("bad timestamp")
	}
	if d := now.Sub(time.Unix(sec, 0)); d > 5*time.Minute || d < -5*time.Minute {
		return errors.New("timestamp out of tolerance")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return err
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "." + string(payload)))
	want := mac.Sum(nil)
	for _, s := range strings.Fields(sigs) {
		ver, sig, ok := strings.Cut(s, ",")
		if !ok || ver != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(sig)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return errors.New("no matching signature")
}

const testSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

func TestSignKnownVector(t *testing.T) {
	// The example from the Standard Webhooks specification.
	key, err := DecodeSecret(testSecret)
	if err != nil {
		t.Fatal(err)
	}
	got := Sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("Sign = %s, want %s", got, want)
	}
	// The worked example in docs/events.md.
	body := `{"id":"evt_3f1c9a0e5b7d2c4a6e8f0b1d","type":"thread.completed","occurred_at":"2026-11-29T08:52:43Z","machine":"mac","project":{"id":"project-006c84f3","title":"api"},"thread_id":"thread-edec8901","run_id":"run:thread:thread-edec8901:ordinal:1","title":"Fix the flaky test","summary":"Each test case now gets its own temp dir; go test ./... passes."}`
	got = Sign(key, "evt_3f1c9a0e5b7d2c4a6e8f0b1d", 1795942365, []byte(body))
	if want := "v1,xWCTvvQbQeshbEfR+Q/pXpM7Yy8txkEQLF39Xiuxlb0="; got != want {
		t.Fatalf("Sign(docs example) = %s, want %s", got, want)
	}
}

// ---- delivery ----

func TestDeliverySignedWithBearer(t *testing.T) {
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL + "/hook", Token: "hook-token-1", Secret: testSecret})
	var verr []error
	var mu sync.Mutex
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, req request) int {
		mu.Lock()
		defer mu.Unlock()
		if err := verify(testSecret, r.Header, req.Body, h.clock.Now()); err != nil {
			verr = append(verr, err)
			return http.StatusUnauthorized
		}
		if r.Header.Get("Authorization") != "Bearer hook-token-1" {
			verr = append(verr, errors.New("bearer: "+r.Header.Get("Authorization")))
			return http.StatusUnauthorized
		}
		if r.Method != http.MethodPost || r.URL.Path != "/hook" || r.Header.Get("Content-Type") != "application/json" {
			verr = append(verr, fmt.Errorf("request %s %s %s", r.Method, r.URL.Path, r.Header.Get("Content-Type")))
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	e := mkEvent("mac/t1", 1)
	h.commit(t, e)
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 1 })

	mu.Lock()
	defer mu.Unlock()
	if len(verr) > 0 {
		t.Fatal(verr)
	}
	got := rc.requests()
	if len(got) != 1 {
		t.Fatalf("requests = %d", len(got))
	}
	r := got[0]
	if r.ID != e.ID || !bytes.Equal(r.Body, e.Body) || r.Header.Get("webhook-timestamp") != strconv.FormatInt(t0.Unix(), 10) {
		t.Fatalf("request = %+v", r)
	}
	// A tampered body fails the independent verifier, so it really checks something.
	if verify(testSecret, r.Header, append(r.Body, ' '), t0) == nil {
		t.Fatal("verifier accepted a tampered body")
	}
	ev := h.event(t, e.ID)
	if ev.State != store.StateDelivered || ev.Attempts != 1 || !ev.DeliveredAt.Equal(t0) {
		t.Fatalf("event = %+v", ev)
	}
	if v := value(h.m.deliveries.WithLabelValues(outcomeDelivered)); v != 1 {
		t.Fatalf("delivered counter = %v", v)
	}
	if v := value(h.m.lag); v != 1 {
		t.Fatalf("lag observations = %v", v)
	}
}

func TestUnsignedWithoutSecret(t *testing.T) {
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL})
	h.commit(t, mkEvent("m/a", 1))
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 1 })
	hdr := rc.requests()[0].Header
	if hdr.Get("webhook-signature") != "" || hdr.Get("Authorization") != "" || hdr.Get("webhook-id") == "" {
		t.Fatalf("headers = %v", hdr)
	}
}

func TestReceiverDownThenUp(t *testing.T) {
	// Reserve a port, then free it: connections are refused until the receiver starts on it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	h := start(t, Config{URL: "http://" + addr + "/hook", Concurrency: 2})
	streams := []string{"m/a", "m/b", "m/c"}
	var evs []store.Event
	for n := 1; n <= 5; n++ {
		for _, s := range streams {
			evs = append(evs, mkEvent(s, n))
		}
	}
	h.commit(t, evs...)
	eventually(t, "network retries", func() bool { return value(h.m.retries.WithLabelValues(causeNetwork)) >= 6 })
	if e := h.event(t, evs[0].ID); !strings.HasPrefix(e.LastError, "network: ") || e.State != store.StatePending {
		t.Fatalf("while down: %+v", e)
	}
	if v := value(h.m.deliveries.WithLabelValues(outcomeNetwork)); v < 6 {
		t.Fatalf("network_error deliveries = %v", v)
	}

	rc := &receiver{}
	var l2 net.Listener
	eventually(t, "re-listening on "+addr, func() bool {
		l2, err = net.Listen("tcp", addr)
		return err == nil
	})
	rc.srv = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	rc.srv.Listener.Close()
	rc.srv.Listener = l2
	rc.srv.Start()
	t.Cleanup(rc.srv.Close)

	eventually(t, "everything delivered", func() bool { p, d, dl := h.counts(); return p == 0 && d == 0 && dl == len(evs) })
	for _, s := range streams {
		if got := rc.acceptedBy(s); !reflect.DeepEqual(got, seq(5)) {
			t.Fatalf("stream %s arrived as %v", s, got)
		}
	}
	if v := value(h.m.deliveries.WithLabelValues(outcomeReceiver)); v != 0 {
		t.Fatalf("receiver errors counted for a network outage: %v", v)
	}
}

func TestServerErrorsThenSuccess(t *testing.T) {
	rc := newReceiver(t)
	var mu sync.Mutex
	fails := 3
	rc.setHandle(func(w http.ResponseWriter, _ *http.Request, _ request) int {
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, "database\nunavailable\x00")
			return 0
		}
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL})
	h.commit(t, mkEvent("m/a", 1), mkEvent("m/a", 2))
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 2 })
	e := h.event(t, mkEvent("m/a", 1).ID)
	if e.Attempts != 4 || e.LastError != "receiver: HTTP 500 Internal Server Error: database unavailable" {
		t.Fatalf("event = %+v", e)
	}
	if got := rc.acceptedBy("m/a"); !reflect.DeepEqual(got, []int{1, 2}) {
		t.Fatalf("order = %v", got)
	}
	// Event 2 was never sent while event 1 was failing.
	for _, r := range rc.requests()[:4] {
		if r.N != 1 {
			t.Fatalf("event %d sent before event 1 was delivered", r.N)
		}
	}
	if v := value(h.m.retries.WithLabelValues(causeReceiver)); v != 3 {
		t.Fatalf("receiver retries = %v", v)
	}
	if v := value(h.m.deliveries.WithLabelValues(outcomeReceiver)); v != 3 {
		t.Fatalf("receiver_error deliveries = %v", v)
	}
	if v := value(h.m.retries.WithLabelValues(causeNetwork)); v != 0 {
		t.Fatalf("network retries = %v", v)
	}
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	rc := newReceiver(t)
	var mu sync.Mutex
	answered := 0
	rc.setHandle(func(w http.ResponseWriter, _ *http.Request, _ request) int {
		mu.Lock()
		defer mu.Unlock()
		answered++
		switch answered {
		case 1:
			w.Header().Set("Retry-After", "120")
			return http.StatusTooManyRequests
		case 2:
			w.Header().Set("Retry-After", t0.Add(time.Hour).UTC().Format(http.TimeFormat))
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	// A huge backoff: only Retry-After can explain the times below.
	h := start(t, Config{URL: rc.srv.URL, Backoff: constBackoff(1000 * time.Hour)})
	e := mkEvent("m/a", 1)
	h.commit(t, e)

	eventually(t, "first attempt", func() bool { return h.event(t, e.ID).Attempts == 1 })
	got := h.event(t, e.ID)
	if want := t0.Add(120 * time.Second); !got.NextAttempt.Equal(want) || !strings.HasPrefix(got.LastError, "receiver: HTTP 429") {
		t.Fatalf("after 429: next %v (want %v), error %q", got.NextAttempt, want, got.LastError)
	}
	h.ob.Notify() // not yet due: nothing may be sent
	h.clock.Add(119 * time.Second)
	h.ob.Notify()
	h.clock.Add(time.Second)
	h.ob.Notify()
	eventually(t, "second attempt", func() bool { return h.event(t, e.ID).Attempts == 2 })
	got = h.event(t, e.ID)
	if want := t0.Add(time.Hour); !got.NextAttempt.Equal(want) {
		t.Fatalf("after 503 with a date: next %v, want %v", got.NextAttempt, want)
	}
	h.clock.Add(time.Hour)
	h.ob.Notify()
	eventually(t, "delivery", func() bool { return h.event(t, e.ID).State == store.StateDelivered })
	if n := len(rc.requests()); n != 3 {
		t.Fatalf("requests = %d, want 3 (none before Retry-After)", n)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := t0
	cases := []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 30 ", 30 * time.Second, true},
		{"-5", 0, false},
		{"soon", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true}, // a date in the past: now
		{"99999999999999", 365 * 24 * time.Hour, true},         // clamped
	}
	for _, tc := range cases {
		got, ok := parseRetryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("parseRetryAfter(%q) = %v %v, want %v %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

func TestBadRequestIsDeadAtOnce(t *testing.T) {
	rc := newReceiver(t)
	rc.setHandle(func(w http.ResponseWriter, _ *http.Request, req request) int {
		if req.N == 1 {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":"bad payload"}`)
			return 0
		}
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL})
	e1, e2 := mkEvent("m/a", 1), mkEvent("m/a", 2)
	h.commit(t, e1, e2)
	eventually(t, "e2 delivered", func() bool { return h.event(t, e2.ID).State == store.StateDelivered })
	d := h.event(t, e1.ID)
	if d.State != store.StateDead || d.Attempts != 1 || d.LastError != `receiver: HTTP 400 Bad Request: {"error":"bad payload"}` {
		t.Fatalf("e1 = %+v", d)
	}
	if r := rc.requests(); len(r) != 2 || r[0].N != 1 || r[1].N != 2 {
		t.Fatalf("requests = %+v", r)
	}
	if v := value(h.m.deadLetters.WithLabelValues(reasonRejected)); v != 1 {
		t.Fatalf("rejected dead letters = %v", v)
	}
	eventually(t, "dead gauge", func() bool { return value(h.m.dead) == 1 })
}

func TestRedirectIsNotFollowed(t *testing.T) {
	other := newReceiver(t)
	rc := newReceiver(t)
	rc.setHandle(func(w http.ResponseWriter, _ *http.Request, _ request) int {
		w.Header().Set("Location", other.srv.URL)
		return http.StatusFound
	})
	h := start(t, Config{URL: rc.srv.URL})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "dead letter", func() bool { return h.event(t, e.ID).State == store.StateDead })
	if got := h.event(t, e.ID).LastError; !strings.Contains(got, "HTTP 302") || !strings.Contains(got, "redirects are not followed") {
		t.Fatalf("LastError = %q", got)
	}
	if n := len(other.requests()); n != 0 {
		t.Fatalf("redirect target got %d requests", n)
	}
}

func TestSlowStreamDoesNotDelayOthers(t *testing.T) {
	rc := newReceiver(t)
	release := make(chan struct{})
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, req request) int {
		if req.Stream == "m/slow" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL, Concurrency: 2})
	var evs []store.Event
	for n := 1; n <= 3; n++ {
		evs = append(evs, mkEvent("m/slow", n), mkEvent("m/fast", n))
	}
	h.commit(t, evs...)
	eventually(t, "fast stream delivered", func() bool { return len(rc.acceptedBy("m/fast")) == 3 })
	// The slow stream is still stuck on its first event, and nothing else of it was sent.
	slowSent := 0
	for _, r := range rc.requests() {
		if r.Stream == "m/slow" {
			slowSent++
		}
	}
	if slowSent != 1 {
		t.Fatalf("slow stream requests while blocked = %d, want 1", slowSent)
	}
	close(release)
	eventually(t, "slow stream delivered", func() bool { return len(rc.acceptedBy("m/slow")) == 3 })
	if got := rc.acceptedBy("m/slow"); !reflect.DeepEqual(got, seq(3)) {
		t.Fatalf("slow order = %v", got)
	}
}

func TestWorkersBounded(t *testing.T) {
	rc := newReceiver(t)
	var mu sync.Mutex
	cur, peak := 0, 0
	gate := make(chan struct{})
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, _ request) int {
		mu.Lock()
		cur++
		peak = max(peak, cur)
		mu.Unlock()
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		mu.Lock()
		cur--
		mu.Unlock()
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL, Concurrency: 2})
	var evs []store.Event
	for i := range 6 {
		evs = append(evs, mkEvent(fmt.Sprintf("m/s%d", i), 1))
	}
	h.commit(t, evs...)
	eventually(t, "two requests in flight", func() bool { mu.Lock(); defer mu.Unlock(); return cur == 2 })
	close(gate)
	eventually(t, "all delivered", func() bool { _, _, dl := h.counts(); return dl == 6 })
	mu.Lock()
	defer mu.Unlock()
	if peak != 2 {
		t.Fatalf("peak concurrent requests = %d, want 2", peak)
	}
}

func TestMaxAgeDead(t *testing.T) {
	rc := newReceiver(t)
	rc.setHandle(func(http.ResponseWriter, *http.Request, request) int { return http.StatusBadGateway })
	h := start(t, Config{URL: rc.srv.URL, MaxAge: time.Hour, Backoff: constBackoff(10 * time.Minute)})

	// Queued 59 minutes ago: the first failure schedules one last try at the deadline, not later.
	h.clock.Add(59 * time.Minute)
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "first attempt", func() bool { return h.event(t, e.ID).Attempts == 1 })
	if got := h.event(t, e.ID); !got.NextAttempt.Equal(t0.Add(time.Hour)) || got.State != store.StatePending {
		t.Fatalf("after first failure: %+v", got)
	}
	h.clock.Add(time.Minute)
	h.ob.Notify()
	eventually(t, "dead letter", func() bool { return h.event(t, e.ID).State == store.StateDead })
	got := h.event(t, e.ID)
	if got.Attempts != 2 || !strings.HasPrefix(got.LastError, "expired: not delivered within 1h0m0s (2 attempts); last error: receiver: HTTP 502") {
		t.Fatalf("dead: %+v", got)
	}
	if v := value(h.m.deadLetters.WithLabelValues(reasonExpired)); v != 1 {
		t.Fatalf("expired dead letters = %v", v)
	}

	// An event already past MaxAge still gets one attempt (a late delivery beats none).
	late := mkEvent("m/b", 1)
	h.commit(t, late)
	eventually(t, "late event dead", func() bool { return h.event(t, late.ID).State == store.StateDead })
	if got := h.event(t, late.ID); got.Attempts != 1 {
		t.Fatalf("late: %+v", got)
	}
}

// Dead letters requeued in the store — what `t3code-mcp dead-letters retry` does while the
// connector is stopped — are delivered when the outbox starts again; the others stay dead.
func TestRequeuedDeadLettersDeliveredAfterRestart(t *testing.T) {
	rc := newReceiver(t)
	var mu sync.Mutex
	reject := true
	rc.setHandle(func(http.ResponseWriter, *http.Request, request) int {
		mu.Lock()
		defer mu.Unlock()
		if reject {
			return http.StatusUnprocessableEntity
		}
		return http.StatusOK
	})
	dir := t.TempDir()
	clock := &fakeClock{t: t0}
	cfg := Config{URL: rc.srv.URL, Clock: clock.Now}
	h := startOn(t, dir, cfg, nil)
	a, b := mkEvent("m/a", 1), mkEvent("m/b", 1)
	h.commit(t, a, b)
	eventually(t, "dead letters", func() bool { _, d, _ := h.counts(); return d == 2 })
	h.stop()

	mu.Lock()
	reject = false
	mu.Unlock()
	clock.Add(48 * time.Hour) // long after MaxAge: a requeue gets a fresh window
	if n, err := h.st.Requeue(clock.Now(), a.ID); err != nil || n != 1 {
		t.Fatalf("Requeue = %d %v", n, err)
	}
	if _, err := h.st.Requeue(clock.Now(), "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("unknown id: %v", err)
	}
	h.st.Close()
	h = startOn(t, dir, cfg, nil)
	eventually(t, "a delivered", func() bool { return h.event(t, a.ID).State == store.StateDelivered })
	if got := h.event(t, b.ID); got.State != store.StateDead {
		t.Fatalf("b = %+v", got)
	}
	h.stop()

	if n, err := h.st.Requeue(clock.Now()); err != nil || n != 1 {
		t.Fatalf("Requeue(all) = %d %v", n, err)
	}
	h.st.Close()
	h = startOn(t, dir, cfg, nil)
	eventually(t, "b delivered", func() bool { return h.event(t, b.ID).State == store.StateDelivered })
}

func TestTimeoutIsNetworkError(t *testing.T) {
	rc := newReceiver(t)
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, _ request) int {
		<-r.Context().Done() // never answers in time
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL, Timeout: 20 * time.Millisecond, Backoff: constBackoff(time.Hour)})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "timed-out attempt", func() bool { return h.event(t, e.ID).Attempts == 1 })
	if got := h.event(t, e.ID).LastError; got != "network: no response within 20ms" {
		t.Fatalf("LastError = %q", got)
	}
	if v := value(h.m.retries.WithLabelValues(causeNetwork)); v != 1 {
		t.Fatalf("network retries = %v", v)
	}
}

func TestSecretsNeverLeak(t *testing.T) {
	const token = "tok-SUPERSECRET-42"
	rc := newReceiver(t)
	// A receiver that echoes the request's credentials in its error page.
	rc.setHandle(func(w http.ResponseWriter, r *http.Request, _ request) int {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(w, "auth=%s secret=%s", r.Header.Get("Authorization"), testSecret)
		return 0
	})
	h := start(t, Config{URL: rc.srv.URL, Token: token, Secret: testSecret, Backoff: constBackoff(time.Hour)})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "attempt", func() bool { return h.event(t, e.ID).Attempts == 1 })

	// And a network failure against a URL with a credential in its query.
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	h2 := start(t, Config{URL: "http://" + addr + "/hook?key=QUERYSECRET", Token: token, Backoff: constBackoff(time.Hour)})
	h2.commit(t, e)
	eventually(t, "network attempt", func() bool { return h2.event(t, e.ID).Attempts == 1 })

	h.stop()
	h2.stop()
	secretB64 := strings.TrimPrefix(testSecret, "whsec_")
	for _, s := range []string{h.event(t, e.ID).LastError, h.logs.String(), h2.event(t, e.ID).LastError, h2.logs.String()} {
		for _, leak := range []string{token, secretB64, "QUERYSECRET"} {
			if strings.Contains(s, leak) {
				t.Fatalf("%q leaked into %q", leak, s)
			}
		}
	}
	if got := h.event(t, e.ID).LastError; !strings.Contains(got, "auth=Bearer [redacted] secret=[redacted]") {
		t.Fatalf("LastError = %q", got)
	}
}

func TestShutdownLeavesInFlightPending(t *testing.T) {
	rc := newReceiver(t)
	sent := make(chan struct{}, 1)
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, _ request) int {
		sent <- struct{}{}
		<-r.Context().Done()
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL})
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	<-sent
	h.stop() // returns only after the worker is gone (goleak checks the rest)
	got := h.event(t, e.ID)
	if got.State != store.StatePending || got.Attempts != 0 || got.LastError != "" {
		t.Fatalf("after shutdown: %+v", got)
	}
}

func TestPrunesDeliveredEvents(t *testing.T) {
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL, Retention: time.Hour})
	h.commit(t, mkEvent("m/a", 1), mkEvent("m/a", 2))
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 2 })
	h.clock.Add(time.Hour + DefaultPruneEvery)
	h.ob.Notify()
	eventually(t, "prune", func() bool { _, _, dl := h.counts(); return dl == 0 })
}

// PruneEvery (T3CODE_MCP_PRUNE_INTERVAL) sets how often the delivered events
// past Retention are deleted: a short retention with a short interval keeps
// the file small (the soak in docs/benchmarks.md runs with one minute).
func TestPruneEveryIsConfigurable(t *testing.T) {
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL, Retention: time.Minute, PruneEvery: time.Minute})
	h.commit(t, mkEvent("m/a", 1), mkEvent("m/a", 2))
	eventually(t, "delivery", func() bool { _, _, dl := h.counts(); return dl == 2 })
	h.clock.Add(2*time.Minute + time.Second) // far short of DefaultPruneEvery after the first prune
	h.ob.Notify()
	eventually(t, "prune", func() bool { _, _, dl := h.counts(); return dl == 0 })
}

func TestNewValidation(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cases := []struct {
		cfg  Config
		want string
	}{
		{Config{}, "T3CODE_MCP_HOOK_URL"},
		{Config{URL: "ftp://x?key=LEAK"}, "T3CODE_MCP_HOOK_URL"},
		{Config{URL: "http://x", Secret: "whsec_not*base64LEAK"}, "T3CODE_MCP_HOOK_SECRET is not a Standard Webhooks secret"},
		{Config{URL: "http://x", Secret: "whsec_" + base64.StdEncoding.EncodeToString([]byte("shortLEAK"))}, "decodes to 9 bytes"},
	}
	for _, tc := range cases {
		_, err := New(st, tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "LEAK") {
			t.Errorf("New(%+v) = %v", tc.cfg, err)
		}
	}
	// A secret without the whsec_ prefix is accepted too.
	if _, err := New(st, Config{URL: "https://x", Secret: strings.TrimPrefix(testSecret, "whsec_")}); err != nil {
		t.Fatal(err)
	}
}

func TestMetricsRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := NewMetrics(reg); err == nil {
		t.Fatal("registering twice must fail")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	series := map[string]int{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		series[mf.GetName()] = len(mf.GetMetric())
	}
	for _, n := range []string{"t3code_mcp_outbox_pending", "t3code_mcp_outbox_dead", "t3code_mcp_outbox_deliveries_total", "t3code_mcp_outbox_retries_total", "t3code_mcp_outbox_dead_letters_total", "t3code_mcp_outbox_event_lag_seconds", "t3code_mcp_outbox_enrichments_total", "t3code_mcp_outbox_record_batch_events"} {
		if !names[n] {
			t.Errorf("metric %s not registered", n)
		}
	}
	// Every labelled series exists before anything happened (zeros, not gaps).
	for n, want := range map[string]int{"t3code_mcp_outbox_deliveries_total": 3, "t3code_mcp_outbox_retries_total": 2, "t3code_mcp_outbox_dead_letters_total": 2, "t3code_mcp_outbox_enrichments_total": 3} {
		if series[n] != want {
			t.Errorf("metric %s has %d series before any event, want %d", n, series[n], want)
		}
	}
}

func TestExponentialBackoff(t *testing.T) {
	p := ExponentialBackoff{Base: time.Second, Cap: 5 * time.Minute}
	for range 20 {
		bo := p.NewBackOff()
		for attempt := 1; attempt <= 100; attempt++ {
			ceil := 5 * time.Minute
			if attempt <= 9 {
				ceil = time.Second << (attempt - 1)
			}
			if d := bo.NextBackOff(); d < 0 || d > ceil {
				t.Fatalf("retry %d: %v, want within [0, %v]", attempt, d, ceil)
			}
		}
	}
	// Full jitter: not always the same value, and spread over the whole range.
	seen := map[time.Duration]bool{}
	low, high := 0, 0
	for range 200 {
		bo := advanced(p, 20) // at the cap
		d := bo.NextBackOff()
		seen[d] = true
		if d < time.Minute {
			low++
		}
		if d > 4*time.Minute {
			high++
		}
	}
	if len(seen) < 2 || low == 0 || high == 0 {
		t.Fatalf("no full jitter at the cap: %d values, %d below 1m, %d above 4m", len(seen), low, high)
	}
	if d := (ExponentialBackoff{}).NewBackOff().NextBackOff(); d != 0 {
		t.Fatalf("zero backoff = %v", d)
	}
}
