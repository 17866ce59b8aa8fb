package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ttl is short so the tests move quickly; nothing asserts a duration.
const ttl = 1500 * time.Millisecond

func newDB(t *testing.T) string {
	t.Helper()
	url := pgtest.New(t)
	pool := newPool(t, url)
	if _, err := pool.Exec(context.Background(), Schema); err != nil {
		t.Fatal(err)
	}
	return url
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// replica is one Manager running on a pool of its own, with a record of its callbacks.
type replica struct {
	m      *Manager
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	acquired map[string][]int64
	released map[string]int
}

func startReplica(t *testing.T, url, id string, machines []string) *replica {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{pool: pool, done: make(chan struct{}), acquired: map[string][]int64{}, released: map[string]int{}}
	r.m = New(Options{Pool: pool, Replica: id, Machines: machines, TTL: ttl, Logger: slog.New(slog.DiscardHandler),
		OnAcquire: func(name string, token int64) {
			r.mu.Lock()
			r.acquired[name] = append(r.acquired[name], token)
			r.mu.Unlock()
		},
		OnRelease: func(name string) {
			r.mu.Lock()
			r.released[name]++
			r.mu.Unlock()
		}})
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); r.m.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends the replica cleanly (its leases are released).
func (r *replica) stop() {
	r.cancel()
	<-r.done
	r.pool.Close()
}

// crash ends the replica as a SIGKILL would for the database: its connections go, nothing is
// released, its leases expire by themselves.
func (r *replica) crash() {
	r.pool.Close()
	r.cancel()
	<-r.done
}

// eventually polls cond until it holds; the test's own deadline bounds it.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if dl, ok := t.Deadline(); ok && time.Until(dl) < 5*time.Second {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holders reads who holds each machine's lease now, by the database's clock.
func holders(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT machine, holder FROM t3_machine_leases WHERE expires_at > now()`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var m, h string
		if err := rows.Scan(&m, &h); err != nil {
			t.Fatal(err)
		}
		out[m] = h
	}
	return out
}

func machines(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("m%d", i)
	}
	return out
}

func TestALoneReplicaHoldsEveryMachine(t *testing.T) {
	url := newDB(t)
	r := startReplica(t, url, "a", machines(3))
	eventually(t, "replica a holds all 3 machines", func() bool { return len(r.m.Holding()) == 3 })
	for _, name := range machines(3) {
		tok, ok := r.m.Held(name)
		if !ok || tok != 1 {
			t.Fatalf("%s: held=%v token=%d, want the first token 1", name, ok, tok)
		}
	}
	r.stop()
	if got := holders(t, newPool(t, url)); len(got) != 0 {
		t.Fatalf("after a clean stop the leases are still live: %v", got)
	}
}

// TestMachinesAreSpreadOverLiveReplicas: six machines, three replicas started one after another
// (the first takes everything, then gives up its excess): each ends with two, no machine twice.
func TestMachinesAreSpreadOverLiveReplicas(t *testing.T) {
	url := newDB(t)
	ms := machines(6)
	a := startReplica(t, url, "a", ms)
	eventually(t, "a holds all 6", func() bool { return len(a.m.Holding()) == 6 })
	b := startReplica(t, url, "b", ms)
	c := startReplica(t, url, "c", ms)
	pool := newPool(t, url)
	spread := func() bool {
		h := holders(t, pool)
		per := map[string]int{}
		for _, who := range h {
			per[who]++
		}
		return len(h) == 6 && per["a"] == 2 && per["b"] == 2 && per["c"] == 2 &&
			len(a.m.Holding()) == 2 && len(b.m.Holding()) == 2 && len(c.m.Holding()) == 2
	}
	eventually(t, "each replica holds 2 of the 6 machines", spread)
	// Locally, no machine is held by two replicas.
	seen := map[string]string{}
	for _, r := range []*replica{a, b, c} {
		for _, name := range r.m.Holding() {
			if other, dup := seen[name]; dup {
				t.Fatalf("machine %s held by %s and %s", name, other, r.m.Replica())
			}
			seen[name] = r.m.Replica()
		}
	}
}

// TestAnExpiredLeaseIsTakenOverWithAGreaterToken: the holder dies without releasing; the other
// replica takes every machine once the leases expire, each with a new token, and a commit fenced
// with the dead holder's token is refused.
func TestAnExpiredLeaseIsTakenOverWithAGreaterToken(t *testing.T) {
	url := newDB(t)
	ms := machines(2)
	a := startReplica(t, url, "a", ms)
	eventually(t, "a holds both machines", func() bool { return len(a.m.Holding()) == 2 })
	old := map[string]int64{}
	for _, name := range ms {
		old[name], _ = a.m.Held(name)
	}
	b := startReplica(t, url, "b", ms)
	eventually(t, "b holds one machine", func() bool { return len(b.m.Holding()) == 1 })
	a.crash()
	eventually(t, "b holds both machines after a died", func() bool { return len(b.m.Holding()) == 2 })
	eventually(t, "a's local view has let go", func() bool { return len(a.m.Holding()) == 0 })
	pool := newPool(t, url)
	ctx := context.Background()
	for _, name := range ms {
		tok, _ := b.m.Held(name)
		if tok <= old[name] {
			t.Fatalf("%s: b's token %d is not greater than a's %d", name, tok, old[name])
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckFence(ctx, tx, name, old[name]); !errors.Is(err, ErrFenced) {
			t.Fatalf("%s: a commit with the dead holder's token passed the fence: %v", name, err)
		}
		_ = tx.Rollback(ctx)
		tx, err = pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := CheckFence(ctx, tx, name, tok); err != nil {
			t.Fatalf("%s: the holder's own token was refused: %v", name, err)
		}
		_ = tx.Rollback(ctx)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, name := range ms {
		if len(b.acquired[name]) == 0 {
			t.Fatalf("OnAcquire never called for %s", name)
		}
	}
}

// TestAFenceCheckHoldsOffATakeover: while a commit that passed the fence is open, a takeover of
// the same lease waits for it (FOR SHARE against the takeover's update), so the commit cannot
// land inside the new holder's tenure.
func TestAFenceCheckHoldsOffATakeover(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO t3_machine_leases (machine, holder, token, expires_at) VALUES ('m', 'a', 7, '-infinity')`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckFence(ctx, tx, "m", 7); err != nil {
		t.Fatal(err)
	}
	took := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `UPDATE t3_machine_leases SET holder = 'b', token = token + 1 WHERE machine = 'm'`)
		took <- err
	}()
	// The takeover is blocked on the row lock: the database says so.
	eventually(t, "the takeover waits on the fenced commit's row lock", func() bool {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE t3_machine_leases%'`).Scan(&waiting)
		return waiting == 1
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-took; err != nil {
		t.Fatal(err)
	}
	tx, err = pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := CheckFence(ctx, tx, "m", 7); !errors.Is(err, ErrFenced) {
		t.Fatalf("after the takeover the old token passed: %v", err)
	}
}

// TestALapsedLeaseComesBackUnderANewToken: renewals failed until the local deadline passed
// (Held said the lease was gone, and the detector passed the machine's chunks over), then one got
// through while the database still listed this replica as the holder. Resuming under the old
// token would tell the detector its tenure never ended, so those chunks would never be judged:
// the lease comes back under a new token, through OnAcquire (where the detector catches up), and
// the old token is fenced.
func TestALapsedLeaseComesBackUnderANewToken(t *testing.T) {
	url := newDB(t)
	pool := newPool(t, url)
	var acquired []int64 // OnAcquire runs on tick's goroutine: this test's
	m := New(Options{Pool: pool, Replica: "a", Machines: []string{"m0"}, TTL: time.Minute, Logger: slog.New(slog.DiscardHandler),
		OnAcquire: func(_ string, token int64) { acquired = append(acquired, token) }})
	ctx := context.Background()
	if err := m.tick(ctx, true); err != nil {
		t.Fatal(err)
	}
	old, ok := m.Held("m0")
	if !ok || len(acquired) != 1 || acquired[0] != old {
		t.Fatalf("first tick: held=%v token=%d, OnAcquire %v; want the lease with OnAcquire", ok, old, acquired)
	}
	// The renewals failed for a TTL: the local deadline passed (the database's expiry, set by
	// the last renewal that got through, is later: nobody else could take the lease yet).
	m.mu.Lock()
	h := m.held["m0"]
	h.deadline = time.Now().Add(-time.Millisecond)
	m.held["m0"] = h
	m.mu.Unlock()
	if _, ok := m.Held("m0"); ok {
		t.Fatal("Held still reports a lease whose local deadline passed")
	}
	// The next renewal gets through.
	if err := m.tick(ctx, true); err != nil {
		t.Fatal(err)
	}
	tok, ok := m.Held("m0")
	if ok && tok == old {
		t.Fatalf("the lease resumed under its old token %d after Held had reported it gone", old)
	}
	if !ok || tok <= old || len(acquired) != 2 || acquired[1] != tok {
		t.Fatalf("after the late renewal: held=%v token=%d (old %d), OnAcquire %v; want it taken again under a greater token, with OnAcquire", ok, tok, old, acquired)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if err := CheckFence(ctx, tx, "m0", old); !errors.Is(err, ErrFenced) {
		t.Fatalf("a commit with the lapsed token passed the fence: %v", err)
	}
}

// TestARemovedMachineIsClaimedOnlyWhenNoReplicaHoldsIt: replica b's configuration no longer
// names m1 (removed from t3code.toml) while replica a's still does. b may claim m1 (to prune its
// left-overs) only once no replica holds it, under a token greater than a's, which fences a's
// old commits out; a machine b is configured with is never claimed this way, a claim excludes a
// second one until released, and a machine with no lease row at all (its state copied by
// migrate-store) can be claimed too.
func TestARemovedMachineIsClaimedOnlyWhenNoReplicaHoldsIt(t *testing.T) {
	url := newDB(t)
	a := startReplica(t, url, "a", machines(2))
	eventually(t, "a holds both machines", func() bool { return len(a.m.Holding()) == 2 })
	aToken, _ := a.m.Held("m1")
	b := startReplica(t, url, "b", []string{"m0"})
	ctx := context.Background()
	claim := func(machine string) (int64, func(context.Context) error, bool) {
		t.Helper()
		tok, release, ok, err := b.m.ClaimRemoved(ctx, machine)
		if err != nil {
			t.Fatal(err)
		}
		return tok, release, ok
	}
	if _, _, ok := claim("m0"); ok {
		t.Fatal("b claimed m0, a machine it is configured with")
	}
	if _, _, ok := claim("m1"); ok {
		t.Fatal("b claimed m1 while a holds its lease")
	}
	a.crash()
	var tok int64
	var release func(context.Context) error
	eventually(t, "b claims m1 once a's lease expired", func() bool {
		var ok bool
		tok, release, ok = claim("m1")
		return ok
	})
	if tok <= aToken {
		t.Fatalf("the claim's token %d is not greater than a's %d", tok, aToken)
	}
	pool := newPool(t, url)
	fence := func(token int64) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		return CheckFence(ctx, tx, "m1", token)
	}
	if err := fence(aToken); !errors.Is(err, ErrFenced) {
		t.Fatalf("a commit with a's old token passed the claim's fence: %v", err)
	}
	if err := fence(tok); err != nil {
		t.Fatalf("the claim's own token was refused: %v", err)
	}
	if _, _, ok := claim("m1"); ok {
		t.Fatal("m1 claimed twice at once")
	}
	if err := release(ctx); err != nil {
		t.Fatal(err)
	}
	if again, _, ok := claim("m1"); !ok || again <= tok {
		t.Fatalf("after the release: claim ok=%v token %d, want a new claim with a token > %d", ok, again, tok)
	}
	if _, _, ok := claim("ghost"); !ok {
		t.Fatal("a machine without a lease row could not be claimed")
	}
}
