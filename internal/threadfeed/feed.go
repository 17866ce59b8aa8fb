// Package threadfeed keeps the projection of a thread that a t3_wait waits on
// current from T3's own per-thread stream (orchestration.subscribeThread), so
// that the wait's result is rendered from memory once the run settles,
// instead of reading the thread from T3 after the settle (issue 12: the
// result's bounded read was most of a wake-up), and so that the wait is woken
// as soon as this stream shows the run settled (Look), without waiting for the
// shell stream, whose next chunk T3 holds until the connector's Ack of the one
// before (after its group commit).
//
// A Feed subscribes with acceptBoundedSnapshot: its first item is a snapshot
// of the thread (trimmed as it is scanned to the newest runs, t3.Keep, like
// the bounded read it replaces), then every event of the thread after it.
// V2 events carry whole records, applied as upserts by id (runs, messages,
// timeline rows, checkpoints, runtime requests, the thread); the other event
// types, and unknown ones, are skipped but advance the cursor. A snapshot may
// come at any time (T3 resends one after a gap): it replaces the projection.
//
// The stream rides the machine's one socket (the watcher's). When that socket
// drops, the feed subscribes again on the next one the watcher opens, from
// the newest sequence it applied (T3 replays what came since, or sends a
// fresh snapshot when the gap is too large), so its waits go on being woken
// by it and answered from it. A stream that ends, fails otherwise or sends
// what cannot be applied marks the feed failed: its waiters read the thread
// as before. Feeds are shared and bounded by a Pool.
package threadfeed

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
)

// Dial returns the machine's live socket, waiting for one until ctx ends (the
// watcher's Conn).
type Dial func(ctx context.Context) (*effectrpc.Conn, error)

// keepRuns is how many of the thread's newest runs a feed keeps from its
// snapshot: the runs a wait result shows (tools: three).
const keepRuns = 3

// readAhead is how many of a feed's chunks may wait for it, acknowledged, while it applies
// one (effectrpc.StreamAhead): T3 sends the next chunk without waiting for the feed's turn on a
// core, and a feed busy with a snapshot holds at most this many more.
const readAhead = 2

// onReadMax is the most a feed's chunk may weigh (its values' bytes) to be applied on the
// socket's read loop (applyOnRead): an event's records or a short thread's snapshot, which
// take tens of microseconds; a bigger one (a long thread's snapshot, a replay) goes to the
// feed's goroutine, so the read loop, which every frame of the machine waits for, is not held.
const onReadMax = 16 << 10

// errEnded is a feed's error when T3 ended its stream without a failure.
var errEnded = errors.New("T3 ended the thread subscription")

// Feed is one thread's projection, kept current by its subscription.
type Feed struct {
	Machine, ThreadID string

	cancel context.CancelFunc
	done   chan struct{} // closed when the stream's goroutine has returned
	refs   int           // guarded by the pool's mu

	mu sync.Mutex
	p  *t3api.ThreadProjection // nil until the first snapshot
	// shared is set while a caller holds p too (a read the feed was seeded
	// from, a State handed out): p is copied before the feed next changes
	// it (ownLocked), not each time it is handed over.
	shared bool
	// runs is the thread's number of runs in all (the snapshot kept only the
	// newest); newestOrdinal the highest run ordinal the snapshot held.
	runs          int
	newestOrdinal int64
	cursor        int64
	live          bool // subscribed, and T3 sent what it had (synchronized): cache.go's Current
	err           error
	changed       chan struct{} // closed at the next change (applied chunk, failure)
}

func newFeed(machine, thread string) *Feed {
	return &Feed{Machine: machine, ThreadID: thread, done: make(chan struct{}), changed: make(chan struct{})}
}

// run subscribes and applies the stream until ctx ends or the stream does;
// a stream lost with its socket is subscribed again on the next socket dial
// gives (the watcher reconnects with its own backoff; dial waits for it).
func (f *Feed) run(ctx context.Context, dial Dial) {
	defer close(f.done)
	var lost *effectrpc.Conn
	for {
		conn, err := dial(ctx)
		if err != nil {
			f.fail(err)
			return
		}
		if conn == lost {
			// The socket that dropped, not yet seen closed by dial: wait
			// for its end rather than subscribe on it again.
			select {
			case <-conn.Done():
				continue
			case <-ctx.Done():
				f.fail(ctx.Err())
				return
			}
		}
		// RequestCompletionMarker: T3 says when it has sent the snapshot or the
		// replay (synchronized); until then the feed is not live (Current).
		in := t3rpc.SubscribeThreadInput{ThreadId: f.ThreadID, AcceptBoundedSnapshot: t3rpc.NewOptBool(true), RequestCompletionMarker: t3rpc.NewOptBool(true)}
		if cursor, ok := f.resumeAt(); ok {
			in.AfterSequence = t3rpc.NewOptInt64(cursor)
		}
		// Acknowledged as read (a feed holds nothing durable): T3's next chunk — the one
		// that may settle the waited run — is not held behind this goroutine's turn on a core.
		// A small chunk is applied on the read loop itself (applyOnRead), so the waiter it
		// wakes is readied from there, without first waiting for this goroutine's turn.
		err = conn.StreamAheadOnRead(ctx, "orchestration.subscribeThread", &in, readAhead, f.applyOnRead, f.applyChunk)
		if ctx.Err() == nil && errors.Is(err, effectrpc.ErrClosed) {
			lost = conn
			continue
		}
		if err == nil {
			err = errEnded
		}
		f.fail(err)
		return
	}
}

