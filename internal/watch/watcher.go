// Package watch keeps one machine's shell state current: it subscribes to
// orchestration.subscribeShell over one WebSocket, applies every item after the
// highest sequence it has seen, accepts a fresh snapshot at any time, and on any
// socket loss reconnects with backoff and jitter and resumes from its cursor.
//
// The shape follows client-go's reflector: list (the stream's first snapshot),
// then watch from a version (afterSequence), and relist whenever T3 decides the
// gap is too large (it sends a snapshot item instead of the replay).
//
// Thread state has one owner, the Watcher. Waiters call ThreadAndWait(threadID),
// the row and a channel closed at its next change, read atomically;
// the event detector is the Sink, called synchronously with every chunk before
// the chunk is acknowledged, so what it derives is durable before T3 moves on.
package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// Connect opens a new RPC socket to the machine (handshake, fresh ticket, dial).
type Connect func(ctx context.Context) (*effectrpc.Conn, error)

// Change is what one chunk did to the machine's threads, handed to the Sink.
type Change struct {
	Machine string
	// Snapshot is true when the chunk replaced the whole state (first
	// subscription, or T3's snapshot fallback after a reconnect).
	Snapshot bool
	// Threads holds the new state of every thread the chunk touched (all of
	// them after a snapshot), in the order the items arrived.
	//
	// The rows of Threads and Passed are lent, not given: they are the chunk's decoded items,
	// valid only until Sink.Apply returns (the items then serve a later chunk). A sink that keeps
	// a row past Apply must copy it (its strings need no copy: they are the sink's to keep). A
	// copy of every row into the change was most of a lagging chunk's allocation (a ThreadShell
	// is most of a kilobyte) and a visible part of every chunk's (BenchmarkApplyChunkSteady).
	Threads []*t3rpc.ThreadShell
	// Passed holds, in arrival order, the rows of threads that the chunk
	// updated again later (their final row is in Threads): a run that started
	// and ended inside one chunk shows only here. Empty after a snapshot.
	Passed []*t3rpc.ThreadShell
	// Removed lists threads the chunk removed.
	Removed []string
	// Cursor is the highest sequence applied once this change is in.
	Cursor int64
}

// RowsOf is rows as a change's rows (Change.Threads): pointers to its elements.
func RowsOf(rows []t3rpc.ThreadShell) []*t3rpc.ThreadShell {
	out := make([]*t3rpc.ThreadShell, len(rows))
	for i := range rows {
		out[i] = &rows[i]
	}
	return out
}

// Sink receives every applied change before the chunk that caused it is
// acknowledged. An error is retried on the same change (the chunk stays
// unacknowledged, so T3 holds the stream), see Watcher.applyToSink.
type Sink interface {
	Apply(ctx context.Context, c Change) error
}

// QuickSink is a Sink that can take a change at once when that needs nothing that may wait:
// nothing to make durable, no store to read, no lock another holds for long. The watcher offers it
// every change first, on the socket's read loop (effectrpc.StreamInline): a chunk it takes is
// acknowledged right there, without a hand-off to the watcher's goroutine. Most of a busy
// machine's chunks are a run's steps, which change nothing durable (the detector's
// nothingToCommit).
type QuickSink interface {
	Sink
	// ApplyQuick applies c if it can without blocking and reports whether it did. Reporting false
	// it may have applied part of c (a fan-out's first sinks): Apply then follows with the same
	// change on the watcher's goroutine, and every sink takes a change it has seen as it takes a
	// retried one (applyToSink). It must not block: it holds up the machine's socket.
	ApplyQuick(c Change) bool
}

