package outbox

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

// openShared opens the PostgreSQL store at url (a replica's), closed when the test ends.
func openShared(t *testing.T, url string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// waitDelivered waits until the store says all n events are delivered and rc got each.
func waitDelivered(t *testing.T, st *pgstore.Store, rc *sharedReceiver, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute) // a bound against hanging, not a measurement
	for {
		p, _, d, err := st.Counts()
		if err == nil && p == 0 && d == n && rc.distinct() == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d events delivered", rc.distinct(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// countRowUpdates makes the database count every row update of t3_events (a trigger bumping a
// sequence: not transactional, so concurrent claims and records never wait on it) and returns
// a function reading the count.
func countRowUpdates(t *testing.T, url string) func() int64 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	for _, q := range []string{
		`CREATE SEQUENCE test_event_updates`,
		`CREATE FUNCTION test_count_update() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM nextval('test_event_updates'); RETURN NULL; END $$`,
		`CREATE TRIGGER test_count_update AFTER UPDATE ON t3_events FOR EACH ROW EXECUTE FUNCTION test_count_update()`,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	return func() int64 {
		t.Helper()
		var n int64
		var called bool
		if err := conn.QueryRow(ctx, `SELECT last_value, is_called FROM test_event_updates`).Scan(&n, &called); err != nil {
			t.Fatal(err)
		}
		if !called {
			return 0
		}
		return n
	}
}

// TestClaimedHeadsWaitWithoutRewrites: a replica with fewer request slots than ready streams
// (every turn, claimed heads wait for a slot) writes each event's row twice, its claim and its
// outcome: a claimed head waiting for a slot stays claimed instead of being claimed again at the
// next turn, and asking again for a claim it holds writes nothing. Issue 16: 522,153 row updates
// for 10,088 events.
func TestClaimedHeadsWaitWithoutRewrites(t *testing.T) {
	url := pgtest.New(t)
	st := openShared(t, url)
	updates := countRowUpdates(t, url)
	const streams, per = 40, 5
	commitStreams(t, st, streams, per)

	rc := newSharedReceiver(t)
	// An Enricher gives the loop enrichment slots: with its request slots taken, the complete
	// heads it looks at wait for one (the events need no enrichment).
	o, err := New(st, Config{URL: rc.srv.URL, Concurrency: 2, Enricher: &fakeEnricher{}, ClaimTTL: time.Hour,
		Claimant: "replica", Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { o.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()

	waitDelivered(t, st, rc, streams*per)
	cancel()
	wg.Wait()

	rc.mu.Lock()
	defer rc.mu.Unlock()
	for id, n := range rc.got {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	for stream, ns := range rc.order {
		for i, n := range ns {
			if n != i {
				t.Fatalf("%s arrived in the order %v", stream, ns)
			}
		}
	}
	// The claim TTL (an hour) never needs a renewal here: one claim and one outcome per event.
	if n := updates(); n > 2*streams*per {
		t.Fatalf("%d row updates of t3_events for %d events delivered, want at most 2 per event (its claim and its outcome)", n, streams*per)
	} else {
		t.Logf("%d row updates for %d events", n, streams*per)
	}
}
