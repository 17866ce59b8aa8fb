package pgstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/t3code-mcp/t3code-mcp/internal/lease"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// eventsLock is the advisory lock a transaction holds from its first event insert to its commit,
// so that sequence numbers are assigned in commit order (see the package comment).
const eventsLock = 0x7433_6576_656e_7473 // "t3events"

// header is the column list of an event without its body; withBody adds it.
const (
	header   = `seq, id, stream, state, enrich, created_at, enqueued_at, attempts, next_attempt, last_error, delivered_at, dead_at`
	withBody = header + `, body`
)

// scanEvent reads a row of header (and body when withBody), after the columns lead names.
func scanEvent(row pgx.Row, body bool, lead ...any) (store.Event, error) {
	var e store.Event
	var seq int64
	var next, delivered, dead *time.Time
	dst := append(lead, &seq, &e.ID, &e.Stream, &e.State, &e.Enrich, &e.CreatedAt, &e.EnqueuedAt, &e.Attempts, &next, &e.LastError, &delivered, &dead)
	if body {
		dst = append(dst, &e.Body)
	}
	if err := row.Scan(dst...); err != nil {
		return e, err
	}
	e.Seq = uint64(seq)
	e.NextAttempt, e.DeliveredAt, e.DeadAt = deref(next), deref(delivered), deref(dead)
	return e, nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// null stores a zero time as NULL.
func null(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t
}

func (s *Store) events(query string, body bool, args ...any) ([]store.Event, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, s.redact(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r, body) })
	return out, s.redact(err)
}

// limitArg turns "limit <= 0: all" into SQL's LIMIT ALL (NULL).
func limitArg(limit int) any {
	if limit <= 0 {
		return nil
	}
	return limit
}

// ---- writing batches ----

// Commit writes a batch in one transaction: all of it or none of it.
func (s *Store) Commit(b store.Batch) error { return s.CommitBatches([]store.Batch{b}) }

// CommitBatches writes several batches in one transaction: all of them or none of them. However
// many batches, it takes three round trips besides BEGIN and COMMIT: the fence checks and the
// thread and detector writes of every batch, pipelined; the event inserts under the event-insert
// lock, pipelined; the counts (a batch's prune reads and locks rows first: it adds its own).
func (s *Store) CommitBatches(bs []store.Batch) error {
	for _, b := range bs {
		if err := store.Validate(b); err != nil {
			return err
		}
		for k := range b.Detector {
			if k == "" {
				return errors.New("store: a detector key must not be empty")
			}
		}
	}
	return s.tx(func(ctx context.Context, tx pgx.Tx) error {
		var writes, inserts pgx.Batch
		var evs []store.Event
		for _, b := range bs {
			if f := b.Fence; f != nil {
				// Wraps store.ErrFenced when the lease moved on; the batch fails (alone, in a
				// Group), and what the pipeline wrote after the check is rolled back with it.
				lease.QueueFence(&writes, f.Machine, f.Token)
			}
			for k, v := range b.Detector {
				if v == nil {
					writes.Queue(`DELETE FROM t3_detector WHERE key = $1`, []byte(k))
				} else {
					writes.Queue(`INSERT INTO t3_detector (key, value) VALUES ($1, $2)
						ON CONFLICT (key) DO UPDATE SET value = excluded.value`, []byte(k), v)
				}
			}
			for _, t := range b.Threads {
				queueThread(&writes, t)
			}
			if len(b.DeleteThreads) > 0 {
				writes.Queue(`DELETE FROM t3_threads WHERE id = ANY($1)`, b.DeleteThreads)
			}
			if len(b.PruneStates) > 0 || len(b.PruneThreads) > 0 {
				// A prune reads and locks rows before it deletes: it runs once what is queued
				// before it is written.
				if err := flush(ctx, tx, &writes); err != nil {
					return err
				}
				if err := prune(ctx, tx, b); err != nil {
					return err
				}
			}
			evs = append(evs, b.Events...)
		}
		if err := flush(ctx, tx, &writes); err != nil {
			return err
		}
		if len(evs) == 0 {
			return nil
		}
		inserts.Queue(`SELECT pg_advisory_xact_lock($1)`, int64(eventsLock))
		added := 0
		queueInserts(&inserts, evs, &added)
		if err := tx.SendBatch(ctx, &inserts).Close(); err != nil {
			return err
		}
		return addCounts(ctx, tx, map[string]int{store.StatePending: added})
	})
}