// Options tune a Watcher. Zero values pick the defaults.
type Options struct {
	Logger *slog.Logger
	// Backoff bounds for reconnects: each delay is within ±50 % of an interval
	// that doubles from MinBackoff up to MaxBackoff (reconnectBackOff).
	MinBackoff time.Duration // default 250ms
	MaxBackoff time.Duration // default 30s
	// Sink is optional.
	Sink Sink
	// OnItemsApplied, when set, is called after each chunk is applied (load
	// harness and metrics hook). It must not block.
	OnItemsApplied func(n int, cursor int64)
	// Metrics, when set, times every chunk (shared by the fleet's watchers).
	Metrics *Metrics
}

// Status is the machine's connection state as the watcher sees it.
type Status struct {
	Online bool
	// Synced: this session's snapshot or replay has been applied (reset when
	// the socket drops, set again by the next "synchronized" item).
	Synced      bool
	Cursor      int64
	LastError   error
	ConnectedAt time.Time
	Reconnects  int
}

// Watcher tracks one machine.
type Watcher struct {
	name    string
	connect Connect
	opts    Options
	log     *slog.Logger

	mu       sync.RWMutex
	threads  *rowTable // compact rows without pointers, see row and rowTable
	projects map[string]t3rpc.Project
	waiters  map[string]chan struct{} // per thread, closed on its next change
	// gone remembers why threads left the list ("archive" or "removed"), so a
	// wait on one ends with that reason instead of waiting for a row that
	// will not come back. Bounded: the oldest entries are forgotten.
	gone     *goneSet
	anyWait  chan struct{} // closed on any change (status, snapshot)
	status   Status
	conn     *effectrpc.Conn
	connWait chan struct{} // closed when a conn becomes available

	// strs serves the decoding of the chunks' rows (recentStrings): only the chunk being applied
	// uses it (startChunk), not under mu.
	strs recentStrings
}

// New makes a watcher; call Run to start it.
func New(name string, connect Connect, opts Options) *Watcher {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = 250 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	return &Watcher{
		name:     name,
		connect:  connect,
		opts:     opts,
		log:      opts.Logger.With("machine", name),
		threads:  newRowTable(),
		projects: map[string]t3rpc.Project{},
		waiters:  map[string]chan struct{}{},
		gone:     newGoneSet(goneLimit),
		anyWait:  make(chan struct{}),
		connWait: make(chan struct{}),
	}
}

// Name is the machine's configured name.
func (w *Watcher) Name() string { return w.name }

// Run connects, subscribes and reconnects until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	bo := w.reconnectBackOff()
	wasUp := false
	lastReason := "" // the failure last logged at warn, so a retry loop says it once
	logRetry := func(err error, d time.Duration) {
		switch reason := fmt.Sprint(err); {
		case wasUp:
			w.log.Warn("machine link lost; reconnecting", "err", err, "in", d.Round(time.Millisecond))
			lastReason = ""
		case reason != lastReason:
			// Never up (or down again for another reason): say why it cannot connect.
			w.log.Warn("machine cannot connect; retrying", "err", err, "in", d.Round(time.Millisecond))
			lastReason = reason
		default:
			w.log.Debug("machine cannot connect; retrying", "err", err, "in", d.Round(time.Millisecond))
		}
	}
	// A session always ends in an error (the socket or the stream ended); Retry waits out the
	// backoff before the next one and returns only when ctx ends.
	_, _ = backoff.Retry(ctx, func() (struct{}, error) {
		synced, err := w.session(ctx)
		if ctx.Err() != nil {
			return struct{}{}, backoff.Permanent(ctx.Err())
		}
		if synced {
			bo.Reset() // the link worked: start the backoff over
		}
		wasUp = w.Status().Online
		w.setOffline(err)
		return struct{}{}, err
	}, backoff.WithBackOff(bo), backoff.WithMaxElapsedTime(0), backoff.WithNotify(logRetry))
	w.setOffline(ctx.Err())
}

// reconnectBackOff: each delay is within ±50 % of an interval that doubles from MinBackoff up
// to MaxBackoff, so machines that lost their links together do not reconnect in lockstep.
func (w *Watcher) reconnectBackOff() *backoff.ExponentialBackOff {
	return &backoff.ExponentialBackOff{
		InitialInterval:     w.opts.MinBackoff,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         max(w.opts.MaxBackoff, w.opts.MinBackoff),
	}
}

