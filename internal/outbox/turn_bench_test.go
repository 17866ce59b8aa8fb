package outbox

import (
	"context"
	"io"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// benchTurn measures the delivery loop's own work per event with pending events waiting over
// pending/10 streams: take new commits in (scan), wake due streams, pick the next ready stream,
// read its head with the body (what the worker reads), and take the outcome back (the stream
// moves on to its next event). The HTTP request and the fsynced record are left out (see
// BenchmarkDeliver* and store's BenchmarkRecord*): this is the part that used to walk every
// pending head on every turn, so its cost must not grow with the backlog.
func benchTurn(b *testing.B, pending int) {
	st, err := store.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	body := []byte(`{"id":"evt","type":"thread.completed","machine":"load-007","thread_id":"thread-1","summary":"Done: fix the flaky test"}`)
	streams := max(1, pending/10)
	var batch []store.Event
	for i := 0; i < pending; i++ {
		batch = append(batch, store.Event{ID: "evt_" + strconv.Itoa(i), Stream: "load-007/thread-" + strconv.Itoa(i%streams), Body: body, CreatedAt: time.Now()})
		if len(batch) == 5000 || i == pending-1 {
			if err := st.Commit(store.Batch{Events: batch}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	o, err := New(st, Config{URL: "http://127.0.0.1:1", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	l := o.newLoop(context.Background())
	l.rebuild()
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(l.ready) == 0 { // every queued event taken: start over (the store still has them all)
			b.StopTimer()
			l = o.newLoop(context.Background())
			l.rebuild()
			b.StartTimer()
		}
		l.scan()
		l.due(now)
		s := l.ready[0]
		l.ready = l.ready[1:]
		s.ready = false
		if s.head == nil {
			e, err := st.PendingEvent(s.queue[0], false)
			if err != nil {
				b.Fatal(err)
			}
			s.head = &e
		}
		s.busy = true
		l.unsettled++
		e, err := st.PendingEvent(s.queue[0], true)
		if err != nil || len(e.Body) == 0 {
			b.Fatal(err)
		}
		l.finish(outcome{job: job{s: s, seq: e.Seq}, final: true})
	}
}

// BenchmarkTurn1000Pending: 1,000 pending events over 100 threads.
func BenchmarkTurn1000Pending(b *testing.B) { benchTurn(b, 1000) }

// BenchmarkTurn100000Pending: 100,000 pending events over 10,000 threads.
func BenchmarkTurn100000Pending(b *testing.B) { benchTurn(b, 100_000) }
