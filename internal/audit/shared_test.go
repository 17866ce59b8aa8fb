package audit

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memTable is a Table in memory: it can hold its inserts at a gate, or fail them.
type memTable struct {
	mu      sync.Mutex
	recs    []Record
	calls   int
	fail    int           // fail this many inserts first (-1: all)
	entered chan struct{} // when set, each insert signals it here, then waits for release
	release chan struct{}
	stored  chan int // when set, each successful insert sends its record count here
}

func (m *memTable) AppendAudit(ctx context.Context, recs []Record) error {
	if m.entered != nil {
		m.entered <- struct{}{}
		select {
		case <-m.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.fail < 0 || m.calls <= m.fail {
		return errors.New("database away")
	}
	m.recs = append(m.recs, recs...)
	if m.stored != nil {
		m.stored <- len(recs)
	}
	return nil
}

func (m *memTable) tools() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, r := range m.recs {
		out = append(out, r.Tool+"@"+r.Replica)
	}
	return out
}

func fileTools(t *testing.T, dir string) []string {
	var out []string
	for _, r := range all(t, dir, Filter{}) {
		out = append(out, r.Tool+"@"+r.Replica)
	}
	return out
}

func newShared(t *testing.T, tb Table, o SharedOptions) (*Shared, string) {
	t.Helper()
	dir := t.TempDir()
	f, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	o.Replica = "r1"
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return NewShared(tb, f, o), dir
}

// While the database holds an insert, Write still returns at once: records wait in the buffer,
// and once it is full they go to the replica's file instead — none is lost, none waits. When the
// database answers, the buffered ones are stored, in order, with the replica named.
func TestSharedNeverWaitsAndSpillsToTheFileWhenFull(t *testing.T) {
	tb := &memTable{entered: make(chan struct{}), release: make(chan struct{})}
	s, dir := newShared(t, tb, SharedOptions{Buffer: 2})
	if err := s.Write(Record{Tool: "a"}); err != nil {
		t.Fatal(err)
	}
	<-tb.entered // the writer holds "a" in an insert the database does not answer
	for _, tool := range []string{"b", "c", "d", "e"} {
		if err := s.Write(Record{Tool: tool}); err != nil { // returns although the database is stuck
			t.Fatal(err)
		}
	}
	if got := fileTools(t, dir); !slices.Equal(got, []string{"d@r1", "e@r1"}) {
		t.Fatalf("file holds %v, want the two records the full buffer could not take", got)
	}
	if s.Spilled() != 2 {
		t.Fatalf("Spilled = %d, want 2", s.Spilled())
	}
	close(tb.release) // the database answers: every later insert passes the gate at once
	go func() {
		for range tb.entered {
		}
	}()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	close(tb.entered)
	if got := tb.tools(); !slices.Equal(got, []string{"a@r1", "b@r1", "c@r1"}) {
		t.Fatalf("table holds %v", got)
	}
	if s.stored.Load() != 3 {
		t.Fatalf("Stored = %d, want 3", s.stored.Load())
	}
}

// A failed insert is retried (backoff) and stored: nothing goes to the file.
func TestSharedRetriesAFailedInsert(t *testing.T) {
	tb := &memTable{fail: 1, stored: make(chan int, 4)}
	s, dir := newShared(t, tb, SharedOptions{})
	for _, tool := range []string{"a", "b"} {
		if err := s.Write(Record{Tool: tool}); err != nil {
			t.Fatal(err)
		}
	}
	for n := 0; n < 2; n += <-tb.stored { // stored by the writer's retries, before any Close
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := tb.tools(); !slices.Equal(got, []string{"a@r1", "b@r1"}) {
		t.Fatalf("table holds %v", got)
	}
	if got := fileTools(t, dir); len(got) != 0 || s.Spilled() != 0 {
		t.Fatalf("file holds %v (spilled %d), want nothing", got, s.Spilled())
	}
}

// A database that never takes the records: Close stops retrying, and what was buffered goes to
// the file, so the records survive the shutdown. Writes after Close fail loudly.
func TestSharedCloseSpillsWhatTheDatabaseRefuses(t *testing.T) {
	tb := &memTable{fail: -1}
	s, dir := newShared(t, tb, SharedOptions{})
	for _, tool := range []string{"a", "b", "c"} {
		if err := s.Write(Record{Tool: tool}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if got := fileTools(t, dir); !slices.Equal(got, []string{"a@r1", "b@r1", "c@r1"}) {
		t.Fatalf("file holds %v, want every record", got)
	}
	if s.Spilled() != 3 || s.stored.Load() != 0 {
		t.Fatalf("spilled %d stored %d", s.Spilled(), s.stored.Load())
	}
	if err := s.Write(Record{Tool: "late"}); err == nil {
		t.Fatal("a write after Close succeeded")
	}
}