// session runs one socket: connect, subscribe from the cursor, apply until the
// socket or stream ends. It reports whether the stream got as far as synced.
func (w *Watcher) session(ctx context.Context) (bool, error) {
	conn, err := w.connect(ctx)
	if err != nil {
		return false, err
	}
	defer conn.Close()

	w.mu.Lock()
	cursor := w.status.Cursor
	hasState := w.status.Synced || cursor > 0
	w.mu.Unlock()

	in := t3rpc.SubscribeShellInput{RequestCompletionMarker: t3rpc.NewOptBool(true)}
	if hasState {
		in.AfterSequence = t3rpc.NewOptInt64(cursor)
	}
	// Without state T3 answers with a snapshot: subscribe under the process's snapshot gate, so
	// that only a few machines' snapshots are in memory at once (see gate).
	w.setOnline(conn)
	gp := &pass{g: snapshots}
	defer gp.release()
	if !hasState {
		if err := gp.hold(ctx); err != nil {
			return false, err
		}
	}
	// The chunks are applied on the socket's read loop, and those that change nothing durable are
	// acknowledged there (startChunk); the rest of a chunk that must wait — for the sink's
	// commit, for a place in the snapshot gate — runs on this goroutine, and its Ack follows.
	var synced atomic.Bool
	err = conn.StreamInline(ctx, "orchestration.subscribeShell", &in, func(ch effectrpc.Chunk) func() error {
		if gp.holding() || hasSnapshot(ch.Values) {
			// The gate may make the chunk wait for a place: all of it here.
			return func() error {
				return gp.chunk(ctx, ch.Values, func() error {
					s, err := w.applyChunk(ctx, ch)
					if s {
						synced.Store(true)
					}
					return err
				})
			}
		}
		s, rest := w.startChunk(ctx, ch)
		if s {
			synced.Store(true)
		}
		return rest
	})
	if err == nil {
		err = errors.New("T3 ended the shell subscription")
	}
	return synced.Load(), err
}

// applyChunk decodes and applies one chunk, then hands the change to the sink, and returns once
// the sink has it (durable, for the detector). It returns true once the stream reported
// synchronized.
func (w *Watcher) applyChunk(ctx context.Context, ch effectrpc.Chunk) (bool, error) {
	synced, rest := w.startChunk(ctx, ch)
	if rest != nil {
		return synced, rest()
	}
	return synced, nil
}

