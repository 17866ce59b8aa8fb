package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Event states.
const (
	StatePending   = "pending"
	StateDelivered = "delivered"
	StateDead      = "dead"
)

// Event is one outbox record: a webhook body waiting for, or done with, delivery. Its JSON
// encoding is the stored header; the body is stored raw after it, in the same value (header.go).
type Event struct {
	ID     string `json:"id"`     // unique; the webhook-id; a repeated insert is ignored
	Stream string `json:"stream"` // ordering key (machine/thread): delivered in insertion order
	Body   []byte `json:"-"`      // the JSON webhook body, sent as is (stored raw, not in the header)
	// Enrich is true when Body holds only the facts known at commit time (committed in the
	// watcher's Ack path without reading T3): the outbox completes it (outbox.Enricher) before
	// the first delivery attempt, persists the completed body and clears Enrich.
	Enrich bool `json:"enrich,omitempty"`

	CreatedAt time.Time `json:"createdAt"` // when the event happened (lag is measured from here)
	// EnqueuedAt is when the event last entered the queue: CreatedAt on insert, the requeue time
	// after Requeue. The outbox's MaxAge counts from here, so a requeued dead letter gets a full
	// new retry window instead of dying after one attempt.
	EnqueuedAt time.Time `json:"enqueuedAt"`

	State       string    `json:"state"`
	Attempts    int       `json:"attempts"` // delivery attempts since the last (re)queue
	NextAttempt time.Time `json:"nextAttempt,omitzero"`
	LastError   string    `json:"lastError,omitempty"`
	DeliveredAt time.Time `json:"deliveredAt,omitzero"`
	DeadAt      time.Time `json:"deadAt,omitzero"`

	Seq uint64 `json:"-"` // insertion order, set by the store (the bucket key)
}

// countDelta is a number of events per state: the store's counts, or a transaction's change of them.
type countDelta struct{ pending, dead, delivered int }

func (d *countDelta) add(state string, n int) {
	switch state {
	case StatePending:
		d.pending += n
	case StateDead:
		d.dead += n
	case StateDelivered:
		d.delivered += n
	}
}

func bucketOf(state string) []byte {
	switch state {
	case StateDead:
		return bDead
	case StateDelivered:
		return bDelivered
	}
	return bPending
}

func checkEvents(evs []Event) error {
	for i, e := range evs {
		if e.ID == "" {
			return fmt.Errorf("store: event %d has no ID", i)
		}
		if e.Stream == "" || strings.IndexByte(e.Stream, 0) >= 0 {
			return fmt.Errorf("store: event %q: the stream must be non-empty and hold no NUL byte", e.ID)
		}
		if !json.Valid(e.Body) {
			return fmt.Errorf("store: event %q: the body is not valid JSON", e.ID)
		}
	}
	return nil
}

// appendEvents appends evs (checked by checkEvents) to the outbox; an id already stored is skipped.
// appended, when not nil, gets each event appended, as stored.
func (s *Bolt) appendEvents(tx *bolt.Tx, evs []Event, d *countDelta, appended func(Event)) error {
	pending, heads := tx.Bucket(bPending), tx.Bucket(bHeads)
	for _, e := range evs {
		if s.ids.getTx(tx, e.ID) != nil {
			continue // already stored: idempotent
		}
		seq, err := pending.NextSequence()
		if err != nil {
			return err
		}
		if e.CreatedAt.IsZero() {
			e.CreatedAt = time.Now()
		}
		e.EnqueuedAt = e.CreatedAt
		e.State, e.Attempts, e.NextAttempt, e.LastError = StatePending, 0, time.Time{}, ""
		e.DeliveredAt, e.DeadAt = time.Time{}, time.Time{}
		e.Seq = seq
		if err := putRecord(pending, e, e.Body); err != nil {
			return err
		}
		if err := s.ids.set(tx, e.ID, seqKey(seq)); err != nil {
			return err
		}
		if err := heads.Put(headKey(e.Stream, seq), nil); err != nil {
			return err
		}
		d.pending++
		if appended != nil {
			appended(e)
		}
	}
	return nil
}

