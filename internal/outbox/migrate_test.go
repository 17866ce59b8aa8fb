package outbox

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"testing"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// writeSchema1 writes the state file in dir the way schema 1 did: one JSON record per event in
// ev_pending with the body base64 inside it, no ev_bodies bucket.
func writeSchema1(t *testing.T, dir string, evs []store.Event) {
	t.Helper()
	st, err := store.Open(dir) // the buckets
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	db, err := bolt.Open(filepath.Join(dir, store.FileName), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key := func(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
	err = db.Update(func(tx *bolt.Tx) error {
		// Schema 1 had no ev_bodies (schemas 2–4 had; 5 has none again).
		if err := tx.DeleteBucket([]byte("ev_bodies")); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		if err := tx.Bucket([]byte("meta")).Put([]byte("version"), key(1)); err != nil {
			return err
		}
		pending := tx.Bucket([]byte("ev_pending"))
		for _, e := range evs {
			seq, _ := pending.NextSequence()
			v, _ := json.Marshal(map[string]any{
				"id": e.ID, "stream": e.Stream, "body": e.Body, // []byte: base64, as schema 1 stored it
				"createdAt": t0, "enqueuedAt": t0, "state": "pending", "attempts": 0,
			})
			if err := pending.Put(key(seq), v); err != nil {
				return err
			}
			if err := tx.Bucket([]byte("ev_ids")).Put([]byte(e.ID), key(seq)); err != nil {
				return err
			}
			if err := tx.Bucket([]byte("ev_streams")).Put(append(append([]byte(e.Stream), 0), key(seq)...), nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A state file written by the previous schema is migrated at open and its pending events are
// delivered with their bodies byte for byte, in order.
func TestDeliversEventsOfASchema1File(t *testing.T) {
	dir := t.TempDir()
	evs := backlog(3, 4)
	writeSchema1(t, dir, evs)
	rc := newReceiver(t)
	h := startOn(t, dir, Config{URL: rc.srv.URL}, nil)
	eventually(t, "delivered", func() bool { p, _, dl := h.counts(); return p == 0 && dl == len(evs) })
	checkOrder(t, rc, 3, 4)
	sent := map[string][]byte{}
	for _, r := range rc.requests() {
		sent[r.ID] = r.Body
	}
	for _, e := range evs {
		if !reflect.DeepEqual(sent[e.ID], e.Body) {
			t.Fatalf("%s sent %s, want %s", e.ID, sent[e.ID], e.Body)
		}
	}
}