// startChunk decodes and applies one chunk and offers the change to the sink when it is a
// QuickSink. It returns nil when that was all (the chunk may be acknowledged), or the rest: the
// sink's Apply, retried until it works (applyToSink), or the decoding's error. It never blocks
// but for the watcher's own lock (held briefly), so the socket's read loop runs it. It reports
// true once the stream reported synchronized.
func (w *Watcher) startChunk(ctx context.Context, ch effectrpc.Chunk) (bool, func() error) {
	m := w.opts.Metrics
	m.started(ch.Read, len(ch.Values))
	pooled, err := decodeItems(ch.Values, &w.strs)
	if err != nil {
		return false, func() error { return err }
	}
	items := *pooled
	// The change lends the sink the decoded rows (Change.Threads): the items go back to the pool
	// once the sink is done with them, here or at the end of the rest.

	w.mu.Lock()
	change := Change{Machine: w.name, Threads: make([]*t3rpc.ThreadShell, 0, len(items))}
	touched := map[string]int{} // thread id → index in change.Threads
	syncedNow := false
	for i := range items {
		it := &items[i]
		switch it.Kind {
		case "snapshot":
			snap, ok := it.Snapshot.Get()
			if !ok {
				continue
			}
			w.replaceLocked(&snap)
			change = Change{Machine: w.name, Snapshot: true, Threads: make([]*t3rpc.ThreadShell, 0, len(snap.Threads))}
			touched = map[string]int{}
			for i := range snap.Threads {
				t := &snap.Threads[i]
				touched[t.ID] = len(change.Threads)
				change.Threads = append(change.Threads, t)
			}
			continue
		case "synchronized":
			if !w.status.Synced {
				w.status.Synced = true
			}
			syncedNow = true
			continue
		}
		seq, hasSeq := it.Sequence.Get()
		if hasSeq && seq <= w.status.Cursor {
			continue // replay overlap: already applied
		}
		w.applyItemLocked(it, &change, touched)
		if hasSeq && seq > w.status.Cursor {
			w.status.Cursor = seq
		}
	}
	change.Cursor = w.status.Cursor
	if syncedNow || change.Snapshot {
		w.broadcastLocked()
	}
	w.mu.Unlock()

	m.applied(ch.Read)
	if w.opts.OnItemsApplied != nil {
		w.opts.OnItemsApplied(len(items), change.Cursor)
	}
	if w.opts.Sink != nil && (len(change.Threads) > 0 || len(change.Removed) > 0 || change.Snapshot) {
		if qs, ok := w.opts.Sink.(QuickSink); !ok || !qs.ApplyQuick(change) {
			return syncedNow, func() error {
				defer putItems(pooled)
				if err := w.applyToSink(ctx, change); err != nil {
					return err
				}
				m.durable(ch.Read)
				return nil
			}
		}
	}
	putItems(pooled)
	m.durable(ch.Read)
	return syncedNow, nil
}

// decodeItems decodes a chunk's items in place: a ShellStreamItem is large, and copying each one
// into the slice (and each row into the change, grown one append at a time) was a third of
// applyChunk's CPU under load.
//
// The slice comes from a pool shared by the process's watchers (putItems gives it back): an item
// is a kilobyte, and a fresh slice per chunk was a large allocation for every busy chunk (a
// lagging machine's chunk of 1,024 items is a megabyte). The pool keeps nothing across garbage
// collections, so an idle connector holds none of it. It is the pool's pointer that is returned
// and given back, not a new one per chunk (the pointer was a chunk's last allocation but one).
func decodeItems(values []jx.Raw, rs *recentStrings) (*[]t3rpc.ShellStreamItem, error) {
	p, _ := itemPool.Get().(*[]t3rpc.ShellStreamItem)
	if p == nil {
		p = new([]t3rpc.ShellStreamItem)
	}
	if cap(*p) >= len(values) {
		*p = (*p)[:len(values)]
	} else {
		*p = make([]t3rpc.ShellStreamItem, len(values))
		writeFirst(*p)
	}
	items := *p
	// The decoder lets go of the last item: an idle watcher would otherwise keep its last frame
	// (a start-up snapshot of a megabyte) from the collector.
	defer rs.letGo()
	for i, v := range values {
		if err := decodeItem(&items[i], v, rs); err != nil {
			// A malformed item cannot be applied, and skipping it could lose a
			// transition: fail the stream so the reconnect replays it (or T3
			// sends a snapshot), and say what was wrong.
			putItems(p)
			return nil, fmt.Errorf("decode shell item: %w", err)
		}
	}
	return p, nil
}

// writeFirst writes every item's Sequence (a field without pointers: no write barrier) of a new
// slice before anything reads it. A new slice of more than 32 KiB (a chunk of 32 items or more) is
// memory the kernel may not have mapped yet (start-up returns its free memory to the OS, and
// internal/memreturn does after a busy spell), and decodeItem reads some fields before it writes
// them (a repeated key's check): that read maps the shared zero page, so the write after it faults
// a second time to give the page its own copy, and that fault flushes the page from the TLB of
// every CPU the process runs on (an interrupt to each; dear on a paravirtualised guest). Written
// first, a page faults once. A lagging machine's chunks are hundreds of items: in the first
// seconds of a burst after start-up these faults were most of the connector's page-fault time, and
// the burst lagged for seconds (docs/benchmarks.md, "A burst right after start-up"). An item is
// 1,056 bytes, so every page of the slice but perhaps its last holds some item's Sequence.
func writeFirst(items []t3rpc.ShellStreamItem) {
	for i := range items {
		items[i].Sequence = t3rpc.OptInt64{}
	}
}