// prune writes a batch's PruneStates and PruneThreads, each deletion only while the tracked row
// allows it (store.Orphaned, store.Prunable) as this transaction finds it with the rows locked:
// first the detector states (a Track writes its baseline before its row, so a Track in flight
// either committed before these locks were granted, and the row read next shows it, or waits
// for this transaction and stores its baseline after it), then the threads' rows. Read
// committed: each statement sees what committed before it.
func prune(ctx context.Context, tx pgx.Tx, b store.Batch) error {
	if len(b.PruneStates) == 0 && len(b.PruneThreads) == 0 {
		return nil
	}
	keys := make([][]byte, 0, len(b.PruneStates))
	ids := make([]string, 0, len(b.PruneStates)+len(b.PruneThreads))
	for k, o := range b.PruneStates {
		keys = append(keys, []byte(k))
		ids = append(ids, o.Thread)
	}
	for id := range b.PruneThreads {
		ids = append(ids, id)
	}
	if len(keys) > 0 {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM t3_detector WHERE key = ANY($1) ORDER BY key FOR UPDATE`, keys); err != nil {
			return err
		}
	}
	rows, err := tx.Query(ctx, `SELECT data FROM t3_threads WHERE id = ANY($1) ORDER BY id FOR UPDATE`, ids)
	if err != nil {
		return err
	}
	list, err := pgx.CollectRows(rows, pgx.RowTo[store.Thread])
	if err != nil {
		return err
	}
	now := make(map[string]store.Thread, len(list))
	for _, t := range list {
		now[t.ID] = t
	}
	var states [][]byte
	for k, o := range b.PruneStates {
		t, found := now[o.Thread]
		if store.Orphaned(t, found, o) {
			states = append(states, []byte(k))
		}
	}
	var threads []string
	for id, at := range b.PruneThreads {
		t, found := now[id]
		if store.Prunable(t, found, at) {
			threads = append(threads, id)
		}
	}
	if len(states) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM t3_detector WHERE key = ANY($1)`, states); err != nil {
			return err
		}
	}
	if len(threads) > 0 {
		if _, err := tx.Exec(ctx, `DELETE FROM t3_threads WHERE id = ANY($1)`, threads); err != nil {
			return err
		}
	}
	return nil
}

// flush sends what b holds in one round trip and empties it.
func flush(ctx context.Context, tx pgx.Tx, b *pgx.Batch) error {
	if b.Len() == 0 {
		return nil
	}
	err := tx.SendBatch(ctx, b).Close()
	*b = pgx.Batch{}
	return err
}

// queueInserts queues the inserts of evs in slice order, skipping ids already stored; *added
// counts the rows inserted once the batch is read.
func queueInserts(batch *pgx.Batch, evs []store.Event, added *int) {
	now := time.Now()
	for _, e := range evs {
		created := e.CreatedAt
		if created.IsZero() {
			created = now
		}
		batch.Queue(`INSERT INTO t3_events (seq, id, stream, state, body, enrich, created_at, enqueued_at)
			VALUES (nextval('t3_events_seq'), $1, $2, 'pending', $3, $4, $5, $5) ON CONFLICT (id) DO NOTHING`,
			e.ID, e.Stream, e.Body, e.Enrich, created).Exec(func(tag pgconn.CommandTag) error {
			*added += int(tag.RowsAffected())
			return nil
		})
	}
}

