package store

import (
	"bytes"
	"slices"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// handed collects what a Group's OnDurable hands over.
type handed struct {
	mu  sync.Mutex
	evs []Event
}

func (h *handed) take(evs []Event) {
	h.mu.Lock()
	h.evs = append(h.evs, evs...) // a copy: the group reuses its slice
	h.mu.Unlock()
}

func (h *handed) ids() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return ids(h.evs)
}

// TestGroupOnDurableHandsOverWhatIsDurable: the events a group commit appended are handed over
// once, as stored (their sequence numbers, bodies and queue times), before their Commit returns;
// a duplicate id is not (it was not appended), nor are the events of a batch that failed, and the
// events of a transaction that failed as a whole are handed over once, by the retry that wrote them.
func TestGroupOnDurableHandsOverWhatIsDurable(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(s)
	h := &handed{}
	if !g.OnDurable(h.take) {
		t.Fatal("OnDurable refused on the bbolt store")
	}
	// commit commits b and reports, as Commit returns, whether its events were handed over.
	commit := func(b Batch, out chan<- error, seen chan<- []string) {
		err := g.Commit(b)
		out <- err
		seen <- h.ids()
	}
	first, firstSeen := make(chan error, 1), make(chan []string, 1)
	release := holdWriter(t, s, g, func() { commit(Batch{Events: []Event{ev("d1", "a")}}, first, firstSeen) })
	good, goodSeen := make(chan error, 1), make(chan []string, 1)
	go commit(Batch{Events: []Event{ev("d1", "a"), ev("d2", "b")}}, good, goodSeen) // d1 again: skipped
	bad, badSeen := make(chan error, 1), make(chan []string, 1)
	go commit(Batch{Events: []Event{ev("d3", "c")}, Detector: map[string][]byte{strings.Repeat("k", bolt.MaxKeySize+1): []byte("x")}}, bad, badSeen)
	waitPending(g, 2)
	release()

	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if seen := <-firstSeen; !slices.Contains(seen, "d1") {
		t.Fatalf("Commit returned before its event was handed over: %v", seen)
	}
	if err := <-good; err != nil {
		t.Fatal(err)
	}
	if seen := <-goodSeen; !slices.Contains(seen, "d2") {
		t.Fatalf("Commit returned before its event was handed over: %v", seen)
	}
	if err := <-bad; err == nil {
		t.Fatal("the batch with a too large key was written")
	}
	<-badSeen
	if got := h.ids(); !slices.Equal(got, []string{"d1", "d2"}) {
		t.Fatalf("handed over %v, want [d1 d2] (d1 once, d3 never)", got)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.evs {
		stored, err := s.Get(e.ID)
		if err != nil {
			t.Fatal(err)
		}
		if e.Seq != stored.Seq || !bytes.Equal(e.Body, stored.Body) || e.Stream != stored.Stream || !e.EnqueuedAt.Equal(stored.EnqueuedAt) ||
			!e.CreatedAt.Equal(stored.CreatedAt) || e.State != StatePending || e.Attempts != 0 {
			t.Errorf("handed over %+v, stored %+v", e, stored)
		}
	}
}

// TestGroupOnDurableNeedsOpsCommitter: a store that cannot report what it appended (the PostgreSQL
// one) has no hand-over; its events are read back as before.
func TestGroupOnDurableNeedsOpsCommitter(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(onlyStore{s})
	called := false
	if g.OnDurable(func([]Event) { called = true }) {
		t.Fatal("OnDurable accepted on a store without CommitBatchesAndOps")
	}
	if err := g.Commit(Batch{Events: []Event{ev("n1", "a")}}); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Fatal("handed over without an OpsCommitter")
	}
}