// itemPool holds decoded-item slices of at most maxPooledItems (larger ones, a snapshot's, are
// left to the collector).
var itemPool sync.Pool

const maxPooledItems = 4096

func putItems(p *[]t3rpc.ShellStreamItem) {
	items := *p
	if cap(items) > maxPooledItems {
		return
	}
	// Only what was decoded: past len the slice is zero already (every put clears what its chunk
	// used), and clearing the whole capacity cost a lagging chunk's megabyte for every chunk of a
	// few items that got its slice from the pool (BenchmarkApplyChunkSteady).
	clear(items) // nothing decoded stays reachable, and Decode starts from zero
	*p = items[:0]
	itemPool.Put(p)
}

// applyItemLocked applies one sequenced item (a thread or project updated or removed) to the
// machine's state and records what it changed in change (touched: thread id → index in
// change.Threads).
func (w *Watcher) applyItemLocked(it *t3rpc.ShellStreamItem, change *Change, touched map[string]int) {
	switch it.Kind {
	case "thread.updated":
		// The row is used where it was decoded, and lent to the sink from there (Change.Threads):
		// a ThreadShell is most of a kilobyte, and a copy of it per item was a visible part of
		// applyChunk.
		if it.Thread.Set {
			t := &it.Thread.Value
			if loc, _ := it.Location.Get(); loc == "archive" {
				w.removeLocked(t.ID, &GoneThread{Where: "archive", ProjectID: t.ProjectId, Title: t.Title}, change, touched)
			} else {
				w.gone.drop(t.ID) // unarchived, or a thread id seen again
				w.putLocked(t, it.Sequence.Or(w.status.Cursor))
				w.touchLocked(t.ID)
				if idx, ok := touched[t.ID]; ok {
					if change.Passed == nil {
						// Sized for the chunk (cap(Threads) is its item count): a lagging
						// machine's chunk passes most of its rows.
						change.Passed = make([]*t3rpc.ThreadShell, 0, cap(change.Threads))
					}
					change.Passed = append(change.Passed, change.Threads[idx])
					change.Threads[idx] = t
				} else {
					touched[t.ID] = len(change.Threads)
					change.Threads = append(change.Threads, t)
				}
			}
		}
	case "thread.removed":
		if id, ok := it.ThreadId.Get(); ok {
			gone := &GoneThread{Where: "removed"}
			if loc, _ := it.Location.Get(); loc != "" && loc != "active" {
				// Leaving another list (the archive) is not a deletion.
				gone = nil
			}
			w.removeLocked(id, gone, change, touched)
		}
	case "project.updated":
		if p, ok := it.Project.Get(); ok {
			w.projects[p.ID] = p
		}
	case "project.removed":
		if id, ok := it.ProjectId.Get(); ok {
			delete(w.projects, id)
		}
	default:
		// An item kind this connector does not know: skip it, but its
		// sequence still advances the cursor (below), as T3 expects.
	}
}

// applyToSink retries a failing sink (a full disk, say) while the chunk stays
// unacknowledged: T3 holds the stream, nothing is lost, and the error is visible
// in the status. It gives up only when ctx ends.
func (w *Watcher) applyToSink(ctx context.Context, c Change) error {
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		err := w.opts.Sink.Apply(ctx, c)
		if err != nil {
			w.log.Error("could not record thread changes; holding the stream until it works", "err", err)
			w.mu.Lock()
			w.status.LastError = fmt.Errorf("recording thread changes: %w", err)
			w.mu.Unlock()
		}
		return struct{}{}, err
	}, backoff.WithBackOff(sinkBackOff()), backoff.WithMaxElapsedTime(0))
	return err
}