// resumeAt is the sequence a new subscription resumes after: the newest
// applied, once a snapshot was (before one, a new subscription starts with
// its own snapshot).
func (f *Feed) resumeAt() (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live = false // a new subscription: live again once T3 has caught it up
	return f.cursor, f.p != nil
}

// fail records why the feed stopped (the first reason) and wakes its waiters.
func (f *Feed) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		f.broadcastLocked()
	}
}

func (f *Feed) broadcastLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// applyChunk applies one Chunk's items in order. An item that cannot be
// applied fails the stream (the feed is then failed): a projection with a
// hole in it must not answer for the thread.
func (f *Feed) applyChunk(values []jx.Raw) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.applyChunkLocked(values)
}

// applyOnRead applies a chunk on the socket's read loop (effectrpc.StreamAheadOnRead) when it
// is small (onReadMax) and the feed's lock is free at once; otherwise it leaves the chunk to
// the feed's goroutine (applyChunk). The read loop never waits here: a t3_thread or a waiter
// holding the lock, or a big snapshot, costs the chunk a hand-off, not every other frame of
// the machine a wait.
func (f *Feed) applyOnRead(values []jx.Raw) (taken bool, err error) {
	n := 0
	for _, v := range values {
		if n += len(v); n > onReadMax {
			return false, nil
		}
	}
	if !f.mu.TryLock() {
		return false, nil
	}
	defer f.mu.Unlock()
	return true, f.applyChunkLocked(values)
}

func (f *Feed) applyChunkLocked(values []jx.Raw) error {
	for _, v := range values {
		if err := f.applyLocked(v); err != nil {
			return fmt.Errorf("thread %s: %w", f.ThreadID, err)
		}
	}
	f.compactLocked() // cache.go: bounded however long the feed lives
	f.broadcastLocked()
	return nil
}

func (f *Feed) applyLocked(raw []byte) error {
	it, err := decodeItem(raw)
	if err != nil {
		return err
	}
	switch it.kind {
	case "snapshot":
		trimmed, runs, err := t3.TrimThreadSnapshot(raw, t3.Keep{Runs: keepRuns})
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		p, err := decodeSnapshotProjection(trimmed)
		if err != nil {
			return err
		}
		f.p, f.shared, f.runs, f.cursor = p, false, runs, it.seq
		f.newestOrdinal = 0
		for _, r := range p.Runs {
			f.newestOrdinal = max(f.newestOrdinal, r.Ordinal)
		}
		return nil
	case "event", "unknown-event":
		if f.p == nil || it.seq <= f.cursor {
			return nil // before the snapshot, or a replay overlap
		}
		if it.kind == "event" {
			if err := f.upsertLocked(it.typ, it.payload); err != nil {
				return fmt.Errorf("event %d (%s): %w", it.seq, it.typ, err)
			}
		}
		f.cursor = it.seq
	case "synchronized":
		f.live = true // cache.go: the snapshot or the replay is in
	}
	// Kinds this connector does not know: nothing to apply.
	return nil
}

// upsertLocked applies one event's record; the event types that carry no
// record the projection holds are skipped.
func (f *Feed) upsertLocked(typ string, payload jx.Raw) error {
	f.ownLocked()
	p := f.p
	switch {
	case typ == "run.created" || typ == "run.updated":
		var r t3api.Run
		if err := r.Decode(jx.DecodeBytes(payload)); err != nil {
			return err
		}
		if i := indexOf(p.Runs, r.ID, func(r *t3api.Run) string { return r.ID }); i >= 0 {
			p.Runs[i] = r
		} else if r.Ordinal > f.newestOrdinal {
			// A new run. One the snapshot had but trimmed away (an older
			// run) stays out, as it is out of a trimmed read.
			p.Runs = append(p.Runs, r)
			f.runs++
			f.newestOrdinal = r.Ordinal
		}
	case typ == "message.updated":
		return upsert(&p.Messages, payload, func(m *t3api.Message) string { return m.ID })
	case typ == "turn-item.updated":
		return upsert(&p.TurnItems, payload, func(it *t3api.TurnItem) string { return it.ID })
	case typ == "checkpoint.captured":
		return upsert(&p.Checkpoints, payload, func(c *t3api.Checkpoint) string { return c.ID })
	case typ == "runtime-request.updated":
		return upsert(&p.RuntimeRequests, payload, func(r *t3api.RuntimeRequest) string { return r.ID })
	case len(typ) > len("thread.") && typ[:len("thread.")] == "thread.":
		// Every thread.* event carries the whole AppThread.
		var th t3api.AppThread
		if err := th.Decode(jx.DecodeBytes(payload)); err != nil {
			return err
		}
		p.Thread = th
	}
	return nil
}

