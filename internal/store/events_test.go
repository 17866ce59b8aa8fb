package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// TestMigrateFromSchema1 writes a file the way schema 1 did (one JSON record per event with the
// body base64 inside, no ev_bodies bucket), opens it with this binary and reads the events back.
func TestMigrateFromSchema1(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	s.Close()

	// Rewrite the fresh file as schema 1 with three events: pending (two in one stream, one
	// retried), dead and delivered.
	db, err := bolt.Open(s.Path(), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	type v1 struct {
		ID          string    `json:"id"`
		Stream      string    `json:"stream"`
		Body        []byte    `json:"body"`
		CreatedAt   time.Time `json:"createdAt"`
		EnqueuedAt  time.Time `json:"enqueuedAt"`
		State       string    `json:"state"`
		Attempts    int       `json:"attempts"`
		NextAttempt time.Time `json:"nextAttempt,omitzero"`
		LastError   string    `json:"lastError,omitempty"`
		DeliveredAt time.Time `json:"deliveredAt,omitzero"`
		DeadAt      time.Time `json:"deadAt,omitzero"`
	}
	recs := []struct {
		bucket []byte
		seq    uint64
		r      v1
	}{
		{bPending, 1, v1{ID: "p1", Stream: "m/a", Body: []byte(`{"n":1}`), CreatedAt: t0, EnqueuedAt: t0, State: StatePending, Attempts: 2, NextAttempt: t0.Add(time.Minute), LastError: "receiver: HTTP 503"}},
		{bDead, 2, v1{ID: "d2", Stream: "m/b", Body: []byte(`{"n":2}`), CreatedAt: t0, EnqueuedAt: t0, State: StateDead, Attempts: 1, DeadAt: t0, LastError: "receiver: HTTP 400"}},
		{bDelivered, 3, v1{ID: "x3", Stream: "m/b", Body: []byte(`{"n":3}`), CreatedAt: t0, EnqueuedAt: t0, State: StateDelivered, Attempts: 1, DeliveredAt: t0}},
		{bPending, 4, v1{ID: "p4", Stream: "m/a", Body: []byte(`{"n":4}`), CreatedAt: t0, EnqueuedAt: t0, State: StatePending}},
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bBodies); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		if err := tx.Bucket(bMeta).Put(kVersion, seqKey(1)); err != nil {
			return err
		}
		if err := tx.Bucket(bPending).SetSequence(4); err != nil {
			return err
		}
		for _, r := range recs {
			v, _ := json.Marshal(r.r)
			if err := tx.Bucket(r.bucket).Put(seqKey(r.seq), v); err != nil {
				return err
			}
			if err := tx.Bucket(bEventIDs).Put([]byte(r.r.ID), seqKey(r.seq)); err != nil {
				return err
			}
			if r.r.State == StatePending {
				if err := tx.Bucket(bHeads).Put(headKey(r.r.Stream, r.seq), nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	s = open(t, dir)
	if p, d, dl, _ := s.Counts(); p != 2 || d != 1 || dl != 1 {
		t.Fatalf("Counts = %d %d %d", p, d, dl)
	}
	for _, r := range recs {
		e, err := s.Get(r.r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Body) != string(r.r.Body) || e.State != r.r.State || e.Attempts != r.r.Attempts || e.Seq != r.seq || e.LastError != r.r.LastError || !e.NextAttempt.Equal(r.r.NextAttempt) {
			t.Fatalf("%s after migration: %#v (body %s)", r.r.ID, e, e.Body)
		}
	}
	// The raw body, not base64, is what is stored now, in the record.
	_ = s.db.View(func(tx *bolt.Tx) error {
		if _, body, err := decodeRecord(seqKey(1), tx.Bucket(bPending).Get(seqKey(1))); err != nil || string(body) != `{"n":1}` {
			t.Errorf("stored body = %q (%v)", body, err)
		}
		if tx.Bucket(bBodies) != nil {
			t.Error("ev_bodies is still there")
		}
		if v := tx.Bucket(bMeta).Get(kVersion); !reflect.DeepEqual(v, seqKey(schemaVersion)) {
			t.Errorf("version = %v", v)
		}
		return nil
	})
	if err := s.MarkDelivered("p1", t0); err != nil {
		t.Fatal(err)
	}
	if h, _ := s.Heads(0); len(h) != 1 || h[0].ID != "p4" || string(h[0].Body) != `{"n":4}` {
		t.Fatalf("heads = %#v", h)
	}
	// Sequences continue after the migrated ones.
	if err := s.Commit(Batch{Events: []Event{ev("n5", "m/a")}}); err != nil {
		t.Fatal(err)
	}
	if e, _ := s.Get("n5"); e.Seq != 5 {
		t.Fatalf("new seq = %d", e.Seq)
	}
}

func TestRecordBatch(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Commit(Batch{Events: []Event{ev("a1", "m/a"), ev("a2", "m/a"), ev("b1", "m/b"), ev("c1", "m/c")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDead("c1", t0, "gone"); err != nil {
		t.Fatal(err)
	}
	errs, err := s.Record([]Op{
		{ID: "a1", Kind: OpDelivered, At: t0, Body: []byte(`{"enriched":true}`)},
		{ID: "b1", Kind: OpRetry, Next: t0.Add(time.Minute), Error: "receiver: HTTP 503", Body: []byte(`{"b":1}`)},
		{ID: "c1", Kind: OpDelivered, At: t0}, // dead: skipped
		{ID: "nope", Kind: OpDead, At: t0},    // unknown: skipped
		{ID: "a2", Kind: OpBody, Body: []byte(`not json`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrNotPending) || !errors.Is(errs[3], ErrNotFound) || errs[4] == nil {
		t.Fatalf("errs = %v", errs)
	}
	a1, _ := s.Get("a1")
	b1, _ := s.Get("b1")
	if a1.State != StateDelivered || string(a1.Body) != `{"enriched":true}` || a1.Enrich || a1.Attempts != 1 {
		t.Fatalf("a1 = %#v %s", a1, a1.Body)
	}
	if b1.State != StatePending || b1.Attempts != 1 || !b1.NextAttempt.Equal(t0.Add(time.Minute)) || string(b1.Body) != `{"b":1}` {
		t.Fatalf("b1 = %#v %s", b1, b1.Body)
	}
	if p, d, dl, _ := s.Counts(); p != 2 || d != 1 || dl != 1 {
		t.Fatalf("Counts = %d %d %d", p, d, dl)
	}
}

func TestEnrichFlagAndBodyOp(t *testing.T) {
	s := open(t, t.TempDir())
	e := ev("e1", "m/a")
	e.Enrich = true
	if err := s.Commit(Batch{Events: []Event{e}}); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get("e1"); !got.Enrich {
		t.Fatal("Enrich not stored")
	}
	if errs, err := s.Record([]Op{{ID: "e1", Kind: OpBody, Body: []byte(`{"full":1}`)}}); err != nil || errs[0] != nil {
		t.Fatal(err, errs)
	}
	got, _ := s.Get("e1")
	if got.Enrich || got.Attempts != 0 || got.State != StatePending || string(got.Body) != `{"full":1}` {
		t.Fatalf("after OpBody: %#v %s", got, got.Body)
	}
}

func TestPendingIndexAndAfter(t *testing.T) {
	s := open(t, t.TempDir())
	if err := s.Commit(Batch{Events: []Event{ev("a1", "m/a"), ev("b1", "m/b"), ev("a2", "m/a")}}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivered("b1", t0); err != nil {
		t.Fatal(err)
	}
	var got []string
	last, err := s.PendingIndex(func(stream string, seq uint64) { got = append(got, fmt.Sprintf("%s#%d", stream, seq)) })
	if err != nil || last != 3 || !reflect.DeepEqual(got, []string{"m/a#1", "m/a#3"}) {
		t.Fatalf("PendingIndex = %v %d %v", got, last, err)
	}
	if err := s.Commit(Batch{Events: []Event{ev("c1", "m/c"), ev("a3", "m/a")}}); err != nil {
		t.Fatal(err)
	}
	after, err := s.PendingAfter(last, 0)
	if err != nil || !reflect.DeepEqual(ids(after), []string{"c1", "a3"}) || after[0].Body != nil || after[1].Seq != 5 {
		t.Fatalf("PendingAfter = %#v %v", after, err)
	}
	if one, _ := s.PendingAfter(last, 1); len(one) != 1 {
		t.Fatalf("limit: %d", len(one))
	}
	e, err := s.PendingEvent(5, true)
	if err != nil || e.ID != "a3" || string(e.Body) != `{"id":"a3"}` {
		t.Fatalf("PendingEvent = %#v %v", e, err)
	}
	if _, err := s.PendingEvent(2, false); !errors.Is(err, ErrNotPending) {
		t.Fatalf("delivered seq: %v", err)
	}
}

// TestCountsIncremental: the in-memory counts follow every kind of write and agree with the
// buckets after a reopen.
func TestCountsIncremental(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	var batch []Event
	for i := range 20 {
		batch = append(batch, ev(fmt.Sprintf("e%02d", i), fmt.Sprintf("s%d", i%4)))
	}
	if err := s.Commit(Batch{Events: batch}); err != nil {
		t.Fatal(err)
	}
	_ = s.Commit(Batch{Events: batch[:3]}) // duplicates change nothing
	for i := range 6 {
		if err := s.MarkDelivered(fmt.Sprintf("e%02d", i), t0.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	for i := 6; i < 10; i++ {
		if err := s.MarkDead(fmt.Sprintf("e%02d", i), t0, "x"); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Requeue(t0, "e06", "e07"); n != 2 || err != nil {
		t.Fatal(n, err)
	}
	if n, err := s.Prune(t0.Add(3 * time.Minute)); n != 3 || err != nil {
		t.Fatal(n, err)
	}
	check := func(when string) {
		t.Helper()
		p, d, dl, _ := s.Counts()
		var kp, kd, kdl int
		_ = s.db.View(func(tx *bolt.Tx) error {
			kp, kd, kdl = tx.Bucket(bPending).Stats().KeyN, tx.Bucket(bDead).Stats().KeyN, tx.Bucket(bDelivered).Stats().KeyN
			return nil
		})
		if p != 12 || d != 2 || dl != 3 || p != kp || d != kd || dl != kdl {
			t.Fatalf("%s: Counts = %d %d %d, buckets %d %d %d", when, p, d, dl, kp, kd, kdl)
		}
	}
	check("live")
	s.Close()
	s = open(t, dir)
	check("after reopen")
}

// splitRecords writes the events' records of tx the way schemas 2–4 stored them: the header in the
// state's bucket, the body under the same key in ev_bodies.
func splitRecords(tx *bolt.Tx) error {
	bodies, err := tx.CreateBucket(bBodies)
	if err != nil {
		return err
	}
	for _, name := range [][]byte{bPending, bDead, bDelivered} {
		b := tx.Bucket(name)
		err := inChunks(b, func(k, v []byte) error {
			e, body, err := decodeRecord(k, v)
			if err != nil {
				return err
			}
			if err := putHeader(b, e); err != nil {
				return err
			}
			return bodies.Put(k, body)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// TestMigrateFromSchema2 opens a schema 2 file (delivered events, no delivery-time index): the
// index is built at Open, so a prune finds the events delivered before its cutoff.
func TestMigrateFromSchema2(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	if err := s.Commit(Batch{Events: []Event{{ID: "old", Stream: "m/a", Body: []byte(`{}`)}, {ID: "new", Stream: "m/b", Body: []byte(`{}`)}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivered("new", t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivered("old", t0); err != nil {
		t.Fatal(err)
	}
	// Back to schema 2: no index, the bodies beside the headers.
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := splitRecords(tx); err != nil {
			return err
		}
		if err := tx.DeleteBucket(bDeliveredAt); err != nil {
			return err
		}
		return tx.Bucket(bMeta).Put(kVersion, seqKey(2))
	})
	s.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	if n, err := s.Prune(t0.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("Prune after migration = %d %v, want 1", n, err)
	}
	if _, err := s.Get("old"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("old: %v", err)
	}
	if e, err := s.Get("new"); err != nil || e.State != StateDelivered {
		t.Fatalf("new: %+v %v", e, err)
	}
}