// ---- reading the queue ----

// Pending returns up to limit pending events (limit <= 0: all) in insertion order, which is FIFO
// within every stream.
func (s *Bolt) Pending(limit int) ([]Event, error) {
	return s.list(bPending, 0, limit, true)
}

// Dead returns the dead letters, oldest first.
func (s *Bolt) Dead() ([]Event, error) { return s.list(bDead, 0, 0, true) }

// Heads returns the oldest pending event of each stream (up to limit streams; limit <= 0: all),
// ordered by stream. The outbox does not use it (it keeps the heads in memory, see PendingIndex);
// it is for inspection and tests.
func (s *Bolt) Heads(limit int) ([]Event, error) {
	var out []Event
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bHeads).Cursor()
		for k, _ := c.First(); k != nil; {
			stream, seq, ok := splitHeadKey(k)
			if !ok {
				return fmt.Errorf("store: corrupt stream index key %q", k)
			}
			e, err := pendingAt(tx, seq, true)
			if err != nil {
				return err
			}
			out = append(out, e)
			if limit > 0 && len(out) >= limit {
				return nil
			}
			// Skip the rest of this stream: seek past every key with the "stream\x00" prefix.
			k, _ = c.Seek(append([]byte(stream), 1))
		}
		return nil
	})
	return out, err
}

// PendingIndex calls fn for every pending event's stream and sequence number, stream by stream
// and in insertion order within each, reading only the stream index's keys (no record is
// decoded). It returns the highest sequence number assigned so far: every event committed
// later has a higher one (PendingAfter finds them). It is what the outbox rebuilds its in-memory
// queues from at start.
func (s *Bolt) PendingIndex(fn func(stream string, seq uint64)) (last uint64, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		last = tx.Bucket(bPending).Sequence()
		c := tx.Bucket(bHeads).Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			stream, seq, ok := splitHeadKey(k)
			if !ok {
				return fmt.Errorf("store: corrupt stream index key %q", k)
			}
			fn(stream, seq)
		}
		return nil
	})
	return last, err
}

// PendingAfter returns up to limit pending events whose sequence number is above after, in
// insertion order, without their bodies: the events committed since the caller last looked.
// The cost is that of the events returned, however many others are pending.
func (s *Bolt) PendingAfter(after uint64, limit int) ([]Event, error) {
	return s.list(bPending, after+1, limit, false)
}

// PendingEvent returns the pending event with sequence number seq, with its body when withBody.
// It fails with ErrNotPending when seq is not pending.
func (s *Bolt) PendingEvent(seq uint64, withBody bool) (Event, error) {
	var e Event
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		e, err = pendingAt(tx, seq, withBody)
		return err
	})
	return e, err
}

func pendingAt(tx *bolt.Tx, seq uint64, withBody bool) (Event, error) {
	k := seqKey(seq)
	v := tx.Bucket(bPending).Get(k)
	if v == nil {
		return Event{}, fmt.Errorf("store: event #%d: %w", seq, ErrNotPending)
	}
	e, b, err := decodeRecord(k, v)
	if err == nil && withBody {
		e.Body = bytes.Clone(b) // bbolt memory is only valid inside the transaction
	}
	return e, err
}

// Get returns an event in any state, with its body.
func (s *Bolt) Get(id string) (Event, error) {
	var e Event
	sk, deleted, journaled := s.ids.get(id) // before the read transaction (journal.get)
	err := s.db.View(func(tx *bolt.Tx) error {
		if !journaled {
			sk = tx.Bucket(bEventIDs).Get([]byte(id))
		} else if deleted {
			sk = nil
		}
		var err error
		var b []byte
		if e, b, _, err = findSeq(tx, id, sk); err != nil {
			return err
		}
		e.Body = bytes.Clone(b) // bbolt memory is only valid inside the transaction
		return nil
	})
	return e, err
}

