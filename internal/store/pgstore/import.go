package pgstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// ErrNotEmpty: Import refuses a database that already holds state.
var ErrNotEmpty = errors.New("the database already holds connector state")

// Import copies another store's state into this empty database, in one transaction: the
// tracked threads, the detector state and events as they are (pending or dead, with their
// attempts, times and last error), in the order given, which must be the source's sequence
// order (so every stream keeps its order). The events get new sequence numbers after any this
// database assigned. A database holding any thread, detector state or event is refused with
// ErrNotEmpty: nothing is merged.
func (s *Store) Import(threads []store.Thread, detector map[string][]byte, evs []store.Event) error {
	if err := store.Validate(store.Batch{Threads: threads, Detector: detector, Events: evs}); err != nil {
		return err
	}
	return s.tx(func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(eventsLock)); err != nil {
			return err
		}
		var busy bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM t3_threads) OR EXISTS (SELECT 1 FROM t3_detector) OR EXISTS (SELECT 1 FROM t3_events)`).Scan(&busy); err != nil {
			return err
		}
		if busy {
			return fmt.Errorf("store: %w", ErrNotEmpty)
		}
		var batch pgx.Batch
		for _, t := range threads {
			batch.Queue(`INSERT INTO t3_threads (id, machine, data) VALUES ($1, $2, $3)`, t.ID, t.Machine, t)
		}
		for k, v := range detector {
			batch.Queue(`INSERT INTO t3_detector (key, value) VALUES ($1, $2)`, []byte(k), v)
		}
		d := map[string]int{}
		for _, e := range evs {
			if e.State != store.StatePending && e.State != store.StateDead {
				return fmt.Errorf("store: event %q is %s: only pending events and dead letters are imported", e.ID, e.State)
			}
			d[e.State]++
			batch.Queue(`INSERT INTO t3_events (seq, id, stream, state, body, enrich, created_at, enqueued_at, attempts, next_attempt, last_error, dead_at)
				VALUES (nextval('t3_events_seq'), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
				e.ID, e.Stream, e.State, e.Body, e.Enrich, e.CreatedAt, e.EnqueuedAt, e.Attempts, null(e.NextAttempt), e.LastError, null(e.DeadAt))
		}
		if err := tx.SendBatch(ctx, &batch).Close(); err != nil {
			return err
		}
		return addCounts(ctx, tx, d)
	})
}