// addCounts changes the event counts by d (states with 0 are left alone).
func addCounts(ctx context.Context, tx pgx.Tx, d map[string]int) error {
	var batch pgx.Batch
	queueCounts(&batch, d)
	if batch.Len() == 0 {
		return nil
	}
	return tx.SendBatch(ctx, &batch).Close()
}

// queueCounts queues the updates of the event counts by d, always in the same order of states
// (pending, delivered, dead), so that two transactions lock the count rows in one order.
func queueCounts(batch *pgx.Batch, d map[string]int) {
	for _, state := range []string{store.StatePending, store.StateDelivered, store.StateDead} {
		if d[state] != 0 {
			batch.Queue(`UPDATE t3_event_counts SET n = n + $2 WHERE state = $1`, state, d[state])
		}
	}
}

// ---- reading the queue ----

// Pending returns up to limit pending events (limit <= 0: all) in sequence order.
func (s *Store) Pending(limit int) ([]store.Event, error) {
	return s.events(`SELECT `+withBody+` FROM t3_events WHERE state = 'pending' ORDER BY seq LIMIT $1`, true, limitArg(limit))
}

// Dead returns the dead letters, oldest first.
func (s *Store) Dead() ([]store.Event, error) {
	return s.events(`SELECT `+withBody+` FROM t3_events WHERE state = 'dead' ORDER BY seq`, true)
}

// Heads returns the oldest pending event of each stream (up to limit streams), by stream.
func (s *Store) Heads(limit int) ([]store.Event, error) {
	return s.events(`SELECT DISTINCT ON (stream) `+withBody+` FROM t3_events WHERE state = 'pending'
		ORDER BY stream, seq LIMIT $1`, true, limitArg(limit))
}

// PendingIndex calls fn for every pending event's stream and sequence number, by stream and in
// sequence order within each, and returns the highest sequence number committed so far; both
// from one snapshot.
func (s *Store) PendingIndex(fn func(stream string, seq uint64)) (last uint64, err error) {
	ctx, cancel := s.ctx()
	defer cancel()
	err = pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var max int64
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(seq), 0) FROM t3_events`).Scan(&max); err != nil {
			return err
		}
		last = uint64(max)
		rows, err := tx.Query(ctx, `SELECT stream, seq FROM t3_events WHERE state = 'pending' ORDER BY stream, seq`)
		if err != nil {
			return err
		}
		var stream string
		var seq int64
		_, err = pgx.ForEachRow(rows, []any{&stream, &seq}, func() error {
			fn(stream, uint64(seq))
			return nil
		})
		return err
	})
	return last, s.redact(err)
}

// PendingAfter returns up to limit pending events above sequence number after, in sequence
// order, without bodies.
func (s *Store) PendingAfter(after uint64, limit int) ([]store.Event, error) {
	return s.events(`SELECT `+header+` FROM t3_events WHERE state = 'pending' AND seq > $1 ORDER BY seq LIMIT $2`,
		false, int64(after), limitArg(limit))
}

// PendingEvent returns the pending event with sequence number seq (ErrNotPending when it is not).
func (s *Store) PendingEvent(seq uint64, body bool) (store.Event, error) {
	cols := header
	if body {
		cols = withBody
	}
	evs, err := s.events(`SELECT `+cols+` FROM t3_events WHERE seq = $1 AND state = 'pending'`, body, int64(seq))
	if err != nil {
		return store.Event{}, err
	}
	if len(evs) == 0 {
		return store.Event{}, fmt.Errorf("store: event #%d: %w", seq, store.ErrNotPending)
	}
	return evs[0], nil
}

// Get returns an event in any state, with its body.
func (s *Store) Get(id string) (store.Event, error) {
	evs, err := s.events(`SELECT `+withBody+` FROM t3_events WHERE id = $1`, true, id)
	if err != nil {
		return store.Event{}, err
	}
	if len(evs) == 0 {
		return store.Event{}, fmt.Errorf("store: event %q: %w", id, store.ErrNotFound)
	}
	return evs[0], nil
}

// Counts returns how many events are in each state (one small table: O(1)).
func (s *Store) Counts() (pending, dead, delivered int, err error) {
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT state, n FROM t3_event_counts`)
	if err != nil {
		return 0, 0, 0, s.redact(err)
	}
	var state string
	var n int64
	_, err = pgx.ForEachRow(rows, []any{&state, &n}, func() error {
		switch state {
		case store.StatePending:
			pending = int(n)
		case store.StateDead:
			dead = int(n)
		case store.StateDelivered:
			delivered = int(n)
		}
		return nil
	})
	return pending, dead, delivered, s.redact(err)
}

