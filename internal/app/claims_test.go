package app_test

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// holdingReceiver is a webhook receiver that, while holding, takes requests and never answers
// them (the sender's request hangs until it gives up or dies); otherwise it answers 204 and
// records when each webhook-id first arrived answered, and which thread's events arrived.
type holdingReceiver struct {
	srv     *httptest.Server
	release chan struct{}

	mu       sync.Mutex
	holding  bool
	answered map[string]time.Time // webhook-id → first answered arrival
	threads  map[transition]bool
}

func newHoldingReceiver(t *testing.T) *holdingReceiver {
	r := &holdingReceiver{release: make(chan struct{}), holding: true, answered: map[string]time.Time{}, threads: map[transition]bool{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		arrived := time.Now()
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		holding := r.holding
		if !holding {
			var ev map[string]any
			_ = json.Unmarshal(b, &ev)
			r.threads[transition{str(ev, "thread_id"), str(ev, "type"), str(ev, "run_id")}] = true
			id := req.Header.Get("webhook-id")
			if _, ok := r.answered[id]; !ok {
				r.answered[id] = arrived
			}
		}
		r.mu.Unlock()
		if holding {
			select {
			case <-req.Context().Done():
			case <-r.release:
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	t.Cleanup(func() { close(r.release) }) // runs first: no request stays held
	return r
}

func (r *holdingReceiver) hold(on bool) {
	r.mu.Lock()
	r.holding = on
	r.mu.Unlock()
}

func (r *holdingReceiver) missing(want map[string]string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return missingTransitions(r.threads, want)
}

// replicaID is the id a replica's /healthz gives it (its lease and claim identity).
func replicaID(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct {
		Replica struct{ ID string } `json:"replica"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Replica.ID == "" {
		t.Fatalf("%s/healthz names no replica id: %v", base, err)
	}
	return h.Replica.ID
}

// claimsOf returns, per event id, until when (the database's clock) replica's delivery claim on
// it lasts, and the streams of those events.
func claimsOf(t *testing.T, db *pgxpool.Pool, replica string) (map[string]time.Time, map[string]bool) {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT id, stream, claim_until FROM t3_events WHERE state = 'pending' AND claimed_by = $1`, replica)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	until, streams := map[string]time.Time{}, map[string]bool{}
	for rows.Next() {
		var id, stream string
		var u time.Time
		if err := rows.Scan(&id, &stream, &u); err != nil {
			t.Fatal(err)
		}
		until[id], streams[stream] = u, true
	}
	return until, streams
}

// awaitClaims waits until replica holds a delivery claim on an event of each of the threads (its
// request hangs at the holding receiver) and returns its claims, as claimsOf.
func awaitClaims(t *testing.T, db *pgxpool.Pool, replica string, threads map[string]string) map[string]time.Time {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // a bound against hanging, not a measurement
	for {
		until, streams := claimsOf(t, db, replica)
		all := true
		for tid := range threads {
			all = all && streams["mac/"+tid]
		}
		if all {
			return until
		}
		if time.Now().After(deadline) {
			dumpEvents(t, db)
			t.Fatalf("replica %s holds claims on the streams %v, want one on each of the threads %v", replica, streams, threads)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// awaitNonePending waits until no event is pending in the database.
func awaitNonePending(t *testing.T, db *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second) // a bound against hanging, not a measurement
	for {
		var n int
		if err := db.QueryRow(context.Background(), `SELECT count(*) FROM t3_events WHERE state = 'pending'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			dumpEvents(t, db)
			t.Fatalf("%d events still pending", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReplicaClaimsAfterSIGKILLAndSIGTERM: the delivery claims of a replica, named by its
// replica id, outlive it when it is killed (SIGKILL: no release) and another replica delivers
// those events only once the claims expired (T3CODE_MCP_CLAIM_TTL); a replica stopped with
// SIGTERM releases its claims, and another delivers its events at once although the claims
// would have lasted an hour. Each event arrives under its first webhook-id.
func TestReplicaClaimsAfterSIGKILLAndSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs replicas")
	}
	databaseURL := pgtest.New(t)
	db, err := pgxpool.New(context.Background(), databaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bin := buildBinary(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: 8 * time.Millisecond})
	fk.AddProject("api", "/srv/api")
	rec := newHoldingReceiver(t)
	rs := newReplicaSet(t, bin, databaseURL, fk, rec.srv.URL)
	rng := rand.New(rand.NewPCG(16, 7))
	const runs = 4 // per phase

	// SIGKILL: the claims stay until they expire.
	a := rs.startWith("T3CODE_MCP_CLAIM_TTL=3s")
	rs.awaitHolder("")
	c := dial(t, a)
	killed := map[string]string{}
	dispatchSome(t, c, rng, runs, killed)
	c.Close()
	until := awaitClaims(t, db, replicaID(t, a), killed)
	rs.kill(a)
	rec.hold(false)
	rs.startWith("T3CODE_MCP_CLAIM_TTL=3s")
	awaitDelivered(t, rec, killed, 90*time.Second)
	awaitNonePending(t, db)
	rec.mu.Lock()
	for id, u := range until {
		at, ok := rec.answered[id]
		switch {
		case !ok:
			t.Errorf("event %s, claimed by the killed replica, did not arrive again under its webhook-id", id)
		case at.Before(u):
			t.Errorf("event %s was taken over at %s, before the killed replica's claim expired (%s)", id, at.Format(time.RFC3339Nano), u.Format(time.RFC3339Nano))
		}
	}
	rec.mu.Unlock()

	// SIGTERM: the claims are released at once.
	for _, b := range rs.bases() {
		rs.kill(b)
	}
	rec.hold(true)
	cReplica := rs.startWith("T3CODE_MCP_CLAIM_TTL=1h")
	rs.awaitHolder("")
	c = dial(t, cReplica)
	stopped := map[string]string{}
	dispatchSome(t, c, rng, runs, stopped)
	c.Close()
	id := replicaID(t, cReplica)
	awaitClaims(t, db, id, stopped)
	rs.stop(cReplica)
	if left, _ := claimsOf(t, db, id); len(left) != 0 {
		t.Fatalf("the stopped replica kept %d claims", len(left))
	}
	rec.hold(false)
	rs.startWith("T3CODE_MCP_CLAIM_TTL=1h")
	awaitDelivered(t, rec, stopped, 90*time.Second) // far less than the hour its claims had left
	awaitNonePending(t, db)
}

func dumpEvents(t *testing.T, db *pgxpool.Pool) {
	rows, err := db.Query(context.Background(), `SELECT id, stream, state, coalesce(claimed_by, ''), convert_from(body, 'UTF8') FROM t3_events ORDER BY seq`)
	if err != nil {
		t.Log(err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var id, stream, state, by, body string
		_ = rows.Scan(&id, &stream, &state, &by, &body)
		t.Logf("%s %s %s %s %.200s", id, stream, state, by, body)
	}
}
