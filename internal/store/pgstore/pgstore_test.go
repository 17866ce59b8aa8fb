package pgstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
)

// open opens a store on a fresh database of this test's own.
func open(t testing.TB) (*pgstore.Store, string) {
	t.Helper()
	url := pgtest.New(t)
	return openURL(t, url), url
}

// TestContract runs the store contract suite on PostgreSQL (a fresh database per test).
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (store.Store, func(t *testing.T) store.Store) {
		s, url := open(t)
		return s, func(t *testing.T) store.Store {
			s.Close()
			s2, err := pgstore.Open(context.Background(), url)
			if err != nil {
				t.Fatal(err)
			}
			return s2
		}
	})
}

// TestMigrateConcurrentlyOnce: replicas starting together on an empty database all succeed, and
// every step is applied exactly once.
func TestMigrateConcurrentlyOnce(t *testing.T) {
	url := pgtest.New(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := pgstore.Open(context.Background(), url)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
	}
	s := openURL(t, url)
	var n, max int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*), max(version) FROM t3_schema_version`).Scan(&n, &max); err != nil {
		t.Fatal(err)
	}
	if n != pgstore.Latest() || max != pgstore.Latest() || n < 2 {
		t.Fatalf("schema versions: %d rows, max %d; want %d", n, max, pgstore.Latest())
	}
}

// openURL opens a store on the database url names, closed when the test ends.
func openURL(t testing.TB, url string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestNewerSchemaRefused: a binary does not write to a database a newer one migrated.
func TestNewerSchemaRefused(t *testing.T) {
	s, url := open(t)
	if _, err := s.Pool().Exec(context.Background(), `INSERT INTO t3_schema_version (version, name) VALUES ($1, 'future')`, pgstore.Latest()+1); err != nil {
		t.Fatal(err)
	}
	if _, err := pgstore.Open(context.Background(), url); err == nil || !strings.Contains(err.Error(), "newer t3code-mcp") {
		t.Fatalf("Open of a newer schema: %v", err)
	}
}

// TestPasswordNeverShown: the database URL's password appears neither in Location nor in the
// errors of a failed connection or a failed call.
func TestPasswordNeverShown(t *testing.T) {
	const pw = "Sup3r-s3cret-pw"
	withPW := func(raw string) string {
		u, err := neturl.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		u.User = neturl.UserPassword(u.User.Username(), pw)
		return u.String()
	}
	// A server that does not answer: a closed port on loopback.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "postgres://app:" + pw + "@" + l.Addr().String() + "/db?sslmode=disable&connect_timeout=5"
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgstore.Open(ctx, dead)
	if err == nil {
		t.Fatal("Open of a closed port succeeded")
	}
	if strings.Contains(err.Error(), pw) {
		t.Fatalf("the password is in the error: %v", err)
	}
	if _, err := pgstore.Open(ctx, "postgres://app:"+pw+"@127.0.0.1:1/db?sslmode=bogus"); err == nil || strings.Contains(err.Error(), pw) {
		t.Fatalf("a bad URL's error: %v", err)
	}
	if _, err := pgstore.Open(ctx, "postgres://127.0.0.1:1/db?sslmode=disable&password="+pw); err == nil || strings.Contains(err.Error(), pw) {
		t.Fatalf("an error with the password in the query: %v", err)
	}

	// A working server (trust authentication ignores the password).
	s, err := pgstore.Open(ctx, withPW(pgtest.New(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if strings.Contains(s.Location(), pw) || !strings.Contains(s.Location(), "xxxxx") {
		t.Fatalf("Location = %s", s.Location())
	}
	if _, err := s.Pool().Exec(ctx, `DROP TABLE t3_events CASCADE`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pending(0); err == nil || strings.Contains(err.Error(), pw) {
		t.Fatalf("a failed call's error: %v", err)
	}
}

// TestSequenceInCommitOrderAcrossReplicas: two stores on one database (two replicas) commit
// concurrently while a reader follows them with a PendingAfter cursor, as an outbox does; the
// reader must see every event, which holds only when sequence numbers are assigned in commit
// order.
func TestSequenceInCommitOrderAcrossReplicas(t *testing.T) {
	a, url := open(t)
	b := openURL(t, url)
	const per = 150
	var wg sync.WaitGroup
	for w, s := range []*pgstore.Store{a, b} {
		wg.Go(func() {
			g := store.NewGroup(s)
			var inner sync.WaitGroup
			for i := range per {
				inner.Go(func() {
					id := fmt.Sprintf("w%d-%03d", w, i)
					if err := g.Commit(store.Batch{Events: []store.Event{storetest.Ev(id, fmt.Sprintf("s%d", i%7))}}); err != nil {
						t.Error(err)
					}
				})
			}
			inner.Wait()
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	seen := map[string]bool{}
	var cursor uint64
	for finished := false; !finished; {
		select {
		case <-done:
			finished = true // one more read after the last commit
		default:
		}
		evs, err := a.PendingAfter(cursor, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			if e.Seq <= cursor {
				t.Fatalf("PendingAfter(%d) returned seq %d", cursor, e.Seq)
			}
			seen[e.ID] = true
			cursor = e.Seq
		}
	}
	if len(seen) != 2*per {
		t.Fatalf("the cursor saw %d of %d events: an event committed with a lower sequence number after a higher one was skipped", len(seen), 2*per)
	}
}

// TestFencedBatchFailsAlone: a batch whose fencing token is no longer its machine's is not
// written, and a group it was part of still writes the others.
func TestFencedBatchFailsAlone(t *testing.T) {
	s, _ := open(t)
	ctx := context.Background()
	if _, err := s.Pool().Exec(ctx, `INSERT INTO t3_machine_leases (machine, holder, token) VALUES ('m1', 'r1', 7)`); err != nil {
		t.Fatal(err)
	}
	ok := store.Batch{Fence: &store.Fence{Machine: "m1", Token: 7}, Detector: map[string][]byte{"m1/t": []byte("a")}, Events: []store.Event{storetest.Ev("ok", "m1/t")}}
	stale := store.Batch{Fence: &store.Fence{Machine: "m1", Token: 6}, Detector: map[string][]byte{"m1/u": []byte("b")}, Events: []store.Event{storetest.Ev("stale", "m1/u")}}
	unknown := store.Batch{Fence: &store.Fence{Machine: "m2", Token: 1}, Events: []store.Event{storetest.Ev("m2", "m2/t")}}
	if err := s.Commit(stale); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("stale token: %v, want ErrFenced", err)
	}
	if err := s.Commit(unknown); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("no lease row: %v, want ErrFenced", err)
	}
	g := store.NewGroup(s)
	var wg sync.WaitGroup
	var okErr, staleErr error
	wg.Go(func() { okErr = g.Commit(ok) })
	wg.Go(func() { staleErr = g.Commit(stale) })
	wg.Wait()
	if okErr != nil || !errors.Is(staleErr, store.ErrFenced) {
		t.Fatalf("group: ok batch %v, stale batch %v", okErr, staleErr)
	}
	if _, err := s.Get("stale"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the fenced event was written: %v", err)
	}
	if _, found, _ := s.Detector("m1/u"); found {
		t.Fatal("the fenced detector state was written")
	}
	if _, err := s.Get("ok"); err != nil {
		t.Fatalf("the current holder's event: %v", err)
	}
}

// TestClaimHeads: only a stream's head is claimable, by one claimant at a time, all the streams
// asked for in one call; a claim ends with the event's final outcome, an expired claim (a dead
// replica's) is taken over, and a released one (a replica stopped) at once.
func TestClaimHeads(t *testing.T) {
	s, _ := open(t)
	if err := s.Commit(store.Batch{Events: []store.Event{storetest.Ev("a1", "a"), storetest.Ev("a2", "a"), storetest.Ev("b1", "b")}}); err != nil {
		t.Fatal(err)
	}
	seq := func(id string) uint64 {
		e, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		return e.Seq
	}
	// claim claims the heads of streams for who and returns, per stream, the claimed event's id
	// ("" when not claimed) after checking the reported head.
	claim := func(who string, ttl time.Duration, streams ...string) []string {
		t.Helper()
		cs, err := s.ClaimHeads(streams, who, ttl)
		if err != nil {
			t.Fatalf("ClaimHeads(%v, %s): %v", streams, who, err)
		}
		if len(cs) != len(streams) {
			t.Fatalf("ClaimHeads(%v): %d answers", streams, len(cs))
		}
		ids := make([]string, len(cs))
		for i, c := range cs {
			if c.Stream != streams[i] {
				t.Fatalf("answer %d is for %q, want %q", i, c.Stream, streams[i])
			}
			if c.Claimed {
				ids[i] = c.Event.ID
				if c.Event.Seq != c.Head || c.Event.Stream != c.Stream || string(c.Event.Body) != string(storetest.Ev(c.Event.ID, c.Stream).Body) || c.Event.State != store.StatePending {
					t.Fatalf("claimed event: %+v (head %d)", c.Event, c.Head)
				}
			}
		}
		return ids
	}
	got := claim("A", time.Minute, "a", "b", "none")
	if !slices.Equal(got, []string{"a1", "b1", ""}) {
		t.Fatalf("A's first claims: %q, want a1, b1 and nothing of an unknown stream", got)
	}
	if got := claim("B", time.Minute, "a", "b"); !slices.Equal(got, []string{"", ""}) {
		t.Fatalf("B claimed %q, held by A", got)
	}
	if got := claim("A", time.Minute, "a"); !slices.Equal(got, []string{"a1"}) {
		t.Fatalf("A's renewal: %q", got)
	}
	if errs, err := s.Record([]store.Op{{ID: "a1", Kind: store.OpDelivered, At: storetest.T0}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	// a1 is delivered: a2 is the head now, free (a final outcome ends a claim).
	cs, err := s.ClaimHeads([]string{"a"}, "B", time.Minute)
	if err != nil || len(cs) != 1 || !cs[0].Claimed || cs[0].Head != seq("a2") {
		t.Fatalf("a2, now its stream's head: %+v %v", cs, err)
	}
	// A claims c1 and dies: its claim is past its expiry already, and B takes it over.
	if err := s.Commit(store.Batch{Events: []store.Event{storetest.Ev("c1", "c"), storetest.Ev("d1", "d")}}); err != nil {
		t.Fatal(err)
	}
	if got := claim("A", -time.Second, "c"); got[0] != "c1" {
		t.Fatal("A could not claim c1")
	}
	if got := claim("B", time.Minute, "c"); got[0] != "c1" {
		t.Fatal("A's expired claim of c1 was not taken over by B")
	}
	// A replica stopping releases its claims: the others take them at once.
	if got := claim("A", time.Minute, "d"); got[0] != "d1" {
		t.Fatal("A could not claim d1")
	}
	if n, err := s.ReleaseClaims("A"); err != nil || n != 2 { // b1, d1
		t.Fatalf("ReleaseClaims(A) = %d, %v; want 2", n, err)
	}
	if got := claim("C", time.Minute, "b", "d", "c"); !slices.Equal(got, []string{"b1", "d1", ""}) {
		t.Fatalf("after A released: C claimed %q, want b1 and d1 (c1 is B's)", got)
	}
	// A retry keeps the claim; a dead letter ends it, and a requeued event is claimable again.
	if errs, err := s.Record([]store.Op{{ID: "b1", Kind: store.OpRetry, Next: storetest.T0, Error: "x"}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if got := claim("D", time.Minute, "b"); got[0] != "" {
		t.Fatal("a retry ended C's claim of b1")
	}
	if errs, err := s.Record([]store.Op{{ID: "b1", Kind: store.OpDead, At: storetest.T0, Error: "x"}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	if cs, err := s.ClaimHeads([]string{"b"}, "D", time.Minute); err != nil || cs[0].Head != 0 || cs[0].Claimed {
		t.Fatalf("a stream whose only event is dead: %+v %v", cs, err)
	}
	if _, err := s.Requeue(storetest.T0, "b1"); err != nil {
		t.Fatal(err)
	}
	if got := claim("D", time.Minute, "b"); got[0] != "b1" {
		t.Fatal("a requeued event kept its old claim")
	}
}

// TestClaimHeadsConcurrently: many claimants asking for the same streams at once never claim one
// head twice, and every free head is claimed by someone.
func TestClaimHeadsConcurrently(t *testing.T) {
	s, _ := open(t)
	var evs []store.Event
	var streams []string
	for i := range 40 {
		st := fmt.Sprintf("m/t%d", i)
		streams = append(streams, st)
		evs = append(evs, storetest.Ev(fmt.Sprintf("e%d-1", i), st), storetest.Ev(fmt.Sprintf("e%d-2", i), st))
	}
	if err := s.Commit(store.Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	owner := map[string]string{}
	for i := range 8 {
		who := fmt.Sprintf("r%d", i)
		wg.Go(func() {
			order := slices.Clone(streams)
			if i%2 == 1 {
				slices.Reverse(order) // lock rows in another order: SKIP LOCKED never waits
			}
			cs, err := s.ClaimHeads(order, who, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cs {
				if !c.Claimed {
					continue
				}
				if !strings.HasSuffix(c.Event.ID, "-1") {
					t.Errorf("%s claimed %s, not its stream's head", who, c.Event.ID)
				}
				if prev, ok := owner[c.Event.ID]; ok {
					t.Errorf("%s claimed by %s and %s", c.Event.ID, prev, who)
				}
				owner[c.Event.ID] = who
			}
		})
	}
	wg.Wait()
	// A head passed over because another claimant had it locked is free or held now: one more
	// round by a ninth claimant finds every head held.
	cs, err := s.ClaimHeads(streams, "late", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Claimed {
			t.Errorf("%s was still free after 8 claimants asked for it", c.Event.ID)
		}
	}
	if len(owner) != len(streams) {
		t.Fatalf("%d of %d heads claimed", len(owner), len(streams))
	}
}