// decoder is what every generated record has.
type decoder interface{ Decode(d *jx.Decoder) error }

// upsert decodes one record into *list, replacing the one with its id.
func upsert[T any, PT interface {
	*T
	decoder
}](list *[]T, payload jx.Raw, id func(*T) string) error {
	var v T
	if err := PT(&v).Decode(jx.DecodeBytes(payload)); err != nil {
		return err
	}
	if i := indexOf(*list, id(&v), id); i >= 0 {
		(*list)[i] = v
		return nil
	}
	*list = append(*list, v)
	return nil
}

// indexOf finds a record by id, newest first (updates are mostly of recent
// records).
func indexOf[T any](list []T, want string, id func(*T) string) int {
	for i := len(list) - 1; i >= 0; i-- {
		if id(&list[i]) == want {
			return i
		}
	}
	return -1
}

// State is a feed's projection as of one moment.
type State struct {
	// Projection is the caller's to keep and read, never to change: the
	// feed shares it, and copies it before it changes it itself (so does a
	// feed seeded with a State, Pool.Linger: its giver reads it on, never
	// changes it). It holds the snapshot's newest runs and every run since.
	Projection *t3api.ThreadProjection
	// Runs is the thread's number of runs in all.
	Runs int
	// Cursor is the sequence of the newest item applied.
	Cursor int64
}

// Await waits until ready, called under the feed's lock with its projection
// each time the feed changes, says the projection can answer, and returns it;
// ok is false when the feed fails first or ctx ends. ready must not keep the
// projection it is given.
func (f *Feed) Await(ctx context.Context, ready func(*t3api.ThreadProjection) bool) (State, bool) {
	for {
		st, ok, changed := f.readyNow(ready)
		if ok {
			return st, true
		}
		if changed == nil {
			return State{}, false // the feed stopped
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return State{}, false
		}
	}
}

// Ready is Await without waiting: the feed's state when ready (called under
// the feed's lock, as in Await) says its projection can answer now; ok is
// false when it cannot yet or the feed has stopped. A wait woken by this feed
// takes its result here: the projection that woke it already shows the
// settle, so no goroutine or timer is needed to wait for it (tools.waitRead).
func (f *Feed) Ready(ready func(*t3api.ThreadProjection) bool) (State, bool) {
	st, ok, _ := f.readyNow(ready)
	return st, ok
}

// readyNow returns the feed's state when ready says it can answer (ok), else
// the channel closed at its next change; changed is nil once it has stopped.
func (f *Feed) readyNow(ready func(*t3api.ThreadProjection) bool) (st State, ok bool, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return State{}, false, nil
	}
	if f.p != nil && ready(f.p) {
		return f.stateLocked(), true, nil
	}
	return State{}, false, f.changed
}

// Look calls see with the feed's projection, under the feed's lock, when it
// has one (see must be quick and must not keep it), and returns the channel
// closed at the feed's next change and why the feed stopped (nil while it
// runs), taken at the same moment: a waiter that looks again when changed is
// closed misses no change (t3_wait's wake from the thread's own stream).
func (f *Feed) Look(see func(p *t3api.ThreadProjection)) (changed <-chan struct{}, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if f.p != nil {
		see(f.p)
	}
	return f.changed, nil
}

// Err says why the feed stopped; nil while it runs.
func (f *Feed) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// stateLocked hands the feed's projection out: the caller shares it until
// the feed's next change, which copies it first (ownLocked).
func (f *Feed) stateLocked() State {
	f.shared = true
	return State{Projection: f.p, Runs: f.runs, Cursor: f.cursor}
}

// ownLocked gives the feed a projection of its own before it changes it
// when a caller shares the one it has (shared).
func (f *Feed) ownLocked() {
	if f.shared && f.p != nil {
		f.p, f.shared = copyProjection(f.p), false
	}
}

// copyProjection copies the arrays a feed changes: upserts replace whole
// elements and never change one in place, so the elements' own slices and
// strings can be shared.
func copyProjection(p *t3api.ThreadProjection) *t3api.ThreadProjection {
	c := *p
	c.Runs = append([]t3api.Run(nil), p.Runs...)
	c.RuntimeRequests = append([]t3api.RuntimeRequest(nil), p.RuntimeRequests...)
	c.Messages = append([]t3api.Message(nil), p.Messages...)
	c.TurnItems = append([]t3api.TurnItem(nil), p.TurnItems...)
	c.Checkpoints = append([]t3api.Checkpoint(nil), p.Checkpoints...)
	return &c
}
