package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// fakeEnricher completes a body by adding "summary"; it fails while fail says so.
type fakeEnricher struct {
	mu       sync.Mutex
	calls    map[string]int
	partials map[string]error
	fail     func(ctx context.Context, calls int) bool
}

var errT3Down = errors.New("T3 machine mac: connection refused")

func (f *fakeEnricher) Enrich(ctx context.Context, e store.Event) ([]byte, error) {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[e.ID]++
	calls := f.calls[e.ID]
	f.mu.Unlock()
	if f.fail != nil && f.fail(ctx, calls) {
		return nil, errT3Down
	}
	var m map[string]any
	_ = json.Unmarshal(e.Body, &m)
	m["summary"] = "done: " + e.ID
	return json.Marshal(m)
}

func (f *fakeEnricher) Partial(e store.Event, cause error) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.partials == nil {
		f.partials = map[string]error{}
	}
	f.partials[e.ID] = cause
	var m map[string]any
	_ = json.Unmarshal(e.Body, &m)
	m["partial"] = map[string]any{"missing": []string{"summary"}, "reason": cause.Error()}
	b, _ := json.Marshal(m)
	return b
}

func (f *fakeEnricher) count(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

func enrichEvent(stream string, n int) store.Event {
	e := mkEvent(stream, n)
	e.Enrich = true
	return e
}

// The body is completed once, before the first attempt, persisted, and every retry sends the
// same bytes without asking the enricher again.
func TestEnrichOnceBeforeFirstAttempt(t *testing.T) {
	rc := newReceiver(t)
	var mu sync.Mutex
	fails := 2
	rc.setHandle(func(http.ResponseWriter, *http.Request, request) int {
		mu.Lock()
		defer mu.Unlock()
		if fails > 0 {
			fails--
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	})
	en := &fakeEnricher{}
	h := start(t, Config{URL: rc.srv.URL, Enricher: en})
	e := enrichEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivery", func() bool { return h.event(t, e.ID).State == store.StateDelivered })
	if n := en.count(e.ID); n != 1 {
		t.Fatalf("Enrich called %d times", n)
	}
	reqs := rc.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests", len(reqs))
	}
	for _, r := range reqs {
		if !strings.Contains(string(r.Body), `"summary":"done: `+e.ID+`"`) || string(r.Body) != string(reqs[0].Body) {
			t.Fatalf("sent %s", r.Body)
		}
	}
	got := h.event(t, e.ID)
	if got.Enrich || string(got.Body) != string(reqs[0].Body) || got.Attempts != 3 {
		t.Fatalf("stored: %+v %s", got, got.Body)
	}
}

// While T3 cannot be read the enricher is retried; those tries are not delivery attempts, and
// other streams are delivered meanwhile.
func TestEnrichFailureRetriedWithoutAttempts(t *testing.T) {
	rc := newReceiver(t)
	gate := make(chan struct{})
	en := &fakeEnricher{fail: func(ctx context.Context, calls int) bool {
		if calls < 3 {
			return true
		}
		select { // the third call waits until the other stream is delivered
		case <-gate:
		case <-ctx.Done():
		}
		return false
	}}
	h := start(t, Config{URL: rc.srv.URL, Enricher: en, Concurrency: 2})
	slow, plain := enrichEvent("m/a", 1), mkEvent("m/b", 1)
	h.commit(t, slow, plain)
	eventually(t, "the other stream delivered", func() bool { return h.event(t, plain.ID).State == store.StateDelivered })
	eventually(t, "the third enrichment", func() bool { return en.count(slow.ID) == 3 })
	if got := h.event(t, slow.ID); got.Attempts != 0 || got.State != store.StatePending || !got.Enrich {
		t.Fatalf("while enriching: %+v", got)
	}
	if n := len(rc.acceptedBy("m/a")); n != 0 {
		t.Fatalf("sent before it was complete: %d", n)
	}
	close(gate)
	eventually(t, "delivery", func() bool { return h.event(t, slow.ID).State == store.StateDelivered })
	if got := h.event(t, slow.ID); got.Attempts != 1 || got.Enrich || !strings.Contains(string(got.Body), "done: ") {
		t.Fatalf("delivered: %+v %s", got, got.Body)
	}
	if v := value(h.m.enrichments.WithLabelValues(enrichRetry)); v != 2 {
		t.Fatalf("enrichment retries = %v", v)
	}
}

// When T3 stays unreadable for EnrichTimeout (counted from the event's queueing, on the
// injected clock), the partial body is delivered and persisted.
func TestEnrichTimeoutSendsPartial(t *testing.T) {
	rc := newReceiver(t)
	en := &fakeEnricher{fail: func(context.Context, int) bool { return true }}
	h := start(t, Config{URL: rc.srv.URL, Enricher: en, EnrichTimeout: time.Minute, Backoff: constBackoff(time.Hour)})
	e := enrichEvent("m/a", 1)
	h.commit(t, e)
	// Its failure judged (a retry counted) before the clock moves: judged after, the first
	// failure would already be past the deadline and go out partial without a second try.
	eventually(t, "first enrichment judged", func() bool { return value(h.m.enrichments.WithLabelValues(enrichRetry)) == 1 })
	h.ob.Notify()
	if got := h.event(t, e.ID); got.State != store.StatePending || got.Attempts != 0 {
		t.Fatalf("before the timeout: %+v", got)
	}
	h.clock.Add(time.Minute) // the retry is due at the deadline (not after the hour of backoff)
	h.ob.Notify()
	eventually(t, "delivery", func() bool { return h.event(t, e.ID).State == store.StateDelivered })
	if n := en.count(e.ID); n != 2 {
		t.Fatalf("Enrich called %d times", n)
	}
	en.mu.Lock()
	cause := en.partials[e.ID]
	en.mu.Unlock()
	if !errors.Is(cause, errT3Down) {
		t.Fatalf("Partial cause = %v", cause)
	}
	got := h.event(t, e.ID)
	sent := rc.requests()[0].Body
	if !strings.Contains(string(sent), `"missing":["summary"]`) || string(got.Body) != string(sent) || got.Enrich {
		t.Fatalf("sent %s, stored %s", sent, got.Body)
	}
	if v := value(h.m.enrichments.WithLabelValues(enrichPartial)); v != 1 {
		t.Fatalf("partial count = %v", v)
	}
}

// Without an Enricher an event is delivered as stored.
func TestNoEnricherDeliversAsStored(t *testing.T) {
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL})
	e := enrichEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivery", func() bool { return h.event(t, e.ID).State == store.StateDelivered })
	if got := rc.requests()[0].Body; string(got) != string(e.Body) {
		t.Fatalf("sent %s", got)
	}
}

