package store

import (
	"runtime"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestGroupFailsABatchAlone: batches waiting for the same commit are written in one
// transaction, and when one of them cannot be written the others are still written and only its
// caller gets the error.
func TestGroupFailsABatchAlone(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(s)

	// Hold bbolt's writer lock so that the batches committed meanwhile queue up behind it.
	tx, err := s.db.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	go func() { first <- g.Commit(Batch{Events: []Event{ev("g1", "a")}}) }()
	pending := func() int {
		g.mu.Lock()
		defer g.mu.Unlock()
		return len(g.pending)
	}
	writing := func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.writing && len(g.pending) == 0
	}
	for !writing() { // the first batch's writer took it and waits for the lock
		runtime.Gosched()
	}
	good, bad := make(chan error, 1), make(chan error, 1)
	go func() { good <- g.Commit(Batch{Events: []Event{ev("g2", "b")}}) }()
	// bbolt: key too large (an empty key would be refused before the group, by validate).
	go func() {
		bad <- g.Commit(Batch{Detector: map[string][]byte{strings.Repeat("k", bolt.MaxKeySize+1): []byte("x")}})
	}()
	for pending() < 2 {
		runtime.Gosched()
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}

	if err := <-first; err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if err := <-good; err != nil {
		t.Fatalf("a good batch grouped with a failing one: %v", err)
	}
	if err := <-bad; err == nil {
		t.Fatal("a batch with a too large detector key was written")
	}
	if e, err := s.Get("g2"); err != nil || e.Stream != "b" {
		t.Fatalf("g2 after the group: %+v %v", e, err)
	}
	if txs, batches := g.Stats(); txs != 2 || batches != 3 {
		t.Fatalf("Stats = %d transactions, %d batches; want 2, 3 (the last two grouped)", txs, batches)
	}
}
