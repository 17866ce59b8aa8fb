// Package store is the connector's one embedded, crash-safe store: a bbolt file holding the
// tracked threads, the event detector's per-thread state and the webhook outbox.
//
// Everything that must survive a crash together is written in one bbolt transaction, and bbolt
// fsyncs every committed Update (NoSync stays false): when Commit returns, the detector state and
// the events it produced are on disk, so the watcher may Ack the chunk that caused them.
//
// The file is locked by the process that opens it (flock). A second process — an operator CLI
// while the server runs — gets a clear "in use" error after a short wait instead of hanging.
package store

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// FileName is the store's file inside the state directory.
const FileName = "t3code-mcp.db"

// schemaVersion is bumped on any incompatible change to the buckets or record encodings, so that
// an older binary refuses a newer file instead of misreading it.
const schemaVersion = 1

// lockTimeout bounds how long Open waits for another process to release the file.
const lockTimeout = 2 * time.Second

// Bucket names. Events live in exactly one of the three state buckets, keyed by their sequence
// number (8 bytes big-endian, so cursor order is insertion order).
var (
	bMeta      = []byte("meta")
	bThreads   = []byte("threads")    // thread id → JSON Thread
	bDetector  = []byte("detector")   // opaque key → opaque bytes
	bPending   = []byte("ev_pending") // seq → JSON record
	bDead      = []byte("ev_dead")    // seq → JSON record
	bDelivered = []byte("ev_delivered")
	bEventIDs  = []byte("ev_ids")     // event id → seq (idempotency and lookup by id)
	bHeads     = []byte("ev_streams") // stream 0x00 seq → nil, pending only: the per-stream FIFO index
	kVersion   = []byte("version")
)

var allBuckets = [][]byte{bMeta, bThreads, bDetector, bPending, bDead, bDelivered, bEventIDs, bHeads}

// Event states.
const (
	StatePending   = "pending"
	StateDelivered = "delivered"
	StateDead      = "dead"
)

// Errors callers may test with errors.Is.
var (
	ErrNotFound   = errors.New("not found")
	ErrNotPending = errors.New("event is not pending")
	ErrInUse      = errors.New("the store is in use by another process")
)

// Store is an open store. It is safe for concurrent use.
type Store struct {
	db   *bolt.DB
	path string
}

// Thread is a thread the connector tracks (started or adopted through it).
type Thread struct {
	ID            string    `json:"id"`
	Machine       string    `json:"machine"`
	ProjectID     string    `json:"projectId,omitempty"`
	ProjectTitle  string    `json:"projectTitle,omitempty"`
	Title         string    `json:"title,omitempty"`
	Origin        string    `json:"origin,omitempty"`
	Watch         bool      `json:"watch,omitempty"`
	LastMessageID string    `json:"lastMessageId,omitempty"` // our last dispatched message id
	LastStatus    string    `json:"lastStatus,omitempty"`
	CreatedAt     time.Time `json:"createdAt"`
	UpdatedAt     time.Time `json:"updatedAt"`
}

