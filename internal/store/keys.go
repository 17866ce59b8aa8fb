package store

import (
	"encoding/json"
	"time"
)

// DispatchKeys is a Store's idempotency keys in plain values: the operations t3_dispatch uses
// (tools.IdempotencyKeys), so that internal/tools keeps its keys without importing the store.
type DispatchKeys struct{ Store Store }

// Claim stores record under key unless the key is already stored: then it returns the stored
// record and writes nothing (of two racing calls exactly one gets claimed).
func (k DispatchKeys) Claim(key string, record json.RawMessage, at time.Time) (stored json.RawMessage, claimed bool, err error) {
	e, claimed, err := k.Store.ClaimIdempotency(Idempotency{Key: key, Record: record, CreatedAt: at})
	return e.Record, claimed, err
}

// Get returns the record stored under key and when the key was created.
func (k DispatchKeys) Get(key string) (record json.RawMessage, createdAt time.Time, ok bool, err error) {
	e, ok, err := k.Store.GetIdempotency(key)
	return e.Record, e.CreatedAt, ok, err
}

// Update replaces a stored key's record, keeping its creation time.
func (k DispatchKeys) Update(key string, record json.RawMessage) error {
	return k.Store.UpdateIdempotency(key, record)
}

// Delete forgets a key; an unknown key is not an error.
func (k DispatchKeys) Delete(key string) error { return k.Store.DeleteIdempotency(key) }

// Prune forgets the keys created before before and returns how many.
func (k DispatchKeys) Prune(before time.Time) (int, error) { return k.Store.PruneIdempotency(before) }
