package pgstore_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

func scanAudit(t *testing.T, s *pgstore.Store, f audit.Filter) (lines []string, recs []audit.Record) {
	t.Helper()
	bad, err := s.ScanAudit(context.Background(), f, func(line []byte, r audit.Record) error {
		lines = append(lines, string(line))
		recs = append(recs, r)
		return nil
	})
	if err != nil || bad != 0 {
		t.Fatalf("ScanAudit: %v, %d bad rows", err, bad)
	}
	return lines, recs
}

// TestAuditTable: records from two replicas land in one table, oldest first, each stored as the
// JSON line the file log would hold; filters by machine, thread and time; a batch stored again
// (a retried insert, migrate-store run twice) adds nothing.
func TestAuditTable(t *testing.T) {
	ctx := context.Background()
	_, url := open(t)
	r1, r2 := openURL(t, url), openURL(t, url) // two replicas' pools
	t0 := time.Date(2026, 12, 1, 9, 0, 0, 123456789, time.UTC)
	a := []audit.Record{
		{Time: t0, Tool: "t3_dispatch", Machine: "mac", Thread: "th-1", Replica: "A", Approval: audit.Accepted, Result: audit.ResultOK},
		{Time: t0.Add(2 * time.Hour), Tool: "t3_answer", Machine: "pc", Thread: "th-1", Replica: "A", Approval: audit.Declined, Result: audit.ResultError, Error: "declined"},
	}
	b := []audit.Record{{Time: t0.Add(time.Hour), Tool: "t3_interrupt", Machine: "mac", Thread: "th-2", Run: "run-9", Replica: "B", Approval: audit.NotRequired, Result: audit.ResultOK}}
	if err := r1.AppendAudit(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := r2.AppendAudit(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := r2.AppendAudit(ctx, append(a, b...)); err != nil { // again: skipped
		t.Fatal(err)
	}
	lines, recs := scanAudit(t, r1, audit.Filter{})
	var got []string
	for _, r := range recs {
		got = append(got, r.Tool+"@"+r.Replica)
	}
	if !slices.Equal(got, []string{"t3_dispatch@A", "t3_interrupt@B", "t3_answer@A"}) {
		t.Fatalf("table = %v", got)
	}
	if want, _ := b[0].Line(); lines[1] != string(want) || !recs[0].Time.Equal(t0) || recs[1].Run != "run-9" {
		t.Fatalf("stored line %s, want %s", lines[1], want)
	}
	for _, tc := range []struct {
		f    audit.Filter
		want []string
	}{
		{audit.Filter{Machine: "mac"}, []string{"t3_dispatch", "t3_interrupt"}},
		{audit.Filter{Thread: "th-1"}, []string{"t3_dispatch", "t3_answer"}},
		{audit.Filter{Machine: "mac", Thread: "th-2"}, []string{"t3_interrupt"}},
		{audit.Filter{Since: t0.Add(time.Hour)}, []string{"t3_interrupt", "t3_answer"}},
		{audit.Filter{Machine: "nope"}, nil},
	} {
		var tools []string
		_, recs := scanAudit(t, r2, tc.f)
		for _, r := range recs {
			tools = append(tools, r.Tool)
		}
		if !slices.Equal(tools, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.f, tools, tc.want)
		}
	}
}

// TestSchemaReadOnly: Connect and Schema report a database's schema version and the migrations a
// start would apply, and change nothing: a fresh database stays empty (no version table, no audit
// table); after Open it is at Latest with nothing pending.
func TestSchemaReadOnly(t *testing.T) {
	ctx := context.Background()
	url := pgtest.New(t)
	s, err := pgstore.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc, err := s.Schema(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Version != 0 || sc.Latest != pgstore.Latest() || len(sc.Pending) != pgstore.Latest() || sc.Pending[0] != "0001_init.sql" {
		t.Fatalf("fresh database: %+v", sc)
	}
	var tables int
	if err := s.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("Schema created %d tables", tables)
	}
	if _, err := s.ScanAudit(ctx, audit.Filter{}, func([]byte, audit.Record) error { return nil }); !errors.Is(err, pgstore.ErrNoAuditTable) {
		t.Fatalf("ScanAudit on an unmigrated database: %v", err)
	}
	openURL(t, url)
	if sc, err = s.Schema(ctx); err != nil || sc.Version != pgstore.Latest() || len(sc.Pending) != 0 {
		t.Fatalf("after Open: %+v %v", sc, err)
	}
}

// pruneOnce is a replica's audit.KeepFor that stops after its first prune (the one at start).
type pruneOnce struct {
	*pgstore.Store
	cancel context.CancelFunc
	n      int
}

func (p *pruneOnce) PruneAudit(ctx context.Context, before time.Time) (int, error) {
	defer p.cancel()
	n, err := p.Store.PruneAudit(ctx, before)
	p.n = n
	return n, err
}

// TestAuditRetention: T3CODE_MCP_AUDIT_RETENTION on the shared table — two replicas prune at
// once (audit.KeepFor, at start): the records older than the retention are deleted once between
// them, the newer ones are all kept, and pruning again deletes nothing.
func TestAuditRetention(t *testing.T) {
	ctx := context.Background()
	_, url := open(t)
	r1, r2 := openURL(t, url), openURL(t, url)
	now := time.Now()
	var recs []audit.Record
	for i, age := range []time.Duration{100 * time.Hour, 72 * time.Hour, 49 * time.Hour, 47 * time.Hour, time.Minute} {
		recs = append(recs, audit.Record{Time: now.Add(-age), Tool: "t3_dispatch", Machine: "mac", Thread: "th-" + string(rune('a'+i)), Replica: "A"})
	}
	if err := r1.AppendAudit(ctx, recs); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	ps := []*pruneOnce{{Store: r1}, {Store: r2}}
	for _, p := range ps {
		pctx, cancel := context.WithCancel(ctx)
		p.cancel = cancel
		wg.Add(1)
		go func() {
			defer wg.Done()
			audit.KeepFor(pctx, p, 48*time.Hour, time.Hour, slog.New(slog.DiscardHandler))
		}()
	}
	wg.Wait()
	if got := ps[0].n + ps[1].n; got != 3 {
		t.Fatalf("the replicas pruned %d and %d records, want 3 between them", ps[0].n, ps[1].n)
	}
	_, left := scanAudit(t, r2, audit.Filter{})
	var threads []string
	for _, r := range left {
		threads = append(threads, r.Thread)
	}
	if !slices.Equal(threads, []string{"th-d", "th-e"}) {
		t.Fatalf("records left %v, want the two within the retention (th-d, th-e)", threads)
	}
	if n, err := r2.PruneAudit(ctx, now.Add(-48*time.Hour)); err != nil || n != 0 {
		t.Fatalf("pruning again = %d, %v; want nothing", n, err)
	}
}
