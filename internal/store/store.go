// Package store is the connector's one embedded, crash-safe store: a bbolt file holding the
// tracked threads, the event detector's per-thread state, the webhook outbox and the
// t3_dispatch idempotency keys.
//
// Everything that must survive a crash together is written in one bbolt transaction, and bbolt
// fsyncs every committed Update (NoSync stays false): when Commit returns, the detector state and
// the events it produced are on disk, so the watcher may Ack the chunk that caused them.
//
// The file is locked by the process that opens it (flock). A second process — an operator CLI
// while the server runs — gets a clear "in use" error after a short wait instead of hanging.
package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
)

// FileName is the store's file inside the state directory.
const FileName = "t3code-mcp.db"

// schemaVersion is bumped on any incompatible change to the buckets or record encodings, so that
// an older binary refuses a newer file instead of misreading it. An older file is migrated at
// Open (migrate.go). 2: event records are a JSON header, the body raw in ev_bodies (1: one JSON
// record per event, the body base64 inside it). 3: delivered events are indexed by delivery time
// (ev_delivered_at), so a prune reads only what it deletes. 4: detector states and event ids may
// wait in their journals (detjournal.go) before they are in their buckets: a binary that does not
// read the journals would see older states and miss ids. 5: an event's record is its header and
// its body in one value (header.go); ev_bodies is gone.
const schemaVersion = 5

// lockTimeout bounds how long Open waits for another process to release the file.
const lockTimeout = 2 * time.Second

// Bucket names. An event's record (its header and its body, header.go) lives in exactly one of
// the three state buckets, keyed by its sequence number (8 bytes big-endian, so cursor order is
// insertion order).
var (
	bMeta      = []byte("meta")
	bThreads   = []byte("threads")    // thread id → JSON Thread
	bDetector  = []byte("detector")   // opaque key → opaque bytes
	bPending   = []byte("ev_pending") // seq → record: JSON header and raw body
	bDead      = []byte("ev_dead")    // seq → record
	bDelivered = []byte("ev_delivered")
	// bBodies (seq → the raw JSON body) held the bodies in schemas 2–4; migrate empties it into
	// the records and deletes it.
	bBodies   = []byte("ev_bodies")
	bEventIDs = []byte("ev_ids")     // event id → seq (idempotency and lookup by id)
	bHeads    = []byte("ev_streams") // stream 0x00 seq → nil, pending only: the per-stream FIFO index
	// delivery time (8 bytes big-endian Unix nanoseconds) seq → event id, delivered only: Prune
	// walks it from the oldest and stops at the cutoff.
	bDeliveredAt = []byte("ev_delivered_at")
	kVersion     = []byte("version")
)

// appendBuckets are the buckets whose keys are written in increasing order (a sequence number,
// or a time then one), whose records are never rewritten in place, and which are deleted from
// the front: the journals and the delivered events' records. bbolt splits a page that outgrew its
// size at FillPercent of it (0.5 by default, for random keys), which leaves every page of such a
// bucket half full forever after, so its tail page splits again every half page of appends (a
// page more in that transaction) and the tree has twice the leaves and branch pages it needs.
// Filled to the full page (update sets it on every write transaction: bbolt does not store it), a
// tail page splits half as often. Not the pending events' records: a retry or a delivery
// rewrites or moves every one of them, and a full page would split at every such rewrite.
var appendBuckets = [][]byte{bDetJournal, bIDJournal, bDelivered, bDeliveredAt}

var allBuckets = [][]byte{bMeta, bThreads, bDetector, bDetJournal, bPending, bDead, bDelivered, bEventIDs, bIDJournal, bHeads, bDeliveredAt, bIdempotency}

// Errors callers may test with errors.Is.
var (
	ErrNotFound   = errors.New("not found")
	ErrNotPending = errors.New("event is not pending")
	ErrInUse      = errors.New("the store is in use by another process")
)

// Bolt is the bbolt backend of Store: one file, one process. It is safe for concurrent use.
type Bolt struct {
	db   *bolt.DB
	path string

	// counts are the outbox's event counts by state, read from the buckets once at Open and kept
	// current by every write after it commits: this process is the file's only writer (flock),
	// so Counts is O(1) instead of a walk of three buckets.
	countsMu sync.Mutex
	counts   countDelta

	// writeMu is held by every write transaction that may change the detector state or the
	// event ids (update), from its start until the overlays have its changes, so the next one
	// sees them.
	writeMu sync.Mutex
	det     *journal // bDetector's
	ids     *journal // bEventIDs'

}