// ---- recording outcomes ----

// Record applies ops to pending events in one transaction: the events are read and locked in one
// query, the ops applied in order (so a second op on one event sees the first), and the rows
// written back in one round trip.
func (s *Store) Record(ops []store.Op) (errs []error, err error) {
	errs = make([]error, len(ops))
	if len(ops) == 0 {
		return errs, nil
	}
	err = s.tx(func(ctx context.Context, tx pgx.Tx) error {
		clear(errs)
		ids := make([]string, len(ops))
		for i, op := range ops {
			ids[i] = op.ID
		}
		rows, err := tx.Query(ctx, `SELECT `+header+` FROM t3_events WHERE id = ANY($1) ORDER BY seq FOR UPDATE`, ids)
		if err != nil {
			return err
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r, false) })
		if err != nil {
			return err
		}
		byID := make(map[string]*store.Event, len(found))
		for i := range found {
			byID[found[i].ID] = &found[i]
		}
		bodies := map[string][]byte{}
		changed := map[string]bool{}
		d := map[string]int{}
		for i, op := range ops {
			e := byID[op.ID]
			if e == nil {
				errs[i] = fmt.Errorf("store: event %q: %w", op.ID, store.ErrNotFound)
				continue
			}
			if e.State != store.StatePending {
				errs[i] = fmt.Errorf("store: event %q is %s: %w", op.ID, e.State, store.ErrNotPending)
				continue
			}
			if op.Body != nil && !json.Valid(op.Body) {
				errs[i] = fmt.Errorf("store: event %q: the new body is not valid JSON", op.ID)
				continue
			}
			switch op.Kind {
			case store.OpBody, store.OpRetry, store.OpDelivered, store.OpDead:
			default:
				errs[i] = fmt.Errorf("store: event %q: unknown op %d", op.ID, op.Kind)
				continue
			}
			if op.Body != nil {
				bodies[op.ID] = op.Body
				e.Enrich = false
			}
			switch op.Kind {
			case store.OpRetry:
				e.Attempts++
				e.NextAttempt, e.LastError = op.Next, op.Error
			case store.OpDelivered:
				e.Attempts++
				e.State, e.DeliveredAt, e.NextAttempt = store.StateDelivered, op.At, time.Time{}
			case store.OpDead:
				e.Attempts++
				e.State, e.DeadAt, e.NextAttempt, e.LastError = store.StateDead, op.At, time.Time{}, op.Error
			}
			if e.State != store.StatePending {
				d[store.StatePending]--
				d[e.State]++
			}
			changed[op.ID] = true
		}
		var batch pgx.Batch
		for _, e := range found {
			if !changed[e.ID] {
				continue
			}
			// A final state ends any delivery claim.
			batch.Queue(`UPDATE t3_events SET state = $2, enrich = $3, attempts = $4, next_attempt = $5, last_error = $6,
				delivered_at = $7, dead_at = $8, body = coalesce($9, body),
				claimed_by = CASE WHEN $2 = 'pending' THEN claimed_by END,
				claim_until = CASE WHEN $2 = 'pending' THEN claim_until END
				WHERE seq = $1`,
				int64(e.Seq), e.State, e.Enrich, e.Attempts, null(e.NextAttempt), e.LastError, null(e.DeliveredAt), null(e.DeadAt), bodies[e.ID])
		}
		queueCounts(&batch, d) // in the same round trip
		if batch.Len() == 0 {
			return nil
		}
		return tx.SendBatch(ctx, &batch).Close()
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// ---- operator actions and housekeeping ----

// Requeue moves dead letters back to pending (RequeueEvents) and returns how many it moved.
func (s *Store) Requeue(at time.Time, ids ...string) (int, error) {
	evs, err := s.RequeueEvents(at, ids...)
	return len(evs), err
}

// RequeueEvents moves dead letters back to pending at time at with a fresh retry window (all of
// them when no id is given); pending and delivered ids are skipped, an unknown id fails the call.
// A requeued event keeps its sequence number: it goes back to its place in its stream.
func (s *Store) RequeueEvents(at time.Time, ids ...string) ([]store.Event, error) {
	var out []store.Event
	err := s.tx(func(ctx context.Context, tx pgx.Tx) error {
		out = nil
		var rows pgx.Rows
		var err error
		if len(ids) == 0 {
			rows, err = tx.Query(ctx, `SELECT `+header+` FROM t3_events WHERE state = 'dead' ORDER BY seq FOR UPDATE`)
		} else {
			rows, err = tx.Query(ctx, `SELECT `+header+` FROM t3_events WHERE id = ANY($1) ORDER BY seq FOR UPDATE`, ids)
		}
		if err != nil {
			return err
		}
		found, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Event, error) { return scanEvent(r, false) })
		if err != nil {
			return err
		}
		for _, id := range ids {
			if !slices.ContainsFunc(found, func(e store.Event) bool { return e.ID == id }) {
				return fmt.Errorf("store: event %q: %w", id, store.ErrNotFound)
			}
		}
		var seqs []int64
		for _, e := range found {
			if e.State != store.StateDead {
				continue
			}
			e.State, e.EnqueuedAt, e.Attempts = store.StatePending, at, 0
			e.NextAttempt, e.DeadAt = time.Time{}, time.Time{}
			seqs = append(seqs, int64(e.Seq))
			out = append(out, e)
		}
		if len(seqs) == 0 {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE t3_events SET state = 'pending', enqueued_at = $2, attempts = 0, next_attempt = NULL,
			dead_at = NULL, claimed_by = NULL, claim_until = NULL WHERE seq = ANY($1)`, seqs, at); err != nil {
			return err
		}
		return addCounts(ctx, tx, map[string]int{store.StateDead: -len(seqs), store.StatePending: len(seqs)})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Prune deletes delivered events delivered before the cutoff (dead letters are kept).
func (s *Store) Prune(deliveredBefore time.Time) (int, error) {
	n := 0
	err := s.tx(func(ctx context.Context, tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `DELETE FROM t3_events WHERE state = 'delivered' AND delivered_at < $1`, deliveredBefore)
		if err != nil {
			return err
		}
		n = int(tag.RowsAffected())
		return addCounts(ctx, tx, map[string]int{store.StateDelivered: -n})
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

var _ store.Claimer = (*Store)(nil)

// claimHeads is ClaimHeads' query: the head of each stream asked for (an index probe of
// t3_events_pending each); of those, the ones the caller holds with at least two thirds of ttl
// left are answered as they are, without a write (kept); the others that are free (unclaimed,
// expired, or the caller's with less than two thirds of ttl left) are locked with FOR UPDATE SKIP
// LOCKED — a row another replica is claiming or recording right now is passed over, never waited
// for — and claimed by $2, all in one statement. One row per stream asked for, in its order: the
// stream, its head (0: none pending), whether it is the caller's, the claim's time left in
// seconds, and the claimed event (header and body; neutral values when not claimed).
//
// A kept claim is read, not locked: no other claimant can take it before it expires, and a row
// lock would be a write too (and its transaction a WAL flush at commit), which is what keeping it
// saves: a loop that asks again for a head it waits to send costs an index probe, not a row
// version.
const claimHeads = `WITH heads AS (
		SELECT w.ord, w.stream, h.seq
		FROM unnest($1::text[]) WITH ORDINALITY AS w(stream, ord)
		LEFT JOIN LATERAL (
			SELECT e.seq FROM t3_events e
			WHERE e.stream = w.stream COLLATE "C" AND e.state = 'pending'
			ORDER BY e.seq LIMIT 1) h ON true
	), free AS (
		SELECT e.seq FROM t3_events e JOIN heads ON e.seq = heads.seq
		WHERE e.state = 'pending' AND (e.claimed_by IS NULL OR e.claim_until < now()
			OR (e.claimed_by = $2 AND e.claim_until < now() + make_interval(secs => $3::float8 * 2 / 3)))
		FOR UPDATE OF e SKIP LOCKED
	), claimed AS (
		UPDATE t3_events e SET claimed_by = $2, claim_until = now() + make_interval(secs => $3::float8)
		FROM free WHERE e.seq = free.seq
		RETURNING e.seq, e.claim_until, e.id, e.stream, e.state, e.enrich, e.created_at, e.enqueued_at, e.attempts,
			e.next_attempt, e.last_error, e.delivered_at, e.dead_at, e.body
	), kept AS (
		SELECT e.seq, e.claim_until, e.id, e.stream, e.state, e.enrich, e.created_at, e.enqueued_at, e.attempts,
			e.next_attempt, e.last_error, e.delivered_at, e.dead_at, e.body
		FROM t3_events e JOIN heads ON e.seq = heads.seq
		WHERE e.state = 'pending' AND e.claimed_by = $2 AND e.claim_until >= now() + make_interval(secs => $3::float8 * 2 / 3)
	), mine AS (
		SELECT * FROM claimed UNION ALL SELECT * FROM kept
	)
	SELECT h.stream, coalesce(h.seq, 0), c.seq IS NOT NULL,
		coalesce(extract(epoch FROM c.claim_until - now()), 0)::float8,
		coalesce(c.seq, 0), coalesce(c.id, ''), coalesce(c.stream, ''), coalesce(c.state, ''), coalesce(c.enrich, false),
		coalesce(c.created_at, 'epoch'), coalesce(c.enqueued_at, 'epoch'), coalesce(c.attempts, 0), c.next_attempt,
		coalesce(c.last_error, ''), c.delivered_at, c.dead_at, coalesce(c.body, ''::bytea)
	FROM heads h LEFT JOIN mine c ON c.seq = h.seq
	ORDER BY h.ord`

// ClaimHeads claims the head of each of streams for claimant for ttl, by the database's clock, in
// one statement (store.Claimer); a head claimant holds with at least two thirds of ttl left is
// answered without a write.
func (s *Store) ClaimHeads(streams []string, claimant string, ttl time.Duration) ([]store.HeadClaim, error) {
	if len(streams) == 0 {
		return nil, nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, claimHeads, streams, claimant, ttl.Seconds())
	if err != nil {
		return nil, s.redact(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.HeadClaim, error) {
		var c store.HeadClaim
		var head int64
		var left float64
		e, err := scanEvent(r, true, &c.Stream, &head, &c.Claimed, &left)
		c.Head = uint64(head)
		if c.Claimed {
			c.Event = e
			c.Left = time.Duration(left * float64(time.Second))
		}
		return c, err
	})
	return out, s.redact(err)
}

// ReleaseClaims ends claimant's claims on pending events (a replica shutting down).
func (s *Store) ReleaseClaims(claimant string) (int, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	tag, err := s.pool.Exec(ctx, `UPDATE t3_events SET claimed_by = NULL, claim_until = NULL
		WHERE state = 'pending' AND claimed_by = $1`, claimant)
	if err != nil {
		return 0, s.redact(err)
	}
	return int(tag.RowsAffected()), nil
}