// Counts returns how many events are in each state. It is O(1): the counts are kept in memory.
func (s *Bolt) Counts() (pending, dead, delivered int, err error) {
	s.countsMu.Lock()
	defer s.countsMu.Unlock()
	return s.counts.pending, s.counts.dead, s.counts.delivered, nil
}

// ---- recording delivery outcomes ----

// OpKind is what a recorded Op does to a pending event.
type OpKind int

// Op kinds.
const (
	// OpBody only replaces the body (Op.Body) and clears Enrich: no attempt is counted.
	OpBody OpKind = iota
	// OpDelivered records a successful attempt at Op.At.
	OpDelivered
	// OpRetry records a failed attempt: the event stays its stream's head until Op.Next.
	OpRetry
	// OpDead records a final failed attempt (or an expiry) at Op.At with reason Op.Error: the
	// event stops blocking its stream and waits in the dead letters for an operator.
	OpDead
)

// Op is one outcome for Record.
type Op struct {
	ID string
	// Seq, when not 0, is the event's sequence number as the caller knows it (the outbox does):
	// the bbolt store then finds the pending event by it, without a read of the id index first.
	// It is a hint: an event found there that is not ID's, or none, is looked up by ID as when
	// Seq is 0 (PostgreSQL finds every op by ID).
	Seq   uint64
	Kind  OpKind
	At    time.Time // OpDelivered, OpDead
	Next  time.Time // OpRetry
	Error string    // OpRetry, OpDead: the LastError
	// Body, when not nil, replaces the stored body and clears Enrich before Kind applies: the
	// enriched body is durable with (or before) the first attempt's record.
	Body []byte
}

// Record applies ops to pending events in one fsynced transaction (group commit: one fsync for
// all of them). An op that cannot apply (an unknown id: ErrNotFound; an event no longer pending:
// ErrNotPending; a body that is not JSON) is skipped and reported in errs at its index, without
// failing the others; err is a failure of the whole transaction, after which nothing was written.
func (s *Bolt) Record(ops []Op) (errs []error, err error) {
	return s.CommitBatchesAndOps(nil, ops, nil)
}

// applyOps applies ops in tx, each op's own failure at its index in errs; fatal fails the
// transaction.
func (s *Bolt) applyOps(tx *bolt.Tx, ops []Op, d *countDelta) (errs []error, fatal error) {
	errs = make([]error, len(ops))
	for i, op := range ops {
		if errs[i], fatal = s.apply(tx, op, d); fatal != nil {
			return nil, fatal
		}
	}
	return errs, nil
}

// apply applies one op; opErr concerns only this op, fatal the transaction.
func (s *Bolt) apply(tx *bolt.Tx, op Op, d *countDelta) (opErr, fatal error) {
	e, body, b, err := s.findOp(tx, op)
	if err != nil {
		return err, nil
	}
	if e.State != StatePending {
		return fmt.Errorf("store: event %q is %s: %w", op.ID, e.State, ErrNotPending), nil
	}
	k := seqKey(e.Seq)
	if op.Body != nil {
		if !json.Valid(op.Body) {
			return fmt.Errorf("store: event %q: the new body is not valid JSON", op.ID), nil
		}
		body, e.Enrich = op.Body, false
	}
	switch op.Kind {
	case OpBody:
		return nil, putRecord(b, e, body)
	case OpRetry:
		e.Attempts++
		e.NextAttempt, e.LastError = op.Next, op.Error
		return nil, putRecord(b, e, body)
	case OpDelivered:
		e.Attempts++
		e.State, e.DeliveredAt, e.NextAttempt = StateDelivered, op.At, time.Time{}
	case OpDead:
		e.Attempts++
		e.State, e.DeadAt, e.NextAttempt, e.LastError = StateDead, op.At, time.Time{}, op.Error
	default:
		return fmt.Errorf("store: event %q: unknown op %d", op.ID, op.Kind), nil
	}
	// Moved to a final state: out of the pending bucket and the stream index. The record is
	// encoded before the delete: body is the pending record's memory.
	rec, err := encodeRecord(e, body)
	if err != nil {
		return nil, err
	}
	if err := b.Delete(k); err != nil {
		return nil, err
	}
	if err := tx.Bucket(bHeads).Delete(headKey(e.Stream, e.Seq)); err != nil {
		return nil, err
	}
	d.pending--
	d.add(e.State, 1)
	if e.State == StateDelivered {
		if err := tx.Bucket(bDeliveredAt).Put(deliveredAtKey(e.DeliveredAt, e.Seq), []byte(e.ID)); err != nil {
			return nil, err
		}
	}
	return nil, tx.Bucket(bucketOf(e.State)).Put(k, rec)
}

