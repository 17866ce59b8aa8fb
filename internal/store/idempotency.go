package store

import (
	"encoding/json"
	"errors"
	"time"

	bolt "go.etcd.io/bbolt"
)

// bIdempotency holds t3_dispatch idempotency keys: key → JSON Idempotency. A new bucket in an
// existing file is created at Open (init), so no schema bump is needed.
var bIdempotency = []byte("idempotency")

// Idempotency is what the first call made with an idempotency key did. Record is opaque to the
// store (the tools package owns its encoding: the ids and commands of that call, so a retry
// resends the same commands and T3 applies them once).
type Idempotency struct {
	Key       string          `json:"key"`
	Record    json.RawMessage `json:"record"`
	CreatedAt time.Time       `json:"createdAt"` // the retention period counts from here
}

// ClaimIdempotency stores rec under its key unless the key is already stored: the claim is
// atomic, so of two calls racing with one key (in this process or, on a shared database, in
// another) exactly one gets claimed == true. When the key is taken, the stored entry is
// returned and nothing is written.
func (s *Bolt) ClaimIdempotency(rec Idempotency) (stored Idempotency, claimed bool, err error) {
	if rec.Key == "" || !json.Valid(rec.Record) {
		return Idempotency{}, false, errors.New("store: an idempotency entry needs a key and a JSON record")
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bIdempotency)
		if v := b.Get([]byte(rec.Key)); v != nil {
			return json.Unmarshal(v, &stored)
		}
		v, err := json.Marshal(rec)
		if err != nil {
			return err
		}
		stored, claimed = rec, true
		return b.Put([]byte(rec.Key), v)
	})
	return stored, claimed, err
}

// GetIdempotency returns the entry stored under key.
func (s *Bolt) GetIdempotency(key string) (Idempotency, bool, error) {
	var e Idempotency
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bIdempotency).Get([]byte(key))
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &e)
	})
	return e, ok, err
}

// UpdateIdempotency replaces the record of a stored key, keeping its CreatedAt; ErrNotFound when
// the key is not stored (pruned meanwhile).
func (s *Bolt) UpdateIdempotency(key string, record json.RawMessage) error {
	if !json.Valid(record) {
		return errors.New("store: an idempotency record must be JSON")
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bIdempotency)
		v := b.Get([]byte(key))
		if v == nil {
			return ErrNotFound
		}
		var e Idempotency
		if err := json.Unmarshal(v, &e); err != nil {
			return err
		}
		e.Record = record
		nv, err := json.Marshal(e)
		if err != nil {
			return err
		}
		return b.Put([]byte(key), nv)
	})
}

// DeleteIdempotency forgets a key (a first call T3 definitely refused, so a retry starts afresh);
// deleting an unknown key is not an error.
func (s *Bolt) DeleteIdempotency(key string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bIdempotency).Delete([]byte(key)) })
}

// PruneIdempotency forgets the keys created before before and returns how many.
func (s *Bolt) PruneIdempotency(before time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bIdempotency)
		var old [][]byte
		if err := b.ForEach(func(k, v []byte) error {
			var e Idempotency
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			if e.CreatedAt.Before(before) {
				old = append(old, append([]byte(nil), k...))
			}
			return nil
		}); err != nil {
			return err
		}
		for _, k := range old {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(old)
		return nil
	})
	return n, err
}

// Idempotencies lists every stored idempotency key (migrate-store copies them, so a retry made
// after the move still finds its first call).
func (s *Bolt) Idempotencies() ([]Idempotency, error) {
	var out []Idempotency
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bIdempotency).ForEach(func(_, v []byte) error {
			var e Idempotency
			if err := json.Unmarshal(v, &e); err != nil {
				return err
			}
			out = append(out, e)
			return nil
		})
	})
	return out, err
}
