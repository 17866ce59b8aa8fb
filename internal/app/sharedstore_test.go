package app_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

// twoConnectors runs two connectors (each its own store pool, state directory and MCP server)
// on one PostgreSQL database and one fake T3, as two replicas behind a load balancer.
func twoConnectors(t *testing.T) (dbURL string, h1, h2 *harness) {
	t.Helper()
	dbURL = pgtest.New(t)
	fk := newIdemFake(t)
	withDB := func(s *app.Settings) { s.DatabaseURL = dbURL }
	h1 = newHarness(t, harnessOpts{fake: fk, settings: withDB})
	h2 = newHarness(t, harnessOpts{fake: fk, settings: withDB})
	h1.waitOnline("mac")
	h2.waitOnline("mac")
	return dbURL, h1, h2
}

// TestReplicasAuditToOneTable: with PostgreSQL, the calls two replicas serve are audited in the
// database's one table, each record naming its replica, and nothing goes to the replicas' own
// files (the file path is the bbolt default's, unchanged: internal/app's guardrails tests).
func TestReplicasAuditToOneTable(t *testing.T) {
	leakCheck(t)
	dbURL, h1, h2 := twoConnectors(t)
	t1 := str(h1.client("chat-1").ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "one"}), "thread_id")
	t2 := str(h2.client("chat-2").ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "two"}), "thread_id")
	h1.stop() // Close stores what the buffer holds
	h2.stop()

	db, err := pgstore.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	byThread := map[string]audit.Record{}
	if _, err := db.ScanAudit(context.Background(), audit.Filter{}, func(_ []byte, r audit.Record) error {
		byThread[r.Thread] = r
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r1, r2 := byThread[t1], byThread[t2]
	if len(byThread) != 2 || r1.Tool != "t3_dispatch" || r1.Origin != "chat-1" || r2.Origin != "chat-2" || r1.Result != audit.ResultOK {
		t.Fatalf("audit table = %+v, want one t3_dispatch per replica", byThread)
	}
	if r1.Replica == "" || r2.Replica == "" || r1.Replica == r2.Replica {
		t.Fatalf("replicas %q and %q: want two distinct names", r1.Replica, r2.Replica)
	}
	for _, h := range []*harness{h1, h2} {
		if n := len(h.auditLines()); n != 0 {
			t.Fatalf("a replica's own audit file holds %d records, want none (all in the database)", n)
		}
	}
}

// TestDispatchIdempotencyKeyAcrossConnectors: a t3_dispatch retried with its idempotency_key on
// another connector sharing the database replays the first connector's plan — the same thread
// and run, no second thread in T3 — and the key with other arguments is refused there too.
func TestDispatchIdempotencyKeyAcrossConnectors(t *testing.T) {
	_, h1, h2 := twoConnectors(t)
	args := map[string]any{"machine": "mac", "project": "api", "prompt": "finish the job", "idempotency_key": "job-42"}
	first := h1.client("").ok("t3_dispatch", args)
	tid, run := str(first, "thread_id"), str(first, "run_id")
	if tid == "" || run == "" || first["created"] != true || first["replayed"] != nil {
		t.Fatalf("first = %v", first)
	}
	c2 := h2.client("")
	again := c2.ok("t3_dispatch", args)
	if str(again, "thread_id") != tid || str(again, "run_id") != run || str(again, "message_id") != str(first, "message_id") || again["replayed"] != true {
		t.Fatalf("retry on the other connector = %v, want the first call's thread %s and run %s", again, tid, run)
	}
	c2.fails("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "another job", "idempotency_key": "job-42"},
		"idempotency_key", "other arguments", tid)
	if ids := h1.fake.ThreadIDs(); !slices.Equal(ids, []string{tid}) {
		t.Fatalf("T3 has threads %v, want only %s", ids, tid)
	}
}

// TestAuditTableRetention: a connector on PostgreSQL with T3CODE_MCP_AUDIT_RETENTION prunes the
// shared audit table at start: the record older than the retention goes, the newer one stays.
func TestAuditTableRetention(t *testing.T) {
	leakCheck(t)
	dbURL := pgtest.New(t)
	ctx := context.Background()
	db, err := pgstore.Open(ctx, dbURL) // migrates
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	now := time.Now()
	if err := db.AppendAudit(ctx, []audit.Record{
		{Time: now.Add(-100 * time.Hour), Tool: "t3_dispatch", Machine: "mac", Thread: "old"},
		{Time: now.Add(-time.Hour), Tool: "t3_dispatch", Machine: "mac", Thread: "new"},
	}); err != nil {
		t.Fatal(err)
	}
	threads := func() []string {
		var out []string
		if _, err := db.ScanAudit(ctx, audit.Filter{}, func(_ []byte, r audit.Record) error {
			out = append(out, r.Thread)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	h := newHarness(t, harnessOpts{settings: func(s *app.Settings) { s.DatabaseURL, s.AuditRetention = dbURL, 48*time.Hour }})
	eventually(t, time.Minute, "the connector pruned the record past the retention", func() bool {
		return len(threads()) == 1
	}, func() string { return fmt.Sprint(threads()) })
	if got := threads(); got[0] != "new" {
		t.Fatalf("audit table after the prune: %v, want the record within the retention", got)
	}
	h.stop()
}
