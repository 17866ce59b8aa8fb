package outbox

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

// sharedReceiver counts, per webhook-id, deliveries and deliveries in flight at once, and keeps
// each stream's order of arrival.
type sharedReceiver struct {
	mu       sync.Mutex
	inflight map[string]int
	overlaps []string
	got      map[string]int
	order    map[string][]int
	srv      *httptest.Server
}

func newSharedReceiver(t *testing.T) *sharedReceiver {
	r := &sharedReceiver{inflight: map[string]int{}, got: map[string]int{}, order: map[string][]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := req.Header.Get("webhook-id")
		b, _ := io.ReadAll(req.Body)
		var body struct {
			Stream string `json:"stream"`
			N      int    `json:"n"`
		}
		_ = json.Unmarshal(b, &body)
		r.mu.Lock()
		r.inflight[id]++
		if r.inflight[id] > 1 {
			r.overlaps = append(r.overlaps, id)
		}
		r.mu.Unlock()
		// Let other deliveries happen meanwhile (not a timing assertion: a wider window only
		// makes an overlap likelier to be seen).
		time.Sleep(time.Millisecond)
		r.mu.Lock()
		r.inflight[id]--
		r.got[id]++
		r.order[body.Stream] = append(r.order[body.Stream], body.N)
		r.mu.Unlock()
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *sharedReceiver) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// TestReplicasShareDeliveryOnPostgreSQL: two outboxes (two replicas) on one PostgreSQL database
// deliver every event exactly once, never one event by both at the same time, each thread's
// events in order; an event claimed by a replica that died (its claim expired) is taken over.
func TestReplicasShareDeliveryOnPostgreSQL(t *testing.T) {
	url := pgtest.New(t)
	open := func() *pgstore.Store {
		s, err := pgstore.Open(context.Background(), url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open(), open()
	const streams, per = 4, 15
	var evs []store.Event
	for n := range per {
		for s := range streams {
			stream := fmt.Sprintf("m/t%d", s)
			evs = append(evs, store.Event{ID: fmt.Sprintf("ev-%d-%02d", s, n), Stream: stream,
				Body: fmt.Appendf(nil, `{"stream":%q,"n":%d}`, stream, n), CreatedAt: time.Now()})
		}
	}
	if err := a.Commit(store.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	// A replica that died holding the first stream's head: its claim has expired.
	dead, err := a.Get("ev-0-00")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Claim(dead.Seq, "dead-replica", -time.Second); err != nil || !ok {
		t.Fatalf("the dead replica's claim: %v %v", ok, err)
	}

	rc := newSharedReceiver(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, q := range []*pgstore.Store{a, b} {
		o, err := New(q, Config{URL: rc.srv.URL, Concurrency: 4, Claimant: fmt.Sprintf("replica-%d", i), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { o.Run(ctx) })
	}
	defer func() { cancel(); wg.Wait() }()

	deadline := time.Now().Add(2 * time.Minute) // a bound against hanging, not a measurement
	settled := func() bool {
		p, _, d, err := a.Counts()
		return err == nil && p == 0 && d == streams*per && rc.distinct() == streams*per
	}
	for !settled() {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events delivered", rc.distinct(), streams*per)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	wg.Wait()

	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.overlaps) > 0 {
		t.Errorf("delivered by two replicas at the same time: %v", rc.overlaps)
	}
	for id, n := range rc.got {
		if n != 1 {
			t.Errorf("%s delivered %d times (no claim expired, so once)", id, n)
		}
	}
	for s, order := range rc.order {
		for i := 1; i < len(order); i++ {
			if order[i] <= order[i-1] {
				t.Errorf("stream %s delivered out of order: %v", s, order)
				break
			}
		}
	}
}