// Event is one outbox record: a webhook body waiting for, or done with, delivery.
type Event struct {
	ID     string `json:"id"`     // unique; the webhook-id; a repeated insert is ignored
	Stream string `json:"stream"` // ordering key (machine/thread): delivered in insertion order
	Body   []byte `json:"body"`   // the JSON webhook body, sent as is
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

// Batch is what Commit writes in one transaction.
type Batch struct {
	// Detector sets opaque detector state per key; a nil value deletes the key.
	Detector map[string][]byte
	// Events are appended to the outbox in slice order; an event whose ID is already stored (in
	// any state, until pruned) is skipped, so replaying the same batch is harmless.
	Events []Event
	// Threads are upserted like PutThread.
	Threads []Thread
}

// Open opens (creating if needed) <dir>/t3code-mcp.db. The directory is created 0700 and the file
// 0600: it names machines, projects and threads.
func Open(dir string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("store: no state directory given (set T3CODE_MCP_STATE_DIR)")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("store: cannot create state directory %s: %w (set T3CODE_MCP_STATE_DIR to a writable directory)", dir, err)
	}
	path := filepath.Join(dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: lockTimeout})
	if err != nil {
		switch {
		case errors.Is(err, bolterrors.ErrTimeout):
			return nil, fmt.Errorf("store: %s: %w (is another t3code-mcp running with this state directory?)", path, ErrInUse)
		case errors.Is(err, os.ErrPermission):
			return nil, fmt.Errorf("store: cannot open %s: state directory %s is not writable: %w (set T3CODE_MCP_STATE_DIR to a writable directory)", path, dir, err)
		default:
			return nil, fmt.Errorf("store: cannot open %s: %w", path, err)
		}
	}
	s := &Store{db: db, path: path}
	if err := s.init(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) init() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("store: %s: creating bucket %s: %w", s.path, name, err)
			}
		}
		meta := tx.Bucket(bMeta)
		if v := meta.Get(kVersion); v != nil {
			if len(v) != 8 {
				return fmt.Errorf("store: %s: corrupt schema version", s.path)
			}
			if got := binary.BigEndian.Uint64(v); got > schemaVersion {
				return fmt.Errorf("store: %s was written by a newer t3code-mcp (schema %d, this binary knows %d)", s.path, got, schemaVersion)
			}
			return nil
		}
		return meta.Put(kVersion, seqKey(schemaVersion))
	})
}

// Path is the store's file.
func (s *Store) Path() string { return s.path }

// Close closes the file (waiting for running transactions).
func (s *Store) Close() error { return s.db.Close() }

// ---- threads ----

// PutThread inserts or replaces a tracked thread.
func (s *Store) PutThread(t Thread) error {
	return s.db.Update(func(tx *bolt.Tx) error { return putThread(tx, t) })
}

func putThread(tx *bolt.Tx, t Thread) error {
	if t.ID == "" || t.Machine == "" {
		return errors.New("store: a thread needs an ID and a Machine")
	}
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	return tx.Bucket(bThreads).Put([]byte(t.ID), b)
}

// GetThread returns a tracked thread.
func (s *Store) GetThread(id string) (Thread, bool, error) {
	var t Thread
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bThreads).Get([]byte(id))
		if v == nil {
			return nil
		}
		ok = true
		return json.Unmarshal(v, &t)
	})
	return t, ok, err
}

// DeleteThread stops tracking a thread; deleting an unknown id is not an error.
func (s *Store) DeleteThread(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bThreads).Delete([]byte(id)) })
}

// ListThreads returns every tracked thread, oldest first (CreatedAt, then ID).
func (s *Store) ListThreads() ([]Thread, error) {
	var out []Thread
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bThreads).ForEach(func(_, v []byte) error {
			var t Thread
			if err := json.Unmarshal(v, &t); err != nil {
				return err
			}
			out = append(out, t)
			return nil
		})
	})
	sort.SliceStable(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, err
}

// ---- detector state and events, together ----