// ---- operator actions and housekeeping ----

// Requeue moves dead letters back to pending (RequeueEvents) and returns how many it moved.
func (s *Bolt) Requeue(at time.Time, ids ...string) (int, error) {
	evs, err := s.RequeueEvents(at, ids...)
	return len(evs), err
}

// RequeueEvents moves dead letters back to pending at time at, with a fresh retry window
// (EnqueuedAt = at, Attempts = 0); LastError is kept for the record until the next attempt. With
// no ids it requeues every dead letter. Ids that are not dead (pending or delivered) are skipped;
// an id that is not stored at all fails the whole call. It returns the requeued events (without
// their bodies), in insertion order.
//
// A requeued event keeps its sequence number, so it goes back to its place in its stream: ahead
// of any later pending events of the same stream.
func (s *Bolt) RequeueEvents(at time.Time, ids ...string) ([]Event, error) {
	var out []Event
	err := s.update(func(tx *bolt.Tx, d *countDelta) error {
		out = nil
		dead := tx.Bucket(bDead)
		var evs []Event
		if len(ids) == 0 {
			err := dead.ForEach(func(k, v []byte) error {
				e, _, err := decodeRecord(k, v)
				evs = append(evs, e)
				return err
			})
			if err != nil {
				return err
			}
		}
		for _, id := range ids {
			e, _, _, err := s.find(tx, id)
			if err != nil {
				return err
			}
			if e.State == StateDead {
				evs = append(evs, e)
			}
		}
		for _, e := range evs {
			v := dead.Get(seqKey(e.Seq))
			if v == nil {
				continue // the same id given twice
			}
			_, body, err := decodeRecord(seqKey(e.Seq), v)
			if err != nil {
				return err
			}
			e.State, e.EnqueuedAt, e.Attempts = StatePending, at, 0
			e.NextAttempt, e.DeadAt = time.Time{}, time.Time{}
			// Encoded before the delete: body is the dead record's memory.
			rec, err := encodeRecord(e, body)
			if err != nil {
				return err
			}
			if err := dead.Delete(seqKey(e.Seq)); err != nil {
				return err
			}
			if err := tx.Bucket(bPending).Put(seqKey(e.Seq), rec); err != nil {
				return err
			}
			if err := tx.Bucket(bHeads).Put(headKey(e.Stream, e.Seq), nil); err != nil {
				return err
			}
			d.dead--
			d.pending++
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Prune deletes delivered events delivered before the cutoff (their records, bodies with them)
// and their ids (a later insert of a pruned id is then new again: keep the cutoff longer than any
// replay window). Dead letters are never pruned: they wait for an operator. It returns how many
// were deleted. It walks the delivery-time index from the oldest entry to the cutoff, so its cost
// is that of the events it deletes, however many delivered events are kept.
func (s *Bolt) Prune(deliveredBefore time.Time) (int, error) {
	n := 0
	err := s.update(func(tx *bolt.Tx, d *countDelta) error {
		n = 0
		delivered, at := tx.Bucket(bDelivered), tx.Bucket(bDeliveredAt)
		// Collect first, delete after: deleting under a live bbolt cursor can skip keys.
		type victim struct{ key, id []byte }
		var victims []victim
		cutoff := deliveredAtKey(deliveredBefore, 0)
		c := at.Cursor()
		for k, v := c.First(); k != nil && bytes.Compare(k, cutoff) < 0; k, v = c.Next() {
			victims = append(victims, victim{append([]byte(nil), k...), append([]byte(nil), v...)})
		}
		for _, v := range victims {
			seq := v.key[8:]
			if err := s.ids.set(tx, string(v.id), nil); err != nil {
				return err
			}
			if err := delivered.Delete(seq); err != nil {
				return err
			}
			if err := at.Delete(v.key); err != nil {
				return err
			}
		}
		n = len(victims)
		d.delivered -= n
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// ---- encoding helpers ----

func seqKey(seq uint64) []byte {
	k := make([]byte, 8)
	binary.BigEndian.PutUint64(k, seq)
	return k
}

// headKey orders the stream index by stream, then by sequence. Streams hold no NUL (Commit checks),
// so "stream\x00" is an unambiguous prefix.
func headKey(stream string, seq uint64) []byte {
	k := make([]byte, 0, len(stream)+9)
	k = append(k, stream...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, seq)
}

// deliveredAtKey orders the delivery-time index by time, then sequence. Times before 1970 (none
// in practice) sort first.
func deliveredAtKey(t time.Time, seq uint64) []byte {
	ns := t.UnixNano()
	if t.IsZero() || ns < 0 {
		ns = 0
	}
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 16), uint64(ns))
	return binary.BigEndian.AppendUint64(k, seq)
}

func splitHeadKey(k []byte) (string, uint64, bool) {
	if len(k) < 9 || k[len(k)-9] != 0 {
		return "", 0, false
	}
	return string(k[:len(k)-9]), binary.BigEndian.Uint64(k[len(k)-8:]), true
}

// find looks an event up by id in a write transaction (update) and returns its header and body
// (bbolt memory) with the bucket holding it.
func (s *Bolt) find(tx *bolt.Tx, id string) (Event, []byte, *bolt.Bucket, error) {
	return findSeq(tx, id, s.ids.getTx(tx, id))
}

// findOp is find for a recorded op: by the op's sequence number when it gives one (Op.Seq), a
// get in the pending bucket instead of a read of the id index before it (the id index is a
// B-tree of random keys beside its journal's overlay: the larger part of a delivery record's
// look-up). The record there must be the op's event; anything else falls back to find.
func (s *Bolt) findOp(tx *bolt.Tx, op Op) (Event, []byte, *bolt.Bucket, error) {
	if op.Seq != 0 {
		b := tx.Bucket(bPending)
		k := seqKey(op.Seq)
		if v := b.Get(k); v != nil {
			if e, body, err := decodeRecord(k, v); err == nil && e.ID == op.ID {
				return e, body, b, nil
			}
		}
	}
	return s.find(tx, op.ID)
}

// findSeq is find of the event whose id the index maps to sk (nil: none).
func findSeq(tx *bolt.Tx, id string, sk []byte) (Event, []byte, *bolt.Bucket, error) {
	if sk == nil {
		return Event{}, nil, nil, fmt.Errorf("store: event %q: %w", id, ErrNotFound)
	}
	for _, name := range [][]byte{bPending, bDead, bDelivered} {
		b := tx.Bucket(name)
		if v := b.Get(sk); v != nil {
			e, body, err := decodeRecord(sk, v)
			return e, body, b, err
		}
	}
	return Event{}, nil, nil, fmt.Errorf("store: event %q: index points at a missing record", id)
}

// list returns up to limit events (limit <= 0: all) of a state's bucket from sequence number
// from on, in insertion order.
func (s *Bolt) list(bucket []byte, from uint64, limit int, withBody bool) ([]Event, error) {
	var out []Event
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		for k, v := c.Seek(seqKey(from)); k != nil; k, v = c.Next() {
			e, b, err := decodeRecord(k, v)
			if err != nil {
				return err
			}
			if withBody {
				e.Body = bytes.Clone(b) // bbolt memory is only valid inside the transaction
			}
			out = append(out, e)
			if limit > 0 && len(out) >= limit {
				break
			}
		}
		return nil
	})
	return out, err
}