// Thread is a thread the connector tracks (started or adopted through it). The type is
// tracked.Thread, so that its readers (internal/tools, internal/fleet) need not import the
// store.
type Thread = tracked.Thread

// Batch is what Commit writes in one transaction.
type Batch struct {
	// Detector sets opaque detector state per key; a nil value deletes the key.
	Detector map[string][]byte
	// Events are appended to the outbox in slice order; an event whose ID is already stored (in
	// any state, until pruned) is skipped, so replaying the same batch is harmless.
	Events []Event
	// Threads are upserted like PutThread.
	Threads []Thread
	// DeleteThreads stops tracking these threads.
	DeleteThreads []string
	// PruneThreads stops tracking threads the way a prune does: each (id → the UpdatedAt its row
	// had when the prune judged it) only while its row, read in this batch's own transaction, is
	// still unwatched with that UpdatedAt. A Track committed since (through another replica,
	// which no lock of the pruning process serialises with) rewrote the row and keeps it.
	PruneThreads map[string]time.Time
	// PruneStates deletes detector states the way a prune does: each (key → the thread it
	// belongs to) only while no tracked row, read in this batch's own transaction, watches that
	// thread on that machine, so a baseline a Track stored since (with its watched row, in one
	// transaction) stays.
	PruneStates map[string]StateOwner
	// Fence, when set, makes the batch conditional on the machine's lease (see Fence).
	Fence *Fence
}

// StateOwner is the tracked thread a detector state belongs to (see Batch.PruneStates).
type StateOwner struct {
	Machine, Thread string
}

// Prunable says whether a prune may delete a tracked thread whose row is now t (found: it
// exists) when the prune judged the row with UpdatedAt at: the row is still that one.
func Prunable(t Thread, found bool, at time.Time) bool {
	return found && !t.Watch && t.UpdatedAt.Equal(at)
}

// Orphaned says whether a detector state owned by o may be pruned when o's tracked row is now t
// (found: it exists): no row watches the thread on that machine.
func Orphaned(t Thread, found bool, o StateOwner) bool {
	return !found || !t.Watch || t.Machine != o.Machine
}

// Open opens (creating if needed) <dir>/t3code-mcp.db. The directory is created 0700 and the file
// 0600: it names machines, projects and threads.
func Open(dir string) (*Bolt, error) {
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
	s := &Bolt{db: db, path: path, det: newJournal(bDetector, bDetJournal), ids: newJournal(bEventIDs, bIDJournal)}
	if err := s.init(); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

func (s *Bolt) init() error {
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
			got := binary.BigEndian.Uint64(v)
			if got > schemaVersion {
				return fmt.Errorf("store: %s was written by a newer t3code-mcp (schema %d, this binary knows %d)", s.path, got, schemaVersion)
			}
			if got < schemaVersion {
				if err := migrate(tx, got); err != nil {
					return fmt.Errorf("store: %s: migrating from schema %d to %d: %w", s.path, got, schemaVersion, err)
				}
			}
		}
		if err := meta.Put(kVersion, seqKey(schemaVersion)); err != nil {
			return err
		}
		for _, j := range []*journal{s.det, s.ids} {
			if err := j.load(tx); err != nil {
				return fmt.Errorf("store: %s: %w", s.path, err)
			}
		}
		s.counts = countDelta{
			pending:   tx.Bucket(bPending).Stats().KeyN,
			dead:      tx.Bucket(bDead).Stats().KeyN,
			delivered: tx.Bucket(bDelivered).Stats().KeyN,
		}
		return nil
	})
}

// update runs fn in one fsynced write transaction (with a slice of the detector journal's
// checkpoint) and, once it committed, applies the change of the event counts fn noted in d and
// the detector changes it journaled.
func (s *Bolt) update(fn func(tx *bolt.Tx, d *countDelta) error) error {
	return s.updateTimed(fn, nil)
}

// updateTimed is update noting the transaction's timing in t (nil: none).
func (s *Bolt) updateTimed(fn func(tx *bolt.Tx, d *countDelta) error, t *txTiming) error {
	var d countDelta
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if err := s.db.Update(func(tx *bolt.Tx) error {
		d = countDelta{} // bbolt runs fn once, but a reset keeps a failed attempt's notes out
		for _, name := range appendBuckets {
			tx.Bucket(name).FillPercent = 1
		}
		s.det.begin()
		s.ids.begin()
		if err := fn(tx, &d); err != nil {
			return err
		}
		if err := s.det.checkpoint(tx); err != nil {
			return err
		}
		if err := s.ids.checkpoint(tx); err != nil {
			return err
		}
		if t != nil {
			t.moved, t.dropped = s.det.moved+s.ids.moved, s.det.dropped+s.ids.dropped
			t.measure(tx)
		}
		return nil
	}); err != nil {
		s.det.abort() // the changes were not written
		s.ids.abort()
		return err
	}
	s.det.committed()
	s.ids.committed()
	s.countsMu.Lock()
	s.counts.pending += d.pending
	s.counts.dead += d.dead
	s.counts.delivered += d.delivered
	s.countsMu.Unlock()
	return nil
}

