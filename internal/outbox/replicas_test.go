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

// commitStreams commits per events on each of streams streams (m/t0…), interleaved; event
// ev-S-NN is stream S's NNth, its body {"stream":…,"n":NN}.
func commitStreams(t *testing.T, st *pgstore.Store, streams, per int) []store.Event {
	t.Helper()
	var evs []store.Event
	for n := range per {
		for s := range streams {
			stream := fmt.Sprintf("m/t%d", s)
			evs = append(evs, store.Event{ID: fmt.Sprintf("ev-%d-%02d", s, n), Stream: stream,
				Body: fmt.Appendf(nil, `{"stream":%q,"n":%d}`, stream, n), CreatedAt: time.Now()})
		}
	}
	if err := st.Commit(store.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	return evs
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
	a, b := openShared(t, url), openShared(t, url)
	const streams, per = 4, 15
	commitStreams(t, a, streams, per)
	// A replica that died holding the first stream's head: its claim has expired.
	if cs, err := a.ClaimHeads([]string{"m/t0"}, "dead-replica", -time.Second); err != nil || !cs[0].Claimed {
		t.Fatalf("the dead replica's claim: %+v %v", cs, err)
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

	waitDelivered(t, a, rc, streams*per)
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
	if n := claims(t, a, ""); n != 0 {
		t.Errorf("%d claims left after both replicas stopped", n)
	}
}

// claims counts the claims on pending events (of claimant, or of anyone when it is "").
func claims(t *testing.T, s *pgstore.Store, claimant string) int {
	t.Helper()
	var n int
	err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM t3_events
		WHERE state = 'pending' AND claimed_by IS NOT NULL AND ($1 = '' OR claimed_by = $1)`, claimant).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStoppedReplicaReleasesItsClaims: a replica whose outbox stops (SIGTERM) while it holds the
// heads of every stream — its requests hanging at the receiver — releases its claims, so another
// replica delivers those events at once, not after the claims' TTL (an hour here), with the same
// webhook ids; each stream's events still in order.
func TestStoppedReplicaReleasesItsClaims(t *testing.T) {
	st := openShared(t, pgtest.New(t))
	const streams, per = 3, 2
	evs := commitStreams(t, st, streams, per)

	// The receiver holds every request until its client gives up while hold is set.
	var mu sync.Mutex
	hold, held := true, map[string]int{}
	release := make(chan struct{})
	got := map[string]int{}
	var order []string
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		id := req.Header.Get("webhook-id")
		mu.Lock()
		h := hold
		if h {
			held[id]++
		} else {
			got[id]++
			order = append(order, id)
		}
		mu.Unlock()
		if h {
			select {
			case <-req.Context().Done():
			case <-release:
			}
		}
	}))
	t.Cleanup(rc.Close)
	t.Cleanup(func() { close(release) }) // runs first: no request stays held
	count := func(m map[string]int) int {
		mu.Lock()
		defer mu.Unlock()
		return len(m)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(time.Minute) // a bound against hanging, not a measurement
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctxA, stopA := context.WithCancel(context.Background())
	a, err := New(st, Config{URL: rc.URL, Claimant: "replica-a", ClaimTTL: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	doneA := make(chan struct{})
	go func() { defer close(doneA); a.Run(ctxA) }()
	defer func() { stopA(); <-doneA }() // before the receiver's Close, which waits for its requests
	waitFor("replica a to send every stream's head", func() bool { return count(held) == streams })
	if n := claims(t, st, "replica-a"); n != streams {
		t.Fatalf("replica a holds %d claims, want %d (one per stream's head)", n, streams)
	}
	stopA()
	<-doneA
	if n := claims(t, st, ""); n != 0 {
		t.Fatalf("%d claims left after replica a stopped", n)
	}

	mu.Lock()
	hold = false
	mu.Unlock()
	ctxB, stopB := context.WithCancel(context.Background())
	defer stopB()
	b, err := New(st, Config{URL: rc.URL, Claimant: "replica-b", ClaimTTL: time.Hour, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	doneB := make(chan struct{})
	go func() { defer close(doneB); b.Run(ctxB) }()
	waitFor("replica b to deliver every event", func() bool {
		p, _, _, err := st.Counts()
		return err == nil && p == 0
	})
	stopB()
	<-doneB
	mu.Lock()
	defer mu.Unlock()
	for _, e := range evs {
		if got[e.ID] != 1 {
			t.Errorf("%s delivered %d times by replica b, want 1", e.ID, got[e.ID])
		}
	}
	for id := range held {
		if got[id] != 1 {
			t.Errorf("%s, held by replica a when it stopped, was not delivered again under its webhook-id", id)
		}
	}
	pos := map[string]int{}
	for i, id := range order {
		pos[id] = i
	}
	for s := range streams {
		if pos[fmt.Sprintf("ev-%d-00", s)] > pos[fmt.Sprintf("ev-%d-01", s)] {
			t.Errorf("stream m/t%d delivered out of order: %v", s, order)
		}
	}
}