// sinkBackOff retries a failing sink after 100 ms, doubling up to 5 s (±50 %).
func sinkBackOff() backoff.BackOff {
	return &backoff.ExponentialBackOff{InitialInterval: 100 * time.Millisecond, RandomizationFactor: 0.5, Multiplier: 2, MaxInterval: 5 * time.Second}
}

func (w *Watcher) replaceLocked(snap *t3rpc.ShellSnapshot) {
	// Threads archived while the socket was down, or before this connector
	// ever connected, are in the snapshot's archived list only: remember them
	// all, as live archive items would be, so that a wait on one says
	// archived instead of "not found".
	for i := range snap.ArchivedThreads {
		t := &snap.ArchivedThreads[i]
		w.removeLocked(t.ID, &GoneThread{Where: "archive", ProjectID: t.ProjectId, Title: t.Title}, &Change{}, map[string]int{})
	}
	w.threads.resetFor(snap.Threads)
	for i := range snap.Threads {
		w.gone.drop(snap.Threads[i].ID)
		w.putLocked(&snap.Threads[i], snap.SnapshotSequence)
	}
	w.projects = make(map[string]t3rpc.Project, len(snap.Projects))
	for _, p := range snap.Projects {
		w.projects[p.ID] = p
	}
	// A snapshot resets the cursor to its own sequence, even when that is lower
	// than ours (a replaced database): later items are compared against it.
	w.status.Cursor = snap.SnapshotSequence
	for id, ch := range w.waiters {
		close(ch)
		delete(w.waiters, id)
	}
}

// putLocked stores t's compact row, brought by the item of sequence seq,
// reusing the thread's previous one.
func (w *Watcher) putLocked(t *t3rpc.ThreadShell, seq int64) {
	w.threads.put(t, seq)
}

// removeLocked takes a thread off the list; gone, when not nil, is what to
// remember of it (also of a thread the list did not hold: one archived before
// the watcher saw it).
func (w *Watcher) removeLocked(id string, gone *GoneThread, change *Change, touched map[string]int) {
	projectID, title, listed := w.threads.remove(id)
	if gone != nil {
		if listed && gone.ProjectID == "" {
			gone.ProjectID, gone.Title = projectID, title
		}
		w.gone.add(id, *gone)
	}
	if !listed {
		return
	}
	w.touchLocked(id)
	if idx, ok := touched[id]; ok {
		change.Threads = append(change.Threads[:idx], change.Threads[idx+1:]...)
		delete(touched, id)
		for k, v := range touched {
			if v > idx {
				touched[k] = v - 1
			}
		}
	}
	change.Removed = append(change.Removed, id)
}

func (w *Watcher) touchLocked(id string) {
	if ch, ok := w.waiters[id]; ok {
		close(ch)
		delete(w.waiters, id)
	}
}

func (w *Watcher) broadcastLocked() {
	close(w.anyWait)
	w.anyWait = make(chan struct{})
}

func (w *Watcher) setOnline(conn *effectrpc.Conn) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.conn = conn
	w.status.Online = true
	w.status.LastError = nil
	w.status.ConnectedAt = time.Now()
	close(w.connWait)
	w.broadcastLocked()
}

func (w *Watcher) setOffline(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.conn != nil {
		w.status.Reconnects++
	}
	w.conn = nil
	w.status.Online = false
	// Synced again only once the next session's replay or snapshot is in:
	// until then the rows may be stale, and the machine must not be reported
	// online (fleet.Machine.Info) as if they were current.
	w.status.Synced = false
	if err != nil {
		w.status.LastError = err
	}
	select {
	case <-w.connWait:
		w.connWait = make(chan struct{})
	default:
	}
	// Waiters re-check: a thread's state may be stale while offline.
	for id, ch := range w.waiters {
		close(ch)
		delete(w.waiters, id)
	}
	w.broadcastLocked()
}