// Path is the store's file.
func (s *Bolt) Path() string { return s.path }

// Location is the store's file (Store.Location).
func (s *Bolt) Location() string { return s.path }

// Close closes the file (waiting for running transactions).
func (s *Bolt) Close() error { return s.db.Close() }

// ---- threads ----

// PutThread inserts or replaces a tracked thread.
func (s *Bolt) PutThread(t Thread) error {
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
func (s *Bolt) GetThread(id string) (Thread, bool, error) {
	var t Thread
	var ok bool
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bThreads).Get([]byte(id))
		if v == nil {
			return nil
		}
		ok = true
		return decodeThread(v, &t)
	})
	return t, ok, err
}

// GetThreads returns the tracked threads among ids, by id, read in one
// transaction (the detector looks up every row of a chunk at once); ids not
// tracked are absent from the map.
func (s *Bolt) GetThreads(ids []string) (map[string]Thread, error) {
	out := make(map[string]Thread, len(ids))
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bThreads)
		for _, id := range ids {
			if _, done := out[id]; done {
				continue
			}
			v := b.Get([]byte(id))
			if v == nil {
				continue
			}
			var t Thread
			if err := decodeThread(v, &t); err != nil {
				return fmt.Errorf("store: thread %q: %w", id, err)
			}
			out[id] = t
		}
		return nil
	})
	return out, err
}

// DeleteThread stops tracking a thread; deleting an unknown id is not an error.
func (s *Bolt) DeleteThread(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bThreads).Delete([]byte(id)) })
}

// ListThreads returns every tracked thread, oldest first (CreatedAt, then ID).
func (s *Bolt) ListThreads() ([]Thread, error) {
	var out []Thread
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bThreads).ForEach(func(_, v []byte) error {
			var t Thread
			if err := decodeThread(v, &t); err != nil {
				return err
			}
			out = append(out, t)
			return nil
		})
	})
	SortThreads(out)
	return out, err
}

// SortThreads sorts threads as ListThreads returns them: oldest first (CreatedAt, then ID).
func SortThreads(ts []Thread) {
	sort.SliceStable(ts, func(i, j int) bool {
		if !ts[i].CreatedAt.Equal(ts[j].CreatedAt) {
			return ts[i].CreatedAt.Before(ts[j].CreatedAt)
		}
		return ts[i].ID < ts[j].ID
	})
}

// ---- detector state and events, together ----

// Commit writes a batch in one fsynced transaction: all of it or none of it.
func (s *Bolt) Commit(b Batch) error {
	if err := validate(b); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx, d *countDelta) error { return s.writeBatch(tx, b, d) })
}

// CommitBatches writes several batches in one fsynced transaction: all of them or none of them.
func (s *Bolt) CommitBatches(bs []Batch) error {
	for _, b := range bs {
		if err := validate(b); err != nil {
			return err
		}
	}
	return s.update(func(tx *bolt.Tx, d *countDelta) error {
		for _, b := range bs {
			if err := s.writeBatch(tx, b, d); err != nil {
				return err
			}
		}
		return nil
	})
}

// CommitBatchesAndOps writes bs and applies the outbox's ops in one fsynced transaction
// (store.OpsCommitter, for Group.Record): the batches all or nothing, each op as Record applies
// it (one that cannot apply is skipped and reported in errs at its index). appended, when not
// nil, is called inside the transaction with every event it appends, as stored (Seq set), in
// sequence order; the transaction may still fail after it.
func (s *Bolt) CommitBatchesAndOps(bs []Batch, ops []Op, appended func(Event)) (errs []error, err error) {
	return s.commitTimed(bs, ops, appended, nil)
}

// commitTimed is CommitBatchesAndOps noting the transaction's timing in t (nil: none).
func (s *Bolt) commitTimed(bs []Batch, ops []Op, appended func(Event), t *txTiming) (errs []error, err error) {
	for _, b := range bs {
		if err := validate(b); err != nil {
			return nil, err
		}
	}
	err = s.updateTimed(func(tx *bolt.Tx, d *countDelta) error {
		for _, b := range bs {
			if err := s.writeBatchReporting(tx, b, d, appended); err != nil {
				return err
			}
		}
		var fatal error
		errs, fatal = s.applyOps(tx, ops, d)
		return fatal
	}, t)
	if err != nil {
		return nil, err
	}
	return errs, nil
}

