package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// ClaimIdempotency stores rec under its key unless the key is already stored, atomically across
// replicas (INSERT … ON CONFLICT DO NOTHING): of two racing calls exactly one gets claimed. When
// the key is taken, the stored entry is returned and nothing is written.
func (s *Store) ClaimIdempotency(rec store.Idempotency) (stored store.Idempotency, claimed bool, err error) {
	if rec.Key == "" || !json.Valid(rec.Record) {
		return store.Idempotency{}, false, errors.New("store: an idempotency entry needs a key and a JSON record")
	}
	err = s.tx(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `INSERT INTO t3_idempotency (key, record, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING`,
			rec.Key, []byte(rec.Record), rec.CreatedAt)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 1 {
			stored, claimed = rec, true
			return nil
		}
		stored, _, err = getIdempotency(ctx, tx, rec.Key)
		return err
	})
	return stored, claimed, err
}

func getIdempotency(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, key string) (store.Idempotency, bool, error) {
	e := store.Idempotency{Key: key}
	var rec []byte
	err := q.QueryRow(ctx, `SELECT record, created_at FROM t3_idempotency WHERE key = $1`, key).Scan(&rec, &e.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Idempotency{}, false, nil
	}
	e.Record = rec
	return e, err == nil, err
}

// GetIdempotency returns the entry stored under key.
func (s *Store) GetIdempotency(key string) (store.Idempotency, bool, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	e, ok, err := getIdempotency(ctx, s.pool, key)
	return e, ok, s.redact(err)
}

// UpdateIdempotency replaces the record of a stored key, keeping its CreatedAt; ErrNotFound when
// the key is not stored.
func (s *Store) UpdateIdempotency(key string, record json.RawMessage) error {
	if !json.Valid(record) {
		return errors.New("store: an idempotency record must be JSON")
	}
	ctx, cancel := s.ctx()
	defer cancel()
	tag, err := s.pool.Exec(ctx, `UPDATE t3_idempotency SET record = $2 WHERE key = $1`, key, []byte(record))
	if err != nil {
		return s.redact(err)
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// DeleteIdempotency forgets a key; deleting an unknown key is not an error.
func (s *Store) DeleteIdempotency(key string) error {
	ctx, cancel := s.ctx()
	defer cancel()
	_, err := s.pool.Exec(ctx, `DELETE FROM t3_idempotency WHERE key = $1`, key)
	return s.redact(err)
}

// PruneIdempotency forgets the keys created before before and returns how many.
func (s *Store) PruneIdempotency(before time.Time) (int, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	tag, err := s.pool.Exec(ctx, `DELETE FROM t3_idempotency WHERE created_at < $1`, before)
	if err != nil {
		return 0, s.redact(err)
	}
	return int(tag.RowsAffected()), nil
}