// Commit writes a batch in one fsynced transaction: all of it or none of it.
func (s *Store) Commit(b Batch) error {
	for i, e := range b.Events {
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
	return s.db.Update(func(tx *bolt.Tx) error {
		det := tx.Bucket(bDetector)
		for k, v := range b.Detector {
			var err error
			if v == nil {
				err = det.Delete([]byte(k))
			} else {
				err = det.Put([]byte(k), v)
			}
			if err != nil {
				return err
			}
		}
		for _, t := range b.Threads {
			if err := putThread(tx, t); err != nil {
				return err
			}
		}
		pending, ids, heads := tx.Bucket(bPending), tx.Bucket(bEventIDs), tx.Bucket(bHeads)
		for _, e := range b.Events {
			if ids.Get([]byte(e.ID)) != nil {
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
			if err := putEvent(pending, e); err != nil {
				return err
			}
			if err := ids.Put([]byte(e.ID), seqKey(seq)); err != nil {
				return err
			}
			if err := heads.Put(headKey(e.Stream, seq), nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// Detector returns the detector state stored under key.
func (s *Store) Detector(key string) ([]byte, bool, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bDetector).Get([]byte(key)); v != nil {
			out = append([]byte{}, v...) // bbolt memory is only valid inside the transaction
		}
		return nil
	})
	return out, out != nil, err
}

// ---- outbox queue ----

// Pending returns up to limit pending events (limit <= 0: all) in insertion order, which is FIFO
// within every stream.
func (s *Store) Pending(limit int) ([]Event, error) {
	return s.list(bPending, limit)
}

// Dead returns the dead letters, oldest first.
func (s *Store) Dead() ([]Event, error) { return s.list(bDead, 0) }

// Heads returns the oldest pending event of each stream (up to limit streams; limit <= 0: all),
// ordered by stream. It is what a deliverer works from: only a stream's head may be delivered,
// and every stream's head is visible however long another stream's backlog is.
func (s *Store) Heads(limit int) ([]Event, error) {
	var out []Event
	err := s.db.View(func(tx *bolt.Tx) error {
		pending := tx.Bucket(bPending)
		c := tx.Bucket(bHeads).Cursor()
		for k, _ := c.First(); k != nil; {
			stream, seq, ok := splitHeadKey(k)
			if !ok {
				return fmt.Errorf("store: corrupt stream index key %q", k)
			}
			e, err := getEvent(pending, seq)
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

// Get returns an event in any state.
func (s *Store) Get(id string) (Event, error) {
	var e Event
	err := s.db.View(func(tx *bolt.Tx) error {
		var err error
		e, _, err = find(tx, id)
		return err
	})
	return e, err
}

// MarkDelivered records a successful attempt at time at.
func (s *Store) MarkDelivered(id string, at time.Time) error {
	return s.finish(id, bDelivered, func(e *Event) {
		e.State, e.DeliveredAt, e.NextAttempt = StateDelivered, at, time.Time{}
	})
}

// MarkDead records a final failed attempt (or an expiry) at time at: the event stops blocking
// its stream and waits in the dead letters for an operator.
func (s *Store) MarkDead(id string, at time.Time, reason string) error {
	return s.finish(id, bDead, func(e *Event) {
		e.State, e.DeadAt, e.NextAttempt, e.LastError = StateDead, at, time.Time{}, reason
	})
}

// MarkRetry records a failed attempt: the event stays its stream's head until next.
func (s *Store) MarkRetry(id string, next time.Time, errMsg string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		e, b, err := find(tx, id)
		if err != nil {
			return err
		}
		if e.State != StatePending {
			return fmt.Errorf("store: event %q is %s: %w", id, e.State, ErrNotPending)
		}
		e.Attempts++
		e.NextAttempt, e.LastError = next, errMsg
		return putEvent(b, e)
	})
}

// finish moves a pending event, counting one attempt, to a final state's bucket.
func (s *Store) finish(id string, to []byte, set func(*Event)) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		e, b, err := find(tx, id)
		if err != nil {
			return err
		}
		if e.State != StatePending {
			return fmt.Errorf("store: event %q is %s: %w", id, e.State, ErrNotPending)
		}
		e.Attempts++
		set(&e)
		if err := b.Delete(seqKey(e.Seq)); err != nil {
			return err
		}
		if err := tx.Bucket(bHeads).Delete(headKey(e.Stream, e.Seq)); err != nil {
			return err
		}
		return putEvent(tx.Bucket(to), e)
	})
}

// Requeue moves dead letters back to pending at time at, with a fresh retry window (EnqueuedAt =
// at, Attempts = 0); LastError is kept for the record until the next attempt. With no ids it
// requeues every dead letter. Ids that are not dead (pending or delivered) are skipped; an id that
// is not stored at all fails the whole call. It returns how many events were requeued.
//
// A requeued event keeps its sequence number, so it goes back to its place in its stream: ahead
// of any later pending events of the same stream.
func (s *Store) Requeue(at time.Time, ids ...string) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		dead := tx.Bucket(bDead)
		var evs []Event
		if len(ids) == 0 {
			err := dead.ForEach(func(k, v []byte) error {
				e, err := decodeEvent(k, v)
				evs = append(evs, e)
				return err
			})
			if err != nil {
				return err
			}
		}
		for _, id := range ids {
			e, _, err := find(tx, id)
			if err != nil {
				return err
			}
			if e.State == StateDead {
				evs = append(evs, e)
			}
		}
		for _, e := range evs {
			if dead.Get(seqKey(e.Seq)) == nil {
				continue // the same id given twice
			}
			if err := dead.Delete(seqKey(e.Seq)); err != nil {
				return err
			}
			e.State, e.EnqueuedAt, e.Attempts = StatePending, at, 0
			e.NextAttempt, e.DeadAt = time.Time{}, time.Time{}
			if err := putEvent(tx.Bucket(bPending), e); err != nil {
				return err
			}
			if err := tx.Bucket(bHeads).Put(headKey(e.Stream, e.Seq), nil); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Prune deletes delivered events delivered before the cutoff, with their ids (a later insert of
// a pruned id is then new again: keep the cutoff longer than any replay window). Dead letters are
// never pruned: they wait for an operator. It returns how many were deleted.
func (s *Store) Prune(deliveredBefore time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		n = 0
		ids, delivered := tx.Bucket(bEventIDs), tx.Bucket(bDelivered)
		// Collect first, delete after: deleting under a live bbolt cursor can skip keys.
		var keys [][]byte
		err := delivered.ForEach(func(k, v []byte) error {
			e, err := decodeEvent(k, v)
			if err != nil {
				return err
			}
			if e.DeliveredAt.Before(deliveredBefore) {
				if err := ids.Delete([]byte(e.ID)); err != nil {
					return err
				}
				keys = append(keys, append([]byte{}, k...))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := delivered.Delete(k); err != nil {
				return err
			}
		}
		n = len(keys)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// Counts returns how many events are in each state.
func (s *Store) Counts() (pending, dead, delivered int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		pending = tx.Bucket(bPending).Stats().KeyN
		dead = tx.Bucket(bDead).Stats().KeyN
		delivered = tx.Bucket(bDelivered).Stats().KeyN
		return nil
	})
	return pending, dead, delivered, err
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

func splitHeadKey(k []byte) (string, uint64, bool) {
	if len(k) < 9 || k[len(k)-9] != 0 {
		return "", 0, false
	}
	return string(k[:len(k)-9]), binary.BigEndian.Uint64(k[len(k)-8:]), true
}

func putEvent(b *bolt.Bucket, e Event) error {
	v, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return b.Put(seqKey(e.Seq), v)
}

func decodeEvent(k, v []byte) (Event, error) {
	var e Event
	if err := json.Unmarshal(v, &e); err != nil {
		return e, fmt.Errorf("store: corrupt event record: %w", err)
	}
	e.Seq = binary.BigEndian.Uint64(k)
	return e, nil
}

func getEvent(b *bolt.Bucket, seq uint64) (Event, error) {
	k := seqKey(seq)
	v := b.Get(k)
	if v == nil {
		return Event{}, fmt.Errorf("store: corrupt stream index: event #%d is not pending", seq)
	}
	return decodeEvent(k, v)
}

// find looks an event up by id and returns it with the bucket holding it.
func find(tx *bolt.Tx, id string) (Event, *bolt.Bucket, error) {
	sk := tx.Bucket(bEventIDs).Get([]byte(id))
	if sk == nil {
		return Event{}, nil, fmt.Errorf("store: event %q: %w", id, ErrNotFound)
	}
	for _, name := range [][]byte{bPending, bDead, bDelivered} {
		b := tx.Bucket(name)
		if v := b.Get(sk); v != nil {
			e, err := decodeEvent(sk, v)
			return e, b, err
		}
	}
	return Event{}, nil, fmt.Errorf("store: event %q: index points at a missing record", id)
}

func (s *Store) list(bucket []byte, limit int) ([]Event, error) {
	var out []Event
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			e, err := decodeEvent(k, v)
			if err != nil {
				return err
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
