package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// migrateChunk bounds how many records a migration holds in memory at once.
const migrateChunk = 1024

// migrate brings a file written with schema version from up to schemaVersion, inside the
// transaction that opens it (all of it or none of it).
func migrate(tx *bolt.Tx, from uint64) error {
	if from < 2 {
		for _, name := range [][]byte{bPending, bDead, bDelivered} {
			if err := splitBodies(tx, tx.Bucket(name)); err != nil {
				return fmt.Errorf("bucket %s: %w", name, err)
			}
		}
	}
	if from < 3 {
		if err := indexDelivered(tx); err != nil {
			return fmt.Errorf("bucket %s: %w", bDeliveredAt, err)
		}
	}
	if from < 5 {
		for _, name := range [][]byte{bPending, bDead, bDelivered} {
			if err := joinBodies(tx, tx.Bucket(name)); err != nil {
				return fmt.Errorf("bucket %s: %w", name, err)
			}
		}
		if err := tx.DeleteBucket(bBodies); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return fmt.Errorf("bucket %s: %w", bBodies, err)
		}
	}
	return nil
}

// joinBodies rewrites the schema 2–4 headers of b, each with its body from ev_bodies, as records
// (header.go), in chunks as splitBodies does.
func joinBodies(tx *bolt.Tx, b *bolt.Bucket) error {
	bodies := tx.Bucket(bBodies)
	return inChunks(b, func(k, v []byte) error {
		e, err := decodeHeader(k, v)
		if err != nil {
			return err
		}
		var body []byte
		if bodies != nil {
			body = bodies.Get(k)
		}
		if body == nil {
			return fmt.Errorf("event #%d has no body", e.Seq)
		}
		return putRecord(b, e, body)
	})
}

// inChunks calls fn with (copies of) every key and value of b, collected a chunk at a time, so
// that fn may rewrite the key it is given: a bbolt cursor must not run over keys being rewritten.
func inChunks(b *bolt.Bucket, fn func(k, v []byte) error) error {
	var from []byte
	for {
		type kv struct{ k, v []byte }
		var chunk []kv
		c := b.Cursor()
		k, v := c.First()
		if from != nil {
			k, v = c.Seek(from)
			if k != nil && bytes.Equal(k, from) {
				k, v = c.Next()
			}
		}
		for ; k != nil && len(chunk) < migrateChunk; k, v = c.Next() {
			chunk = append(chunk, kv{bytes.Clone(k), bytes.Clone(v)})
		}
		if len(chunk) == 0 {
			return nil
		}
		for _, r := range chunk {
			if err := fn(r.k, r.v); err != nil {
				return err
			}
		}
		from = chunk[len(chunk)-1].k
	}
}

// indexDelivered fills the delivery-time index from the delivered events' headers (the only
// time they are all decoded: Prune reads the index after this).
func indexDelivered(tx *bolt.Tx) error {
	at := tx.Bucket(bDeliveredAt)
	return tx.Bucket(bDelivered).ForEach(func(k, v []byte) error {
		e, err := decodeHeader(k, v)
		if err != nil {
			return err
		}
		return at.Put(deliveredAtKey(e.DeliveredAt, e.Seq), []byte(e.ID))
	})
}

// v1Record is a schema 1 event record: the event and its body (base64, as encoding/json writes a
// []byte) in one JSON object.
type v1Record struct {
	Event
	Body []byte `json:"body"`
}

// splitBodies rewrites the schema 1 records of b as a header in b and the raw body in ev_bodies
// (schema 2's layout, which the later steps start from).
func splitBodies(tx *bolt.Tx, b *bolt.Bucket) error {
	bodies, err := tx.CreateBucketIfNotExists(bBodies)
	if err != nil {
		return err
	}
	return inChunks(b, func(k, v []byte) error {
		var old v1Record
		if err := json.Unmarshal(v, &old); err != nil {
			return fmt.Errorf("corrupt event record: %w", err)
		}
		e := old.Event
		e.Seq = binary.BigEndian.Uint64(k)
		if err := putHeader(b, e); err != nil {
			return err
		}
		return bodies.Put(k, old.Body)
	})
}
