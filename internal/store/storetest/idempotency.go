package storetest

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// The t3_dispatch idempotency keys (moved here from internal/store).

func testIdempotencyClaimOnceAcrossReopen(t *testing.T, open Opener) {
	s, reopen := open(t)
	first := store.Idempotency{Key: "k1", Record: json.RawMessage(`{"thread":"a"}`), CreatedAt: T0}
	got, claimed, err := s.ClaimIdempotency(first)
	if err != nil || !claimed || got.Key != "k1" {
		t.Fatalf("first claim = %+v, %v, %v", got, claimed, err)
	}
	got, claimed, err = s.ClaimIdempotency(store.Idempotency{Key: "k1", Record: json.RawMessage(`{"thread":"b"}`), CreatedAt: T0.Add(1)})
	if err != nil || claimed || string(got.Record) != `{"thread":"a"}` || !got.CreatedAt.Equal(T0) {
		t.Fatalf("second claim = %+v, %v, %v; want the first entry, not claimed", got, claimed, err)
	}
	if err := s.UpdateIdempotency("k1", json.RawMessage(`{"thread":"a","run":"r"}`)); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := s.GetIdempotency("k1"); err != nil || !ok || string(e.Record) != `{"thread":"a","run":"r"}` || !e.CreatedAt.Equal(T0) {
		t.Fatalf("get = %+v, %v, %v", e, ok, err)
	}
	if _, ok, err := s.GetIdempotency("nope"); err != nil || ok {
		t.Fatalf("get of an unknown key = %v, %v", ok, err)
	}
	if err := s.UpdateIdempotency("nope", json.RawMessage(`{}`)); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of an unknown key = %v, want store.ErrNotFound", err)
	}
	s = reopen(t)
	t.Cleanup(func() { s.Close() })
	got, claimed, err = s.ClaimIdempotency(store.Idempotency{Key: "k1", Record: json.RawMessage(`{}`), CreatedAt: T0})
	if err != nil || claimed || string(got.Record) != `{"thread":"a","run":"r"}` {
		t.Fatalf("after reopen = %+v, %v, %v; want the updated first entry", got, claimed, err)
	}
	if err := s.DeleteIdempotency("k1"); err != nil {
		t.Fatal(err)
	}
	if _, claimed, _ := s.ClaimIdempotency(store.Idempotency{Key: "k1", Record: json.RawMessage(`{}`), CreatedAt: T0}); !claimed {
		t.Fatal("a deleted key could not be claimed again")
	}
	if _, _, err := s.ClaimIdempotency(store.Idempotency{Key: "", Record: json.RawMessage(`{}`)}); err == nil {
		t.Fatal("an empty key was accepted")
	}
}

func testIdempotencyConcurrentClaimsOneWinner(t *testing.T, open Opener) {
	s, _ := open(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for range 16 {
		wg.Go(func() {
			_, claimed, err := s.ClaimIdempotency(store.Idempotency{Key: "same", Record: json.RawMessage(`{}`), CreatedAt: T0})
			if err != nil {
				t.Error(err)
			}
			if claimed {
				mu.Lock()
				winners++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if winners != 1 {
		t.Fatalf("%d claims won, want exactly 1", winners)
	}
}

func testIdempotencyPrune(t *testing.T, open Opener) {
	s, _ := open(t)
	for i, k := range []string{"old1", "old2", "new"} {
		at := T0.Add(-48 * time.Hour)
		if i == 2 {
			at = T0
		}
		if _, _, err := s.ClaimIdempotency(store.Idempotency{Key: k, Record: json.RawMessage(`{}`), CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.PruneIdempotency(T0.Add(-time.Hour))
	if err != nil || n != 2 {
		t.Fatalf("prune = %d, %v; want 2", n, err)
	}
	if _, claimed, _ := s.ClaimIdempotency(store.Idempotency{Key: "new", Record: json.RawMessage(`{}`), CreatedAt: T0}); claimed {
		t.Fatal("the recent key was pruned")
	}
	if _, claimed, _ := s.ClaimIdempotency(store.Idempotency{Key: "old1", Record: json.RawMessage(`{}`), CreatedAt: T0}); !claimed {
		t.Fatal("an old key survived the prune")
	}
}
