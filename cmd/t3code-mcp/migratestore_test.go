package main

import (
	"bytes"
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

func evIDs(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// TestMigrateStore: migrate-store copies the tracked threads, the detector state, the pending
// events (with their attempts and errors) and the dead letters from the bbolt file into an empty
// PostgreSQL database, keeping every stream's order; it refuses a database that holds state, a
// file a running connector holds, and a missing database URL.
func TestMigrateStore(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	dbURL := pgtest.New(t)
	t.Setenv("T3CODE_MCP_STATE_DIR", state)
	t.Setenv("T3CODE_MCP_DATABASE_URL", "")
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	src, err := store.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	threads := []store.Thread{
		{ID: "t1", Machine: "mac", ProjectTitle: "api", Watch: true, LastRunID: "r1", CreatedAt: at, UpdatedAt: at},
		{ID: "t2", Machine: "box", CreatedAt: at.Add(time.Minute), UpdatedAt: at.Add(time.Minute)},
	}
	ev := func(id, stream string) store.Event {
		return store.Event{ID: id, Stream: stream, Body: []byte(`{"id":"` + id + `", "raw" : 1}`), CreatedAt: at}
	}
	if err := src.Commit(store.Batch{Threads: threads, Detector: map[string][]byte{"mac\x00t1": []byte(`{"s":1}`), "box\x00t2": {0xff, 0}},
		Events: []store.Event{ev("a1", "mac/t1"), ev("b1", "box/t2"), ev("a2", "mac/t1"), ev("b2", "box/t2"), ev("c1", "mac/t3")}}); err != nil {
		t.Fatal(err)
	}
	if errs, err := src.Record([]store.Op{
		{ID: "a1", Kind: store.OpRetry, Next: at.Add(time.Minute), Error: "HTTP 503"},
		{ID: "b1", Kind: store.OpDead, At: at, Error: "HTTP 400"},
		{ID: "c1", Kind: store.OpDelivered, At: at},
	}); err != nil || slices.ContainsFunc(errs, func(e error) bool { return e != nil }) {
		t.Fatal(err, errs)
	}

	if _, _, err := src.ClaimIdempotency(store.Idempotency{Key: "job-7", Record: []byte(`{"thread":"t1"}`), CreatedAt: at}); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	if code := run([]string{"migrate-store"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "T3CODE_MCP_DATABASE_URL") {
		t.Fatalf("without a database URL: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"migrate-store", "--database-url", dbURL}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "stop the running t3code-mcp first") {
		t.Fatalf("with the file held: exit %d, stderr %q", code, errb.String())
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	errb.Reset()
	if code := run([]string{"migrate-store", "--database-url", dbURL}, &out, &errb); code != 0 {
		t.Fatalf("migrate-store: exit %d, stderr %q", code, errb.String())
	}
	if want := "copied 2 tracked threads, 2 detector records, 3 pending events and 1 dead letter from "; !strings.HasPrefix(out.String(), want) {
		t.Fatalf("stdout %q, want it to start %q", out.String(), want)
	}

	dst, err := pgstore.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if !strings.Contains(out.String(), "copied 1 idempotency key\n") {
		t.Fatalf("stdout %q does not count the idempotency key", out.String())
	}
	if k, ok, err := dst.GetIdempotency("job-7"); err != nil || !ok || string(k.Record) != `{"thread":"t1"}` || !k.CreatedAt.Equal(at) {
		t.Fatalf("idempotency key after the move = %+v %v %v", k, ok, err)
	}
	got, err := dst.ListThreads()
	if err != nil || len(got) != 2 || got[0].ID != "t1" || got[0].ProjectTitle != "api" || !got[0].Watch || got[1].ID != "t2" {
		t.Fatalf("threads = %+v %v", got, err)
	}
	if v, ok, _ := dst.Detector("box\x00t2"); !ok || !bytes.Equal(v, []byte{0xff, 0}) {
		t.Fatalf("detector state = %v %v", v, ok)
	}
	pending, _ := dst.Pending(0)
	if !slices.Equal(evIDs(pending), []string{"a1", "a2", "b2"}) || string(pending[0].Body) != `{"id":"a1", "raw" : 1}` {
		t.Fatalf("pending = %v", evIDs(pending))
	}
	if a1 := pending[0]; a1.Attempts != 1 || a1.LastError != "HTTP 503" || !a1.NextAttempt.Equal(at.Add(time.Minute)) || !a1.EnqueuedAt.Equal(at) {
		t.Fatalf("a1 lost its delivery state: %+v", a1)
	}
	dead, _ := dst.Dead()
	if !slices.Equal(evIDs(dead), []string{"b1"}) || dead[0].LastError != "HTTP 400" {
		t.Fatalf("dead letters = %+v", dead)
	}
	if _, err := dst.Get("c1"); err == nil {
		t.Fatal("a delivered event was copied")
	}
	if p, d, dl, _ := dst.Counts(); p != 3 || d != 1 || dl != 0 {
		t.Fatalf("counts = %d %d %d", p, d, dl)
	}
	// A requeued dead letter goes back ahead of its stream's later event, as in the file.
	if _, err := dst.Requeue(at, "b1"); err != nil {
		t.Fatal(err)
	}
	if heads, _ := dst.Heads(0); !slices.Equal(evIDs(heads), []string{"b1", "a1"}) {
		t.Fatalf("heads after requeue = %v", evIDs(heads))
	}

	errb.Reset()
	if code := run([]string{"migrate-store", "--database-url", dbURL}, &out, &errb); code != 1 || !strings.Contains(errb.String(), "empty database only") {
		t.Fatalf("into a database with state: exit %d, stderr %q", code, errb.String())
	}
}

// TestMigrateStoreCopiesTheAuditLog: migrate-store copies the state directory's audit log into
// the database's table, and `audit` with the database URL then prints the table's records (every
// replica's) followed by the file's records that are not in the table (those the database could
// not take), each once.
func TestMigrateStoreCopiesTheAuditLog(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	dbURL := pgtest.New(t)
	t.Setenv("T3CODE_MCP_STATE_DIR", state)
	t.Setenv("T3CODE_MCP_DATABASE_URL", "")
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	l, err := audit.Open(state, audit.Options{MaxBytes: 300, Keep: 5}) // rotated files too
	if err != nil {
		t.Fatal(err)
	}
	write := func(r audit.Record) {
		t.Helper()
		if err := l.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	for i, th := range []string{"th-1", "th-2", "th-3"} {
		write(audit.Record{Time: at.Add(time.Duration(i) * time.Minute), Tool: "t3_dispatch", Machine: "mac", Thread: th, Approval: audit.NotRequired, Result: audit.ResultOK})
	}
	var out, errb bytes.Buffer
	if code := run([]string{"migrate-store", "--database-url", dbURL}, &out, &errb); code != 0 {
		t.Fatalf("migrate-store: exit %d, stderr %q", code, errb.String())
	}
	if !strings.Contains(out.String(), "copied 3 audit records from "+state) {
		t.Fatalf("stdout %q", out.String())
	}
	// Later: another replica's call in the table, and one this replica spilled to its file.
	db, err := pgstore.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.AppendAudit(context.Background(), []audit.Record{{Time: at.Add(time.Hour), Tool: "t3_interrupt", Machine: "mac", Thread: "th-4", Replica: "other"}}); err != nil {
		t.Fatal(err)
	}
	write(audit.Record{Time: at.Add(2 * time.Hour), Tool: "t3_answer", Machine: "mac", Thread: "th-5", Replica: "this"})
	l.Close()

	out.Reset()
	errb.Reset()
	if code := run([]string{"audit", "--json", "--database-url", dbURL}, &out, &errb); code != 0 || errb.String() != "" {
		t.Fatalf("audit: exit %d, stderr %q", code, errb.String())
	}
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		r, ok := audit.Decode([]byte(line))
		if !ok {
			t.Fatalf("not a record: %q", line)
		}
		got = append(got, r.Thread)
	}
	if want := []string{"th-1", "th-2", "th-3", "th-4", "th-5"}; !slices.Equal(got, want) {
		t.Fatalf("audit printed %v, want %v", got, want)
	}
	out.Reset()
	errb.Reset()
	if code := run([]string{"audit", "--thread", "th-4", "--database-url", dbURL}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "1 audit record from ") {
		t.Fatalf("audit --thread: exit %d, stderr %q, stdout %q", code, errb.String(), out.String())
	}
}