// A shutdown that cancels the first attempt keeps the completed body (the receiver may have seen
// it; the next attempt must send the same bytes) without counting an attempt.
func TestShutdownKeepsEnrichedBody(t *testing.T) {
	rc := newReceiver(t)
	sent := make(chan struct{}, 1)
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, _ request) int {
		sent <- struct{}{}
		<-r.Context().Done()
		return http.StatusOK
	})
	en := &fakeEnricher{}
	h := start(t, Config{URL: rc.srv.URL, Enricher: en})
	e := enrichEvent("m/a", 1)
	h.commit(t, e)
	<-sent
	h.stop()
	got := h.event(t, e.ID)
	if got.State != store.StatePending || got.Attempts != 0 || got.Enrich || string(got.Body) != string(rc.requests()[0].Body) {
		t.Fatalf("after shutdown: %+v %s", got, got.Body)
	}
}

// While a stream's head is being delivered, the events behind it are completed (ahead of
// delivery): when they become the head they go out without another Enrich call, each completed
// once, in order, and the stored body is the one sent.
func TestEnrichAheadWhileHeadIsDelivered(t *testing.T) {
	rc := newReceiver(t)
	first, release := holdFirst(rc)
	en := &fakeEnricher{}
	h := start(t, Config{URL: rc.srv.URL, Enricher: en})
	evs := []store.Event{enrichEvent("m/a", 1), enrichEvent("m/a", 2), enrichEvent("m/a", 3)}
	h.commit(t, evs...)
	<-first
	// The head's request is held by the receiver; its successors are completed meanwhile.
	eventually(t, "the events behind the head completed", func() bool { return en.count(evs[1].ID) == 1 && en.count(evs[2].ID) == 1 })
	if n := len(rc.requests()); n != 1 {
		t.Fatalf("%d requests while the head was held", n)
	}
	close(release)
	eventually(t, "delivery", func() bool { return h.event(t, evs[2].ID).State == store.StateDelivered })
	if got := rc.acceptedBy("m/a"); !reflect.DeepEqual(got, []int{1, 2, 3}) {
		t.Fatalf("accepted %v", got)
	}
	for i, e := range evs {
		if n := en.count(e.ID); n != 1 {
			t.Fatalf("event %d: Enrich called %d times", i+1, n)
		}
		got, sent := h.event(t, e.ID), rc.requests()[i]
		if got.Enrich || string(got.Body) != string(sent.Body) || !strings.Contains(string(sent.Body), `"summary":"done: `+e.ID+`"`) {
			t.Fatalf("event %d: stored %s (enrich %v), sent %s", i+1, got.Body, got.Enrich, sent.Body)
		}
	}
}

