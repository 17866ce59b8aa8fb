package store

import (
	"encoding/json"
	"time"
)

// Store is what the connector keeps durably: the tracked threads, the event detector's
// per-thread state and the webhook outbox. Two backends provide it: Bolt (Open: one bbolt file,
// the default, one process) and pgstore (PostgreSQL, shared by several replicas). Both pass the
// same contract suite (storetest), which is the precise statement of what each method promises.
//
// Sequence numbers order events: they grow with every commit, in commit order (an event
// committed later has a higher one), so a reader that saw everything up to n finds everything
// newer with PendingAfter(n).
type Store interface {
	// PutThread inserts or replaces a tracked thread.
	PutThread(t Thread) error
	// GetThread returns a tracked thread.
	GetThread(id string) (Thread, bool, error)
	// GetThreads returns the tracked threads among ids, by id, in one read; ids not tracked
	// are absent from the map.
	GetThreads(ids []string) (map[string]Thread, error)
	// DeleteThread stops tracking a thread; deleting an unknown id is not an error.
	DeleteThread(id string) error
	// ListThreads returns every tracked thread, oldest first (CreatedAt, then ID).
	ListThreads() ([]Thread, error)

	// Commit writes a batch in one durable transaction: all of it or none of it.
	Commit(b Batch) error
	// CommitBatches writes several batches in one durable transaction (Group's group commit):
	// all of them or none of them.
	CommitBatches(bs []Batch) error
	// Detector returns the detector state stored under key.
	Detector(key string) ([]byte, bool, error)
	// ForEachDetector calls fn with every detector key and value, in key order.
	ForEachDetector(fn func(key string, value []byte) error) error

	// Pending returns up to limit pending events (limit <= 0: all) with bodies, in sequence order.
	Pending(limit int) ([]Event, error)
	// Dead returns the dead letters with bodies, oldest first.
	Dead() ([]Event, error)
	// Heads returns the oldest pending event of each stream (up to limit; <= 0: all), by stream.
	Heads(limit int) ([]Event, error)
	// PendingIndex calls fn for every pending event's stream and sequence number, in sequence
	// order within each stream, and returns the highest sequence number committed so far.
	PendingIndex(fn func(stream string, seq uint64)) (last uint64, err error)
	// PendingAfter returns up to limit pending events with a sequence number above after, in
	// sequence order, without bodies.
	PendingAfter(after uint64, limit int) ([]Event, error)
	// PendingEvent returns one pending event (ErrNotPending when it is not).
	PendingEvent(seq uint64, withBody bool) (Event, error)
	// Get returns an event in any state, with its body (ErrNotFound when unknown).
	Get(id string) (Event, error)
	// Counts returns how many events are in each state.
	Counts() (pending, dead, delivered int, err error)

	// Record applies delivery outcomes to pending events in one durable transaction; errs
	// reports the ops that could not apply (by index), err a failure of the whole batch.
	Record(ops []Op) (errs []error, err error)
	// RequeueEvents moves dead letters back to pending (all of them when no id is given) with a
	// fresh retry window, and returns them without bodies.
	RequeueEvents(at time.Time, ids ...string) ([]Event, error)
	// Requeue is RequeueEvents returning how many it moved.
	Requeue(at time.Time, ids ...string) (int, error)
	// Prune deletes delivered events delivered before the cutoff; dead letters are kept.
	Prune(deliveredBefore time.Time) (int, error)

	// ClaimIdempotency stores rec under its key unless the key is already stored, atomically (of
	// two racing calls, in one process or on several replicas, exactly one gets claimed); when
	// the key is taken it returns the stored entry and writes nothing.
	ClaimIdempotency(rec Idempotency) (stored Idempotency, claimed bool, err error)
	// GetIdempotency returns the entry stored under key.
	GetIdempotency(key string) (Idempotency, bool, error)
	// UpdateIdempotency replaces a stored key's record, keeping CreatedAt (ErrNotFound if absent).
	UpdateIdempotency(key string, record json.RawMessage) error
	// DeleteIdempotency forgets a key; an unknown key is not an error.
	DeleteIdempotency(key string) error
	// PruneIdempotency forgets the keys created before before and returns how many.
	PruneIdempotency(before time.Time) (int, error)

	// Location names the store for people: the bbolt file's path, or the database URL without
	// its password.
	Location() string
	// Close releases the store.
	Close() error
}

var _ Store = (*Bolt)(nil)

// Claimer is implemented by a store that several replicas deliver from (PostgreSQL): before an
// attempt (or the enrichment that precedes it), a replica claims the event, so that no two
// replicas send one event at the same time. The bbolt store, which one process owns, has no
// claims (its outbox is the only deliverer).
type Claimer interface {
	// ClaimHeads claims, in one round trip, the head (oldest pending event) of each of the
	// streams for claimant for ttl (by the store's clock). A head is claimed when no other
	// claimant holds it, or when its claim expired (its holder died: taken over); a claimant
	// renews its own claims so (see below). Only heads are claimable, so per-stream order holds across
	// replicas. A head the claimant holds with at least two thirds of ttl left is answered as
	// claimed without being renewed (no write: a claimant that asks again for heads it is still
	// waiting to start costs no row update); with less left it is renewed for ttl.
	// HeadClaim.Left says how long each claim has to run. It answers one HeadClaim per stream,
	// in the order given.
	ClaimHeads(streams []string, claimant string, ttl time.Duration) ([]HeadClaim, error)
	// ReleaseClaims ends every claim claimant holds (a replica shutting down), so that the
	// other replicas take its heads at once; it returns how many it released.
	ReleaseClaims(claimant string) (int, error)
}

// HeadClaim is ClaimHeads' answer for one stream.
type HeadClaim struct {
	Stream string
	// Head is the sequence number of the stream's oldest pending event; 0 when the stream has
	// none (every event the caller knew of was delivered or given up, by another replica).
	Head uint64
	// Claimed: the head is the caller's now, and Event holds it with its body. False with a
	// Head: another claimant holds it (or is recording its outcome right now).
	Claimed bool
	// Left is, when Claimed, how long the claim has to run, by the store's clock when it
	// answered (at least two thirds of the ttl asked for).
	Left  time.Duration
	Event Event
}
