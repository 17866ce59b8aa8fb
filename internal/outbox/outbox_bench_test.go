package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// benchDeliver measures draining a backlog of events pending events spread over streams streams
// into a local receiver that answers 204 at once: the outbox's own cost per delivered event (its
// loop, the signed request, and the fsynced record of each delivery) with a receiver that is never
// the bottleneck. One op is one whole backlog; the store lives in b.TempDir().
func benchDeliver(b *testing.B, events, streams int) { benchDeliverWith(b, events, streams, nil) }

// slowEnricher stands for T3: every Enrich call takes delay (a bounded read of the thread on
// a busy machine) and adds a summary.
type slowEnricher struct {
	delay time.Duration
	calls atomic.Int64
}

func (s *slowEnricher) Enrich(ctx context.Context, e store.Event) ([]byte, error) {
	s.calls.Add(1)
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return append(e.Body[:len(e.Body)-1:len(e.Body)-1], `,"summary":"Done: fix the flaky test"}`...), nil
}

func (s *slowEnricher) Partial(e store.Event, _ error) []byte { return e.Body }

// countingReceiver is a local receiver that answers 204 after delay and counts the requests; it
// is closed when b ends.
func countingReceiver(b *testing.B, delay time.Duration) (*httptest.Server, *atomic.Int64) {
	got := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if delay > 0 {
			time.Sleep(delay)
		}
		got.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	b.Cleanup(srv.Close)
	return srv, got
}

// benchDeliverWith is benchDeliver with events committed for enrichment (facts only) when en is
// not nil.
func benchDeliverWith(b *testing.B, events, streams int, en *slowEnricher) {
	srv, got := countingReceiver(b, 0)
	body := []byte(`{"id":"evt","type":"thread.completed","machine":"load-007","thread_id":"thread-1","summary":"Done: fix the flaky test"}`)
	if en != nil {
		body = []byte(`{"id":"evt","type":"thread.completed","machine":"load-007","thread_id":"thread-1"}`)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var busy time.Duration
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		st, err := store.Open(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		var batch []store.Event
		for j := 0; j < events; j++ {
			batch = append(batch, store.Event{ID: "evt_" + strconv.Itoa(j), Stream: "load-007/thread-" + strconv.Itoa(j%streams), Body: body, CreatedAt: time.Now(), Enrich: en != nil})
			if len(batch) == 5000 || j == events-1 {
				if err := st.Commit(store.Batch{Events: batch}); err != nil {
					b.Fatal(err)
				}
				batch = batch[:0]
			}
		}
		cfg := outbox.Config{URL: srv.URL, Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", Logger: quiet}
		if en != nil {
			cfg.Enricher = en
		}
		ob, err := outbox.New(st, cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		start := time.Now()
		b.StartTimer()
		go func() { defer close(done); ob.Run(ctx) }()
		deadline := time.Now().Add(10 * time.Minute)
		for {
			p, _, _, err := st.Counts()
			if err != nil {
				b.Fatal(err)
			}
			if p == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d events still pending after 10 minutes", p)
			}
			time.Sleep(time.Millisecond)
		}
		busy += time.Since(start)
		b.StopTimer()
		cancel()
		<-done
		st.Close()
	}
	b.ReportMetric(float64(events*b.N)/busy.Seconds(), "events/s")
	if got.Load() < int64(events*b.N) {
		b.Fatalf("receiver got %d of %d", got.Load(), events*b.N)
	}
}

// BenchmarkDeliver200in1Stream: a backlog of 200 events of one thread (strictly one after
// another).
func BenchmarkDeliver200in1Stream(b *testing.B) { benchDeliver(b, 200, 1) }

// BenchmarkDeliver1000in1000Streams: one event each of 1,000 threads, delivered with the default
// concurrency (32 in flight); outcomes are recorded in batches.
func BenchmarkDeliver1000in1000Streams(b *testing.B) { benchDeliver(b, 1000, 1000) }

// BenchmarkDeliver20000in2000Streams: a backlog of 10 events each of 2,000 threads (what a
// receiver outage leaves behind).
func BenchmarkDeliver20000in2000Streams(b *testing.B) { benchDeliver(b, 20000, 2000) }

// BenchmarkDeliverEnriched4000in400Streams: a backlog of 10 events each of 400 threads, every
// one committed with its facts only, completed by an enricher that takes 5 ms per event (a read
// of T3): delivery waits on T3 only where nothing could be completed earlier.
func BenchmarkDeliverEnriched4000in400Streams(b *testing.B) {
	benchDeliverWith(b, 4000, 400, &slowEnricher{delay: 5 * time.Millisecond})
}

// BenchmarkDeliverEnriched1000in1000Streams: one event each of 1,000 threads, completed (5 ms
// each) before its delivery.
func BenchmarkDeliverEnriched1000in1000Streams(b *testing.B) {
	benchDeliverWith(b, 1000, 1000, &slowEnricher{delay: 5 * time.Millisecond})
}