// A delivery slot is never held while T3 is read: with one delivery slot and one enrichment
// slot, a thread whose event waits for its details does not hold back another thread's complete
// event.
func TestEnrichmentHoldsNoDeliverySlot(t *testing.T) {
	rc := newReceiver(t)
	gate := make(chan struct{})
	en := &fakeEnricher{fail: func(ctx context.Context, _ int) bool {
		select { // T3 answers only once the other thread's event is delivered
		case <-gate:
		case <-ctx.Done():
		}
		return false
	}}
	h := start(t, Config{URL: rc.srv.URL, Enricher: en, Concurrency: 1, EnrichConcurrency: 1})
	slow := enrichEvent("m/a", 1)
	h.commit(t, slow)
	eventually(t, "the enrichment started", func() bool { return en.count(slow.ID) == 1 })
	plain := mkEvent("m/b", 1)
	h.commit(t, plain)
	eventually(t, "the other thread delivered", func() bool { return h.event(t, plain.ID).State == store.StateDelivered })
	close(gate)
	eventually(t, "the completed event delivered", func() bool { return h.event(t, slow.ID).State == store.StateDelivered })
	if got := h.event(t, slow.ID); !strings.Contains(string(got.Body), "done: ") || got.Attempts != 1 {
		t.Fatalf("delivered: %+v %s", got, got.Body)
	}
}

// An event that cannot be completed ahead of delivery (T3 failed once) is completed again when
// it is the head, with the head's retries: nothing partial, nothing sent incomplete.
func TestEnrichAheadFailureLeftToHead(t *testing.T) {
	rc := newReceiver(t)
	first, release := holdFirst(rc)
	second := enrichEvent("m/a", 2)
	en := &fakeEnricher{}
	en.fail = func(_ context.Context, calls int) bool { return calls == 1 && en.count(second.ID) == 1 }
	h := start(t, Config{URL: rc.srv.URL, Enricher: en})
	head := enrichEvent("m/a", 1)
	h.commit(t, head, second)
	<-first
	eventually(t, "the failed try ahead", func() bool { return en.count(second.ID) == 1 })
	if v := value(h.m.enrichments.WithLabelValues(enrichRetry)); v != 1 {
		t.Fatalf("retries = %v", v)
	}
	close(release)
	eventually(t, "delivery", func() bool { return h.event(t, second.ID).State == store.StateDelivered })
	if n := en.count(second.ID); n != 2 {
		t.Fatalf("Enrich called %d times", n)
	}
	got := h.event(t, second.ID)
	if !strings.Contains(string(got.Body), `"summary":"done: `+second.ID+`"`) || strings.Contains(string(got.Body), "partial") || got.Attempts != 1 {
		t.Fatalf("delivered: %+v %s", got, got.Body)
	}
	if v := value(h.m.enrichments.WithLabelValues(enrichPartial)); v != 0 {
		t.Fatalf("partial = %v", v)
	}
}

// holdFirst makes rc hold every event number 1 until release is closed; first says when one
// arrived.
func holdFirst(rc *receiver) (first chan struct{}, release chan struct{}) {
	release = make(chan struct{})
	first = make(chan struct{}, 1)
	rc.setHandle(func(_ http.ResponseWriter, _ *http.Request, req request) int {
		if req.N == 1 {
			first <- struct{}{}
			<-release
		}
		return http.StatusNoContent
	})
	return first, release
}
