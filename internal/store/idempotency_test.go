package store

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
)

func TestIdempotencyClaimOnceAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	first := Idempotency{Key: "k1", Record: json.RawMessage(`{"thread":"a"}`), CreatedAt: t0}
	got, claimed, err := s.ClaimIdempotency(first)
	if err != nil || !claimed || got.Key != "k1" {
		t.Fatalf("first claim = %+v, %v, %v", got, claimed, err)
	}
	got, claimed, err = s.ClaimIdempotency(Idempotency{Key: "k1", Record: json.RawMessage(`{"thread":"b"}`), CreatedAt: t0.Add(1)})
	if err != nil || claimed || string(got.Record) != `{"thread":"a"}` || !got.CreatedAt.Equal(t0) {
		t.Fatalf("second claim = %+v, %v, %v; want the first entry, not claimed", got, claimed, err)
	}
	if err := s.UpdateIdempotency("k1", json.RawMessage(`{"thread":"a","run":"r"}`)); err != nil {
		t.Fatal(err)
	}
	if e, ok, err := s.GetIdempotency("k1"); err != nil || !ok || string(e.Record) != `{"thread":"a","run":"r"}` || !e.CreatedAt.Equal(t0) {
		t.Fatalf("get = %+v, %v, %v", e, ok, err)
	}
	if _, ok, err := s.GetIdempotency("nope"); err != nil || ok {
		t.Fatalf("get of an unknown key = %v, %v", ok, err)
	}
	if err := s.UpdateIdempotency("nope", json.RawMessage(`{}`)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("update of an unknown key = %v, want ErrNotFound", err)
	}
	s.Close()

	s = open(t, dir)
	got, claimed, err = s.ClaimIdempotency(Idempotency{Key: "k1", Record: json.RawMessage(`{}`), CreatedAt: t0})
	if err != nil || claimed || string(got.Record) != `{"thread":"a","run":"r"}` {
		t.Fatalf("after reopen = %+v, %v, %v; want the updated first entry", got, claimed, err)
	}
	if err := s.DeleteIdempotency("k1"); err != nil {
		t.Fatal(err)
	}
	if _, claimed, _ := s.ClaimIdempotency(Idempotency{Key: "k1", Record: json.RawMessage(`{}`), CreatedAt: t0}); !claimed {
		t.Fatal("a deleted key could not be claimed again")
	}
	if _, _, err := s.ClaimIdempotency(Idempotency{Key: "", Record: json.RawMessage(`{}`)}); err == nil {
		t.Fatal("an empty key was accepted")
	}
}

func TestIdempotencyConcurrentClaimsOneWinner(t *testing.T) {
	s := open(t, t.TempDir())
	var wg sync.WaitGroup
	var mu sync.Mutex
	winners := 0
	for range 16 {
		wg.Go(func() {
			_, claimed, err := s.ClaimIdempotency(Idempotency{Key: "same", Record: json.RawMessage(`{}`), CreatedAt: t0})
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

func TestIdempotencyPrune(t *testing.T) {
	s := open(t, t.TempDir())
	for i, k := range []string{"old1", "old2", "new"} {
		at := t0.Add(-48 * 3600e9)
		if i == 2 {
			at = t0
		}
		if _, _, err := s.ClaimIdempotency(Idempotency{Key: k, Record: json.RawMessage(`{}`), CreatedAt: at}); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.PruneIdempotency(t0.Add(-3600e9))
	if err != nil || n != 2 {
		t.Fatalf("prune = %d, %v; want 2", n, err)
	}
	if _, claimed, _ := s.ClaimIdempotency(Idempotency{Key: "new", Record: json.RawMessage(`{}`), CreatedAt: t0}); claimed {
		t.Fatal("the recent key was pruned")
	}
	if _, claimed, _ := s.ClaimIdempotency(Idempotency{Key: "old1", Record: json.RawMessage(`{}`), CreatedAt: t0}); !claimed {
		t.Fatal("an old key survived the prune")
	}
}
