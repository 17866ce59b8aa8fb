package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
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
	return nil
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

// splitBodies rewrites the schema 1 records of b as a header in b and the raw body in ev_bodies.
// It works in chunks (collect, then write, then seek on) because a bbolt cursor must not run over
// keys being rewritten.
func splitBodies(tx *bolt.Tx, b *bolt.Bucket) error {
	bodies := tx.Bucket(bBodies)
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
			chunk = append(chunk, kv{append([]byte(nil), k...), append([]byte(nil), v...)})
		}
		if len(chunk) == 0 {
			return nil
		}
		for _, r := range chunk {
			var old v1Record
			if err := json.Unmarshal(r.v, &old); err != nil {
				return fmt.Errorf("corrupt event record: %w", err)
			}
			e := old.Event
			e.Seq = binary.BigEndian.Uint64(r.k)
			if err := putHeader(b, e); err != nil {
				return err
			}
			if err := bodies.Put(r.k, old.Body); err != nil {
				return err
			}
		}
		from = chunk[len(chunk)-1].k
	}
}
