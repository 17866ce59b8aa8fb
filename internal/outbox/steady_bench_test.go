package outbox_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// BenchmarkSteadyCommits is the outbox between group commits at a steady rate, as in the load
// harness's latency phase (1,000 transitions/s: a group commit every few milliseconds hands the
// outbox a few events, which it delivers before the next commit comes, so its queue empties
// between commits). One op is one group commit of 4 events on 4 threads (more than the 2
// requests the base client carries: the burst client carries the others), handed over to the
// outbox and delivered to a local receiver that answers 204 at once; the op ends when the last
// of them has arrived, and the outbox is idle again before the next.
//
// dials/op is the connections the outbox opened to the receiver per op (0 once it keeps its
// connections across idle moments); µs-to-receiver/op is the time from the commit's start to the
// last of its events received (the commit's fsync included); loop-turns/event is the outbox
// loop's turns per event delivered and recorded (each a wake-up of its goroutine);
// hand-starts/event is the share of events the hand-over sent without a turn of the loop. Between ops
// (untimed) the outcomes are recorded and the outbox goes idle.
func BenchmarkSteadyCommits(b *testing.B) {
	const perCommit = 4
	var dials atomic.Int64
	arrived := make(chan struct{}, perCommit)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
		arrived <- struct{}{}
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()

	st, err := store.Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	g := store.NewGroup(st)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ob, err := outbox.New(groupQueue{st, g}, outbox.Config{URL: srv.URL, Logger: quiet, HandOver: true})
	if err != nil {
		b.Fatal(err)
	}
	if !g.OnDurable(ob.Committed) {
		b.Fatal("no hand-over from the bbolt group")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ob.Run(ctx) }()
	defer func() { cancel(); <-done }()

	body := []byte(`{"id":"evt","type":"thread.completed","machine":"load-007","thread_id":"thread-1","summary":"Done: fix the flaky test"}`)
	round := func(i int) {
		evs := make([]store.Event, perCommit)
		for k := range evs {
			evs[k] = store.Event{ID: "evt_" + strconv.Itoa(i) + "_" + strconv.Itoa(k), Stream: "m/thread-" + strconv.Itoa(k), Body: body, CreatedAt: time.Now()}
		}
		if err := g.Commit(store.Batch{Events: evs}); err != nil {
			b.Fatal(err)
		}
		for range perCommit {
			<-arrived
		}
	}
	// recorded waits until the outcomes are durable too: the outbox is idle then, as it is
	// between two group commits when it keeps up.
	recorded := func() {
		for {
			if p, _, _, err := st.Counts(); err != nil || p == 0 {
				return
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	round(-1) // the first connections, before the measurement
	recorded()
	var wall time.Duration
	dials0, turns0, starts0 := dials.Load(), outbox.LoopTurns(ob), outbox.HandStarts(ob)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		round(i)
		wall += time.Since(start)
		recorded()
	}
	b.StopTimer()
	b.ReportMetric(float64(dials.Load()-dials0)/float64(b.N), "dials/op")
	b.ReportMetric(float64(wall.Microseconds())/float64(b.N), "µs-to-receiver/op")
	b.ReportMetric(float64(outbox.LoopTurns(ob)-turns0)/float64(b.N*perCommit), "loop-turns/event")
	b.ReportMetric(float64(outbox.HandStarts(ob)-starts0)/float64(b.N*perCommit), "hand-starts/event")
}
