package pgstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
)

// TestClaimHeadsKeepsFreshClaims: asking again for a head one holds with at least two thirds of
// the TTL left answers it claimed, with the time left, and writes no new row version (a replica's
// loop asks again for heads it waits to send); with less left the claim is renewed for the TTL.
func TestClaimHeadsKeepsFreshClaims(t *testing.T) {
	s, url := open(t)
	if err := s.Commit(store.Batch{Events: []store.Event{storetest.Ev("a1", "a")}}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// version is the row's current version: its creating transaction and place, both new on
	// every update (a row lock would change xmax, not these; it is not taken either).
	version := func() string {
		t.Helper()
		var v string
		if err := conn.QueryRow(ctx, `SELECT xmin::text || ctid::text FROM t3_events WHERE id = 'a1'`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	claim := func(who string, ttl time.Duration) store.HeadClaim {
		t.Helper()
		cs, err := s.ClaimHeads([]string{"a"}, who, ttl)
		if err != nil || len(cs) != 1 {
			t.Fatalf("ClaimHeads: %+v %v", cs, err)
		}
		return cs[0]
	}
	c := claim("A", time.Minute)
	if !c.Claimed || c.Event.ID != "a1" || c.Left <= 40*time.Second || c.Left > time.Minute {
		t.Fatalf("first claim: %+v", c)
	}
	claimed := version()
	c = claim("A", time.Minute)
	if !c.Claimed || c.Event.ID != "a1" || string(c.Event.Body) != string(storetest.Ev("a1", "a").Body) || c.Left <= 40*time.Second || c.Left > time.Minute {
		t.Fatalf("asked again: %+v", c)
	}
	if v := version(); v != claimed {
		t.Fatalf("asking again for a fresh claim wrote the row (%s → %s)", claimed, v)
	}
	if c := claim("B", time.Hour); c.Claimed {
		t.Fatalf("B took A's kept claim: %+v", c)
	}
	// Asked with a TTL of an hour, A's claim (a minute left) has less than two thirds of it.
	c = claim("A", time.Hour)
	if !c.Claimed || c.Left <= 40*time.Minute || c.Left > time.Hour {
		t.Fatalf("renewal: %+v", c)
	}
	if v := version(); v == claimed {
		t.Fatal("a claim with less than two thirds of its TTL left was not renewed")
	}
	if n, err := s.ReleaseClaims("A"); err != nil || n != 1 {
		t.Fatalf("ReleaseClaims(A) = %d, %v", n, err)
	}
	if c := claim("B", time.Hour); !c.Claimed {
		t.Fatal("B could not claim the released head")
	}
}