// Status reports the link state.
func (w *Watcher) Status() Status {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.status
}

// Thread returns the latest shell row of a thread, without latestVisibleMessage (see row).
func (w *Watcher) Thread(id string) (t3rpc.ThreadShell, bool) {
	t, _, ok := w.ThreadAt(id)
	return t, ok
}

// ThreadAt is Thread with the sequence of the item that brought the row (a
// shell snapshot's snapshotSequence, else the sequence of the thread's newest
// event as T3 numbered the row): a thread subscription (threadfeed) whose
// cursor has reached it is not behind the row.
func (w *Watcher) ThreadAt(id string) (t3rpc.ThreadShell, int64, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	s, ok := w.threads.slot(id)
	if !ok {
		return t3rpc.ThreadShell{}, 0, false
	}
	return w.threads.shell(s), w.threads.rows[s].seq, true
}

// Gone reports why a thread that is not in the list left it: "archive" when it
// was archived, "removed" when it was deleted; ok is false when the watcher did
// not see it leave (or has forgotten: it keeps the newest 10,000).
func (w *Watcher) Gone(id string) (where string, ok bool) {
	g, ok := w.GoneThread(id)
	return g.Where, ok
}

// GoneThread is Gone with what the watcher remembers of the thread.
func (w *Watcher) GoneThread(id string) (GoneThread, bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if _, listed := w.threads.slot(id); listed {
		return GoneThread{}, false
	}
	return w.gone.get(id)
}

// ThreadAndWait returns the thread's row and a channel closed at its next
// change, read atomically so no change can slip between the two.
func (w *Watcher) ThreadAndWait(id string) (t3rpc.ThreadShell, bool, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ch, ok := w.waiters[id]
	if !ok {
		ch = make(chan struct{})
		w.waiters[id] = ch
	}
	s, found := w.threads.slot(id)
	if !found {
		return t3rpc.ThreadShell{}, false, ch
	}
	return w.threads.shell(s), true, ch
}

// Threads returns every active thread row (without latestVisibleMessage), sorted by id.
func (w *Watcher) Threads() []t3rpc.ThreadShell {
	w.mu.RLock()
	out := make([]t3rpc.ThreadShell, 0, w.threads.len())
	w.threads.each(func(s uint32) { out = append(out, w.threads.shell(s)) })
	w.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Projects returns every project, sorted by title then id.
func (w *Watcher) Projects() []t3rpc.Project {
	w.mu.RLock()
	out := make([]t3rpc.Project, 0, len(w.projects))
	for _, p := range w.projects {
		out = append(out, p)
	}
	w.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Title != out[j].Title {
			return out[i].Title < out[j].Title
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Changed returns a channel closed at the next change of any kind (a snapshot,
// the link going up or down).
func (w *Watcher) Changed() <-chan struct{} {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.anyWait
}

// Conn returns the live socket, waiting for one until ctx ends. Commands share
// the watcher's socket: one socket per machine.
func (w *Watcher) Conn(ctx context.Context) (*effectrpc.Conn, error) {
	for {
		w.mu.RLock()
		conn, wait, lastErr := w.conn, w.connWait, w.status.LastError
		w.mu.RUnlock()
		if conn != nil {
			select {
			case <-conn.Done():
				// Closing: the session ends soon and setOffline broadcasts.
				wait = nil
			default:
				return conn, nil
			}
		}
		select {
		case <-ctx.Done():
			if lastErr != nil {
				return nil, fmt.Errorf("machine %q is offline: %w", w.name, lastErr)
			}
			return nil, fmt.Errorf("machine %q is offline: %w", w.name, ctx.Err())
		case <-wait:
		case <-w.Changed():
		}
	}
}
