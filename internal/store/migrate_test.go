package store

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// testdata/schema4.db.gz is a state file written by the schema 4 code (e538038, the bodies in
// ev_bodies): 1,000 delivered events (evt_00000 … evt_00999, body {"id":…,"type":
// "thread.completed","n":N}, created at t4+N s, delivered 1 ms later) committed with detector
// states, then pend-enrich (Enrich), pend-retried (one 503), pend-plain, dead-one (a 400), a
// tracked thread t900 and the idempotency key k1.
var t4 = time.Date(2026, 12, 1, 22, 0, 0, 0, time.UTC)

func openSchema4File(t *testing.T) (string, *Bolt) {
	t.Helper()
	f, err := os.Open("testdata/schema4.db.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(z)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, FileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, open(t, dir)
}

// An old state file passes through the migration to schema 5: every event reads back with its
// body and its state, the bodies are in the records and ev_bodies is gone, and the outbox's
// operations (enrich, deliver, requeue, prune) and new commits work on the migrated events,
// also after a reopen.
func TestMigrateFromSchema4File(t *testing.T) {
	dir, s := openSchema4File(t)
	defer func() { s.Close() }()
	if p, d, dl, _ := s.Counts(); p != 3 || d != 1 || dl != 1000 {
		t.Fatalf("Counts = %d %d %d, want 3 1 1000", p, d, dl)
	}
	for n := range 1000 {
		id := fmt.Sprintf("evt_%05d", n)
		e, err := s.Get(id)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`{"id":%q,"type":"thread.completed","n":%d}`, id, n)
		if string(e.Body) != want || e.State != StateDelivered || e.Seq != uint64(n+1) || !e.DeliveredAt.Equal(t4.Add(time.Duration(n)*time.Second+time.Millisecond)) {
			t.Fatalf("%s after migration: %+v body %s", id, e, e.Body)
		}
	}
	pend, err := s.Pending(0)
	if err != nil || len(pend) != 3 {
		t.Fatalf("Pending = %+v, %v", pend, err)
	}
	if e := pend[0]; e.ID != "pend-enrich" || !e.Enrich || string(e.Body) != `{"type":"thread.failed","partial":true}` {
		t.Fatalf("pend-enrich: %+v body %s", e, e.Body)
	}
	if e := pend[1]; e.ID != "pend-retried" || e.Attempts != 1 || e.LastError != "receiver: HTTP 503" || e.NextAttempt.IsZero() || string(e.Body) != `{"type":"thread.completed","n":"r"}` {
		t.Fatalf("pend-retried: %+v body %s", e, e.Body)
	}
	if e, err := s.Get("dead-one"); err != nil || e.State != StateDead || e.LastError != "receiver: HTTP 400" || string(e.Body) != `{"type":"thread.completed","n":"d"}` {
		t.Fatalf("dead-one: %+v %v", e, err)
	}
	if v, ok, err := s.Detector("m01\x00t0900"); err != nil || !ok || string(v) != `{"run":"last"}` {
		t.Fatalf("detector state: %s %v %v", v, ok, err)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bBodies) != nil {
			t.Error("ev_bodies is still there")
		}
		if v := tx.Bucket(bMeta).Get(kVersion); !bytes.Equal(v, seqKey(schemaVersion)) {
			t.Errorf("version = %x", v)
		}
		_, body, err := decodeRecord(seqKey(1), tx.Bucket(bDelivered).Get(seqKey(1)))
		if err != nil || string(body) != `{"id":"evt_00000","type":"thread.completed","n":0}` {
			t.Errorf("record 1: body %s, %v", body, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// The outbox's operations on the migrated events.
	enriched := []byte(`{"type":"thread.failed","error":"out of credits"}`)
	if errs, err := s.Record([]Op{{ID: "pend-enrich", Kind: OpBody, Body: enriched}}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	if err := s.MarkDelivered("pend-plain", t4.Add(3*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Requeue(t4.Add(3*time.Hour), "dead-one"); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	if n, err := s.Prune(t4.Add(500 * time.Second)); n != 500 || err != nil {
		t.Fatalf("Prune = %d %v, want 500", n, err)
	}
	if err := s.Commit(Batch{Events: []Event{{ID: "after", Stream: "m01/t900", Body: []byte(`{"n":"after"}`), CreatedAt: t4}}}); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for id, want := range map[string]string{"pend-enrich": string(enriched), "pend-plain": `{"type":"thread.completed","n":"p"}`,
			"dead-one": `{"type":"thread.completed","n":"d"}`, "evt_00500": `{"id":"evt_00500","type":"thread.completed","n":500}`, "after": `{"n":"after"}`} {
			e, err := s.Get(id)
			if err != nil || string(e.Body) != want {
				t.Fatalf("%s: %s: body %s, %v; want %s", when, id, e.Body, err, want)
			}
		}
		if e, _ := s.Get("pend-enrich"); e.Enrich {
			t.Fatalf("%s: pend-enrich still to enrich", when)
		}
		if e, _ := s.Get("pend-plain"); e.State != StateDelivered {
			t.Fatalf("%s: pend-plain %s", when, e.State)
		}
		if e, _ := s.Get("after"); e.Seq != 1005 {
			t.Fatalf("%s: a new event got sequence number %d, want 1005", when, e.Seq)
		}
		if _, err := s.Get("evt_00499"); err == nil {
			t.Fatalf("%s: a pruned event is still there", when)
		}
		if p, d, dl, _ := s.Counts(); p != 4 || d != 0 || dl != 501 {
			t.Fatalf("%s: Counts = %d %d %d, want 4 0 501", when, p, d, dl)
		}
	}
	check("migrated")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	check("reopened")
}