var _ OpsCommitter = (*Bolt)(nil)

// Validate checks a batch the way Commit does, before any transaction: a backend's Commit
// fails with its error, and Group fails such a batch alone.
func Validate(b Batch) error { return validate(b) }

func validate(b Batch) error {
	if err := checkEvents(b.Events); err != nil {
		return err
	}
	for _, t := range b.Threads {
		if t.ID == "" || t.Machine == "" {
			return errors.New("store: a thread needs an ID and a Machine")
		}
	}
	for k := range b.PruneStates {
		if k == "" {
			return errors.New("store: a detector state needs a key")
		}
	}
	for k := range b.Detector {
		if k == "" {
			// bbolt refuses an empty key only inside the transaction, failing the whole
			// group commit the batch is part of; refused here, the batch fails alone.
			return errors.New("store: a detector state needs a key")
		}
	}
	return nil
}

func (s *Bolt) writeBatch(tx *bolt.Tx, b Batch, d *countDelta) error {
	return s.writeBatchReporting(tx, b, d, nil)
}

// writeBatchReporting is writeBatch calling appended (when not nil) with each event it appends.
// The detector states are journaled (detjournal.go).
func (s *Bolt) writeBatchReporting(tx *bolt.Tx, b Batch, d *countDelta, appended func(Event)) error {
	for k, v := range b.Detector {
		if err := s.det.set(tx, k, v); err != nil {
			return err
		}
	}
	for _, t := range b.Threads {
		if err := putThread(tx, t); err != nil {
			return err
		}
	}
	for _, id := range b.DeleteThreads {
		if err := tx.Bucket(bThreads).Delete([]byte(id)); err != nil {
			return err
		}
	}
	if err := s.prune(tx, b); err != nil {
		return err
	}
	return s.appendEvents(tx, b.Events, d, appended)
}

// prune writes a batch's PruneStates and PruneThreads, each deletion only while the tracked row
// this transaction reads allows it (Orphaned, Prunable). The states are judged first, against
// the rows as they were before this batch's thread deletions.
func (s *Bolt) prune(tx *bolt.Tx, b Batch) error {
	threads := tx.Bucket(bThreads)
	row := func(id string) (Thread, bool, error) {
		var t Thread
		v := threads.Get([]byte(id))
		if v == nil {
			return t, false, nil
		}
		return t, true, decodeThread(v, &t)
	}
	for k, o := range b.PruneStates {
		t, found, err := row(o.Thread)
		if err != nil {
			return err
		}
		if Orphaned(t, found, o) {
			if err := s.det.set(tx, k, nil); err != nil {
				return err
			}
		}
	}
	for id, at := range b.PruneThreads {
		t, found, err := row(id)
		if err != nil {
			return err
		}
		if Prunable(t, found, at) {
			if err := threads.Delete([]byte(id)); err != nil {
				return err
			}
		}
	}
	return nil
}

// ForEachDetector calls fn with every detector key and value, in key order
// (the detector's start-up scan for pending look-ups, and pruning): the journal's overlay over
// the bucket. The slices are copies.
func (s *Bolt) ForEachDetector(fn func(key string, value []byte) error) error {
	// The overlay first, then the bucket: a change checkpointed after the copy was taken is in
	// the bucket the read transaction sees (the overlay loses a key only after its checkpoint
	// committed).
	over := s.det.snapshot()
	return s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bDetector).Cursor()
		k, v := c.First()
		for k != nil || len(over) > 0 {
			if len(over) > 0 && (k == nil || over[0].key <= string(k)) {
				e := over[0]
				over = over[1:]
				if k != nil && e.key == string(k) {
					k, v = c.Next()
				}
				if e.del {
					continue
				}
				if err := fn(e.key, bytes.Clone(e.val)); err != nil {
					return err
				}
				continue
			}
			if err := fn(string(k), append([]byte{}, v...)); err != nil {
				return err
			}
			k, v = c.Next()
		}
		return nil
	})
}

// Detector returns the detector state stored under key: the journal's, else the bucket's.
func (s *Bolt) Detector(key string) ([]byte, bool, error) {
	// The overlay first (see ForEachDetector).
	if v, deleted, ok := s.det.get(key); ok {
		return v, !deleted, nil
	}
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bDetector).Get([]byte(key)); v != nil {
			out = append([]byte{}, v...) // bbolt memory is only valid inside the transaction
		}
		return nil
	})
	return out, out != nil, err
}
