// Package events turns the run transitions of watched threads into event
// records, exactly once: a run reaching completed, interrupted or failed, and a
// new pending question. The detector is the watcher's Sink: it sees every
// applied chunk before T3 gets the Ack, and commits its last-seen state and the
// events that chunk produced in one fsynced transaction (grouped with the other
// machines' chunks, store.Group), so neither a reconnect replay, a snapshot
// fallback nor a crash can lose or repeat a transition.
//
// Nothing on that path reads T3. A chunk commits what the shell rows say: the
// event's identity and facts, complete when the row shows a completed run's
// reply (rowReply), else enriched from T3 before delivery (see Enricher),
// and, where the rows cannot say how a run ended (a run passed over by a
// queued one, a reconnect's snapshot that skipped runs or questions, a server
// that reports "idle"), a durable note that the thread needs a look-up. The
// look-ups run beside the watchers (lookup.go), each thread on its own backoff:
// one unreadable thread never holds its machine's stream.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// Transition is one detected transition.
type Transition struct {
	ID       string              // stable: the same transition always gets the same id
	Outcome  threadstate.Outcome // the event type is made from it (eventType)
	Machine  string
	ThreadID string
	RunID    string
	// RunStatus is the run's own status in T3 when it settled (cancelled,
	// rolled_back, …): Outcome is derived from it (threadstate.Settled).
	RunStatus string
	RequestID string // for questions
	Kind      string // runtime request kind for questions
	ProjectID string
	Title     string
	// Branch and Worktree are the thread's git workspace as T3 showed it
	// (a worktree thread's own; empty for the project root).
	Branch, Worktree string
	// Reply is the run's final reply when the row proved it (rowReply): the
	// body is then complete without a read of the thread. Empty otherwise.
	Reply   string
	Tracked store.Thread
	At      time.Time
}

// Tracked tells which threads are watched.
type Tracked interface {
	GetThread(id string) (store.Thread, bool, error)
	// GetThreads reads many at once (one read per chunk, whatever its size);
	// ids not tracked are absent from the map.
	GetThreads(ids []string) (map[string]store.Thread, error)
	ListThreads() ([]store.Thread, error)
}

// Committer makes detector state and events durable together.
type Committer interface {
	Commit(b store.Batch) error
	Detector(key string) ([]byte, bool, error)
	ForEachDetector(fn func(key string, value []byte) error) error
}

// seen is the detector's last-seen state of one thread, persisted per thread.
// It holds only what the detector needs: run and request ids, flags, and the
// row's updatedAt.
type seen struct {
	// Latest is the newest run seen (the row's latestRunId); Settled says its
	// end was reported (or it had ended when the watch began).
	Latest  string `json:"run,omitempty"`
	Settled bool   `json:"settled,omitempty"`
	// Active is the row's activeRunId as last seen.
	Active string `json:"active,omitempty"`
	// Open lists older runs seen but not reported settled, oldest first: a
	// run still running or checkpointing while a queued one is the latest.
	Open []string `json:"open,omitempty"`
	// Question is the last pending request seen; Asked every request reported
	// for runs not yet settled (so a look-up never reports one twice).
	Question string   `json:"question,omitempty"`
	Asked    []string `json:"asked,omitempty"`
	// Lookup: the rows cannot tell what happened; read the thread (off the
	// Ack path) before reporting more of its runs. Gap: runs after GapAfter
	// ("" for the thread's first) may have come and gone unseen.
	Lookup   bool   `json:"lookup,omitempty"`
	Gap      bool   `json:"gap,omitempty"`
	GapAfter string `json:"gapAfter,omitempty"`
	// Gen changes whenever what a look-up must resolve changes, so a look-up
	// that read the thread before the change does not clear the note.
	Gen uint64 `json:"gen,omitempty"`
	// UpdatedAt is the row's updatedAt: after a snapshot, a changed row of a
	// thread with a run underway may hide a question asked and answered.
	UpdatedAt string `json:"updatedAt,omitempty"`
}

func (s seen) equal(o seen) bool {
	return s.equalButUpdatedAt(o) && s.UpdatedAt == o.UpdatedAt
}

// equalButUpdatedAt compares everything but UpdatedAt: what must be durable before a chunk's Ack.
//
// UpdatedAt changes with every row of a thread (every step of a run), while the rest changes a few
// times per run (its start, its end, a question). It is written with the rest, not on its own: a
// stored UpdatedAt is therefore that of the row seen at the thread's last other change, never
// newer than the row seen last. It is read only to judge a snapshot (observe: a busy thread whose
// row changed while we were not looking gets a look-up), and T3's updatedAt only grows, so an
// older stored value makes that judgement look up whenever the newest would have, and at most
// once more: after a restart, a thread that was busy then. Committing it on its own was most of
// the detector's writes, and every one is a chunk waiting for the group commit before its Ack
// (BenchmarkChunkDurableSteady). In memory (the cache) it is always the newest.
func (s seen) equalButUpdatedAt(o seen) bool {
	return s.Latest == o.Latest && s.Settled == o.Settled && s.Active == o.Active && slices.Equal(s.Open, o.Open) &&
		s.Question == o.Question && slices.Equal(s.Asked, o.Asked) && s.Lookup == o.Lookup && s.Gap == o.Gap &&
		s.GapAfter == o.GapAfter && s.Gen == o.Gen
}

// sameDurable reports whether the move from prev (the state in memory) to s changes nothing that
// must be durable before a chunk's Ack (one process; replicas: equalButUpdatedAt). Besides
// UpdatedAt (see equalButUpdatedAt) that leaves out two things every run changes and a restart
// learns again from its snapshot:
//
//   - Active, the row's activeRunId: every judgement takes it from the row at hand (observe); only
//     a look-up reads the stored one, to decide whether to read again, and a look-up follows the
//     snapshot's judgement of the same row after a restart;
//   - a new latest run that has not ended (its start, Latest with Settled false), while nothing
//     else changes (Open the same: the previous latest was reported). A restart then finds the
//     older latest run, reported, in the store, and the snapshot's newer one: observe notes the gap
//     and its look-up reads the thread and reports whatever ended meanwhile, exactly as for a
//     run that started and ended while the connector was down. Before this, a busy thread at the
//     restart got a look-up as well (its row's updatedAt had moved), so there are no more of them.
//
// Everything an event says (a settled run, a question asked), the runs followed (Open), the
// look-up's note (Lookup, Gap, Gen) is committed before the Ack as before, with the newest
// Latest, Active and UpdatedAt beside it. A default run's rows change the detector's state at
// its start, when its turn ends (activeRunId cleared) and at its end: two of those three commits
// are gone, and the chunks that carried them are acknowledged without waiting for the group
// commit.
func (s seen) sameDurable(prev seen) bool {
	latest := s.Latest == prev.Latest && s.Settled == prev.Settled || s.Latest != prev.Latest && !s.Settled
	return latest && slices.Equal(s.Open, prev.Open) && s.Question == prev.Question && slices.Equal(s.Asked, prev.Asked) &&
		s.Lookup == prev.Lookup && s.Gap == prev.Gap && s.GapAfter == prev.GapAfter && s.Gen == prev.Gen
}

// mustCommit reports whether cur, following prev, must be durable before the chunk's Ack.
// Replicas (Options.Lease) commit every change but UpdatedAt: a new holder judges its rows against
// the stored state at every hand-over, not only after a crash, and an older stored state would
// cost a look-up read per busy thread at each.
func (d *Detector) mustCommit(prev, cur seen) bool {
	if d.lease != nil {
		return !cur.equalButUpdatedAt(prev)
	}
	return !cur.sameDurable(prev)
}

// busy reports whether a run of the thread was underway when last seen.
func (s seen) busy() bool { return (s.Latest != "" && !s.Settled) || len(s.Open) > 0 }

// Detector is a watch.Sink.
type Detector struct {
	store     Committer
	tracked   Tracked
	read      Reader
	notify    func()
	prefetch  func(store.Event) // nil: none
	m         *Metrics          // nil: none
	log       *slog.Logger
	now       func() time.Time
	retention time.Duration
	pruneIntv time.Duration
	lookups   *lookups

	// lease and rows: replica mode (see Options.Lease); tenure is the lease token each
	// machine's state was last caught up under.
	lease  func(machine string) (token int64, held bool)
	rows   func(machine string) []t3rpc.ThreadShell
	claim  func(machine string) (token int64, release func(), ok bool)
	tenure map[string]int64 // guarded by mu

	// tracking: Track holds it shared, Prune exclusively, so a prune decides on
	// tracked threads no Track can change meanwhile, whatever machine it names
	// (a machine's lock may not exist yet when the prune starts). Taken before
	// any machine lock.
	tracking sync.RWMutex

	mu sync.Mutex // guards tenure (replica mode); no chunk takes it in one process

	// cache: every watched thread's cached state, a few objects without pointers per machine,
	// each machine's states under that machine's lock (seenCache).
	cache *seenCache
	// locks: machine name → *sync.Mutex, per machine: Apply, Track and look-up commits. Neither
	// the locks nor the cache are under a lock all machines share: every machine's read loop
	// takes both for every chunk (ApplyQuick), and behind such a lock they all queued whenever
	// its holder's thread was off the CPU ("One lock for every machine's chunks" in
	// docs/benchmarks.md).
	locks sync.Map

	hooks testHooks
}

// cached is a thread's seen state as this process last committed or read it, with the UpdatedAt
// of the tracked row it went with (replica mode: see load). Its seen.UpdatedAt may be newer than
// the stored one (seen.equalButUpdatedAt), and in one process also its Active and a started run's
// Latest (seen.sameDurable); every other field is as committed.
type cached struct {
	s     seen
	rowAt time.Time
}

// testHooks are seams for tests to interleave calls; nil outside tests.
type testHooks struct {
	pruneListed func()               // Prune: candidates found, no lock taken yet
	pruneLocked func()               // Prune: candidates decided under the locks, before the commit
	trackWaits  func()               // Track: the tracking lock is held elsewhere; Track waits for it
	quickJudged func(machine string) // nothingToCommit: a row judged, the states not yet put
}

// Options for a Detector.
type Options struct {
	Store   Committer
	Tracked Tracked
	// Read reads a thread for look-ups (runs the rows cannot judge, runs and
	// questions a snapshot skipped). Without it look-ups stay pending.
	Read Reader
	// Notify is called after events were committed (wakes the outbox).
	Notify func()
	// Prefetch, when set, is handed every event committed with only its facts (store.Event.Enrich)
	// before its chunk's commit is queued: Enricher.Prefetch starts the read that completes it, so
	// that the read runs beside the commit. It must not block (it is on the Ack path).
	Prefetch func(store.Event)
	// Metrics, when set, times each event from T3 to durable.
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
	// Retention: tracked threads nobody watches are forgotten this long after
	// their last update (default DefaultRetention); see Prune.
	Retention time.Duration
	// PruneEvery is how often Run prunes (default DefaultPruneEvery).
	PruneEvery time.Duration
	// Lookup tunes the look-ups; zero values pick the defaults.
	Lookup LookupOptions
	// Lease, when set, puts the detector in replica mode (several replicas sharing PostgreSQL,
	// internal/lease): it says whether this replica holds a machine's lease now and its fencing
	// token. Only the holder detects and prunes: its commits carry the token (store.Fence), a
	// chunk of a machine held elsewhere is passed over, and the seen state is cached for a tenure
	// only (see load): another replica's commits may have advanced it before. Nil: one process
	// owns all (bbolt), exactly as without replicas.
	Lease func(machine string) (token int64, held bool)
	// Rows gives a machine's threads as this replica's watcher holds them now: on gaining a
	// lease the detector catches up by judging them as a snapshot against the stored state
	// (Adopt). Required with Lease.
	Rows func(machine string) []t3rpc.ThreadShell
	// ClaimRemoved (replica mode, optional) takes for one prune the lease of a machine no
	// replica detects any more (removed from t3code.toml: not configured here, no live lease;
	// lease.Manager.ClaimRemoved), so its left-over tracked threads and detector state are
	// pruned like a holder's, fenced with the claim's token; release ends the claim.
	ClaimRemoved func(machine string) (token int64, release func(), ok bool)
}

// DefaultRetention keeps unwatched tracked threads for three days.
const DefaultRetention = 72 * time.Hour

// DefaultPruneEvery is how often Run prunes by default: once an hour is
// plenty for a retention of days (T3CODE_MCP_PRUNE_INTERVAL shortens it).
const DefaultPruneEvery = time.Hour

// New makes a detector.
func New(o Options) *Detector {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Notify == nil {
		o.Notify = func() {}
	}
	if o.Retention <= 0 {
		o.Retention = DefaultRetention
	}
	if o.PruneEvery <= 0 {
		o.PruneEvery = DefaultPruneEvery
	}
	d := &Detector{store: o.Store, tracked: o.Tracked, read: o.Read, notify: o.Notify, prefetch: o.Prefetch, m: o.Metrics, log: o.Logger, now: o.Now,
		retention: o.Retention, pruneIntv: o.PruneEvery, cache: newSeenCache(),
		lease: o.Lease, rows: o.Rows, claim: o.ClaimRemoved, tenure: map[string]int64{}}
	d.lookups = newLookups(o.Lookup)
	return d
}

func key(machine, thread string) string { return machine + "\x00" + thread }

func splitKey(k string) (machine, thread string, ok bool) {
	return strings.Cut(k, "\x00")
}

// Track records a tracked thread (store.PutThread's job) and, when the thread
// starts being watched, its detector baseline, in one transaction: only
// transitions after this moment are reported, never the thread's past. A
// thread whose watch is turned off loses its detector state in the same
// transaction. Track is serialised with the chunks the machine's watcher
// applies, so a chunk in flight can neither miss the new watch nor overwrite
// the fresh baseline with state derived before it, and with Prune, so a
// thread tracked while a prune runs is neither forgotten nor stripped of its
// baseline. shell is the thread's row as the caller saw it (nil for a thread
// T3 has not created yet).
func (d *Detector) Track(machine string, t store.Thread, shell *t3rpc.ThreadShell) error {
	if t.Machine == "" {
		t.Machine = machine
	}
	if t.Machine != machine {
		return fmt.Errorf("track thread %q: it is on machine %q, not %q", t.ID, t.Machine, machine)
	}
	if !d.tracking.TryRLock() {
		if d.hooks.trackWaits != nil {
			d.hooks.trackWaits()
		}
		d.tracking.RLock()
	}
	defer d.tracking.RUnlock()
	mu := d.machineLock(machine)
	mu.Lock()
	defer mu.Unlock()
	prev, had, err := d.tracked.GetThread(t.ID)
	if err != nil {
		return err
	}
	wasWatched := had && prev.Watch && prev.Machine == machine
	k := key(machine, t.ID)
	b := store.Batch{Threads: []store.Thread{t}}
	var s seen
	switch {
	case t.Watch && !wasWatched:
		s = baselineOf(shell)
		raw, _ := json.Marshal(s)
		b.Detector = map[string][]byte{k: raw}
	case !t.Watch && wasWatched:
		b.Detector = map[string][]byte{k: nil}
	}
	if err := d.store.Commit(b); err != nil {
		return err
	}
	switch {
	case t.Watch && !wasWatched:
		d.cache.put(k, cached{s, t.UpdatedAt})
	case !t.Watch:
		d.cache.delete(k)
	}
	if !t.Watch {
		d.lookups.drop(k)
	}
	return nil
}

// baselineOf is the seen state of a thread as its row shows it now: its runs
// count as reported, a run still underway is followed to its end.
func baselineOf(shell *t3rpc.ThreadShell) seen {
	s := seen{}
	if shell == nil {
		return s
	}
	s.Latest = threadstate.LatestRun(shell)
	s.Active = threadstate.ActiveRun(shell)
	if s.Latest != "" {
		_, v := threadstate.Judge(shell, s.Latest)
		s.Settled = v == threadstate.RunSettled || v == threadstate.RunSettledUnreadable
	}
	if s.Active != "" && s.Active != s.Latest {
		s.Open = []string{s.Active} // running while a follow-up is queued
	}
	if p, ok := threadstate.PendingRequest(shell); ok {
		s.Question = p.ID
		s.Asked = []string{p.ID}
	}
	s.UpdatedAt = shell.UpdatedAt.Or("")
	return s
}

// machineLock serialises one machine's chunk application with Track and the
// look-ups' commits.
func (d *Detector) machineLock(machine string) *sync.Mutex {
	if mu, ok := d.locks.Load(machine); ok {
		return mu.(*sync.Mutex)
	}
	mu, _ := d.locks.LoadOrStore(machine, &sync.Mutex{})
	return mu.(*sync.Mutex)
}

// load returns thread k's seen state; rowAt is the UpdatedAt of its tracked row as the caller
// read it. One process (no lease): the cache is the truth, this process writes every state.
// Replica mode: the store is, and the cache holds what this replica committed or read during
// its tenure of the machine — only the holder writes a machine's state (Apply, look-ups and
// Prune are fenced), and a new tenure starts with the machine's entries dropped (another
// replica may have advanced them meanwhile; fenceLocked). The one writer outside the lease is
// Track, on any replica, which rewrites the tracked row (its UpdatedAt) in the same
// transaction as a new baseline: an entry is used only while the row is the one it went with.
// Called with the machine's lock held: its cached states are under it (seenCache).
func (d *Detector) load(k string, rowAt time.Time) (seen, bool, error) {
	c, ok := d.cache.get(k)
	if ok && (d.lease == nil || c.rowAt.Equal(rowAt)) {
		return c.s, true, nil
	}
	raw, ok, err := d.store.Detector(k)
	if err != nil || !ok {
		return seen{}, false, err
	}
	var s seen
	if err := json.Unmarshal(raw, &s); err != nil {
		return seen{}, false, fmt.Errorf("detector state %q: %w", k, err)
	}
	d.cache.put(k, cached{s, rowAt})
	return s, true, nil
}

// Apply implements watch.Sink. It reads nothing from T3: a chunk's events are
// committed with what the rows give — a plain completion with its reply when
// the row proves it (rowReply), anything else as facts with Enrich set, to be
// completed from T3 before delivery — and threads the rows
// cannot settle are noted for a look-up, so the chunk is acknowledged as soon
// as its part of the group commit is on disk.
func (d *Detector) Apply(_ context.Context, c watch.Change) error {
	mu := d.machineLock(c.Machine)
	mu.Lock()
	defer mu.Unlock()
	fence, mine, err := d.fenceLocked(c.Machine)
	if err != nil || !mine {
		return err
	}
	return d.applyLocked(c, fence)
}

// ApplyQuick implements watch.QuickSink: it takes a chunk that changes nothing to commit (a run's
// steps: nothingToCommit) without the machine waiting for anything. It reports false, having
// changed nothing, for any other chunk, and when the machine's lock is held (a Track or a
// look-up committing), in replica mode, and for a snapshot: Apply then takes the change on the
// watcher's goroutine.
func (d *Detector) ApplyQuick(c watch.Change) bool {
	if d.lease != nil || c.Snapshot {
		return false
	}
	mu := d.machineLock(c.Machine)
	if !mu.TryLock() {
		return false
	}
	defer mu.Unlock()
	return d.nothingToCommit(c)
}

// Adopt catches a machine up after this replica gained its lease (replica mode; a no-op
// otherwise or when the lease is not held): the watcher's rows are judged as a snapshot against
// the state the previous holder committed — runs and questions it may have missed become
// look-ups — and its pending look-ups are taken over. Apply does the same on a machine's first
// chunk of a tenure; Adopt is for machines whose stream is quiet.
func (d *Detector) Adopt(machine string) error {
	mu := d.machineLock(machine)
	mu.Lock()
	defer mu.Unlock()
	_, _, err := d.fenceLocked(machine)
	return err
}

// fenceLocked says whether this replica detects the machine now and under which fence,
// catching up first when its tenure is new. Called with the machine's lock held.
func (d *Detector) fenceLocked(machine string) (*store.Fence, bool, error) {
	if d.lease == nil {
		return nil, true, nil
	}
	token, held := d.lease(machine)
	if !held {
		d.passOver(machine)
		return nil, false, nil
	}
	fence := &store.Fence{Machine: machine, Token: token}
	d.mu.Lock()
	current := d.tenure[machine] == token
	d.mu.Unlock()
	if current {
		return fence, true, nil
	}
	// A new tenure: forget the states cached and the look-ups queued under an earlier one (the
	// previous holder may have advanced both), judge the watcher's rows as a snapshot against the
	// stored state, then take over the look-ups the previous holder left noted in the store.
	d.cache.dropMachine(machine)
	d.lookups.dropMachine(machine)
	if rows := d.rows(machine); len(rows) > 0 {
		if err := d.applyLocked(watch.Change{Machine: machine, Snapshot: true, Threads: watch.RowsOf(rows)}, fence); err != nil {
			return nil, false, fmt.Errorf("catch up machine %q after gaining its lease: %w", machine, err)
		}
	}
	prefix := key(machine, "")
	if err := d.store.ForEachDetector(func(k string, v []byte) error {
		var s seen
		if strings.HasPrefix(k, prefix) && json.Unmarshal(v, &s) == nil && s.Lookup {
			d.lookups.add(k)
		}
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("catch up machine %q after gaining its lease: %w", machine, err)
	}
	d.mu.Lock()
	d.tenure[machine] = token
	d.mu.Unlock()
	d.log.Info("caught up with the machine's stored detector state", "machine", machine, "token", token)
	return fence, true, nil
}

// passOver notes that this replica is not detecting the machine now (a chunk passed over, a
// look-up given up): the next time it holds the lease it catches up first, even under the token
// it held before (the tenure check alone would trust a lease that merely lapsed and came back).
func (d *Detector) passOver(machine string) {
	d.mu.Lock()
	if _, had := d.tenure[machine]; had {
		delete(d.tenure, machine)
		// Stale from now on. The machine's lock may not be held here (a look-up passing over):
		// states its holder puts meanwhile are dropped again when the next tenure begins
		// (fenceLocked, under the lock), before anything reads them.
		d.cache.dropMachine(machine)
	}
	d.mu.Unlock()
}

// applyLocked judges a change and commits what it found, under fence (nil: no lease).
func (d *Detector) applyLocked(c watch.Change, fence *store.Fence) error {
	if fence == nil && d.lease == nil && !c.Snapshot && d.nothingToCommit(c) {
		return nil
	}
	next := map[string]cached{}
	dirty := map[string]struct{}{} // keys of next whose state must be committed (not only UpdatedAt moved)
	var evs []store.Event
	var lookup []string
	rows := make([]*t3rpc.ThreadShell, 0, len(c.Passed)+len(c.Threads))
	for _, rs := range [][]*t3rpc.ThreadShell{c.Passed, c.Threads} {
		rows = append(rows, rs...)
	}
	if len(rows) == 0 {
		return nil
	}
	// The threads of the chunk whose rows commit nothing (a run's steps) take their rows into
	// their cached states without their tracked records, as nothingToCommit does for a whole
	// chunk; only the others are read.
	var quiet map[string]cached
	if fence == nil && d.lease == nil && !c.Snapshot {
		quiet = d.quietThreads(c.Machine, rows)
		for id, q := range quiet {
			next[key(c.Machine, id)] = q
		}
	}
	// Each thread once, however many of its rows the chunk passed (a lagging machine's chunk
	// holds several per run): every id is a decoded record.
	ids := make([]string, 0, len(rows)-len(quiet))
	listed := make(map[string]struct{}, len(rows))
	for _, r := range rows {
		if _, dup := listed[r.ID]; !dup {
			listed[r.ID] = struct{}{}
			if _, ok := quiet[r.ID]; !ok {
				ids = append(ids, r.ID)
			}
		}
	}
	// One read for the whole chunk: a snapshot of thousands of rows must not
	// cost thousands of read transactions on the Ack path.
	var trackedBy map[string]store.Thread
	if len(ids) > 0 {
		var err error
		if trackedBy, err = d.tracked.GetThreads(ids); err != nil {
			return err
		}
	}
	for _, row := range rows {
		if _, ok := quiet[row.ID]; ok {
			continue
		}
		t, found := trackedBy[row.ID]
		if !found || !t.Watch || t.Machine != c.Machine {
			continue
		}
		tr := &t
		k := key(c.Machine, row.ID)
		hit, known := next[k]
		prev := hit.s
		if !known {
			var err error
			if prev, known, err = d.load(k, t.UpdatedAt); err != nil {
				return err
			}
		}
		var cur seen
		var out []Transition
		if known {
			cur, out = d.observe(prev, row, *tr, c.Machine, c.Snapshot)
		} else {
			// A watched thread with no recorded state (watched before the
			// detector kept state): take the present as the baseline.
			cur = baselineOf(row)
		}
		if !known || !cur.equal(prev) {
			next[k] = cached{cur, t.UpdatedAt} // encoded once per thread below, its last state
			if !known || d.mustCommit(prev, cur) {
				dirty[k] = struct{}{}
			}
		}
		if cur.Lookup && (!prev.Lookup || cur.Gen != prev.Gen) {
			lookup = append(lookup, k)
		}
		for _, t := range out {
			body, enrich, err := render(t, nil)
			if err != nil {
				return fmt.Errorf("event %s for thread %q: %w", eventType(t.Outcome), t.ThreadID, err)
			}
			evs = append(evs, store.Event{ID: t.ID, Stream: c.Machine + "/" + t.ThreadID, Body: body, Enrich: enrich, CreatedAt: t.At})
		}
	}
	if len(dirty) == 0 && len(evs) == 0 {
		// Only rows' updatedAt moved (a run's steps between its start and its end): nothing to
		// make durable, and the chunk is acknowledged without waiting for a commit.
		for k, n := range next {
			d.cache.put(k, n)
		}
		return nil
	}
	if d.prefetch != nil {
		// The reads that complete these events run beside the commit (prefetch.go); the Ack
		// waits for the commit alone.
		for _, e := range evs {
			if e.Enrich {
				d.prefetch(e)
			}
		}
	}
	states := make(map[string][]byte, len(dirty))
	for k := range dirty {
		b, _ := json.Marshal(next[k].s)
		states[k] = b
	}
	if err := d.store.Commit(store.Batch{Detector: states, Events: evs, Fence: fence}); err != nil {
		if errors.Is(err, store.ErrFenced) {
			// The lease moved on between the check and the commit: the new holder detects
			// these rows from the state committed before its tenure.
			d.log.Info("machine lease lost while committing; the new holder detects its events", "machine", c.Machine)
			return nil
		}
		return err
	}
	for k, n := range next {
		d.cache.put(k, n)
	}
	for _, k := range lookup {
		d.lookups.add(k)
	}
	if len(evs) > 0 {
		d.notify()
		d.m.committed(evs, time.Now())
		// At debug: this runs before the chunk's Ack, and an Info line per event was a write
		// under the log handler's lock for every event at 1,000 events/s. The outbox sums the
		// deliveries up at Info.
		for _, e := range evs {
			d.log.Debug("event recorded", "id", e.ID, "stream", e.Stream)
		}
	}
	return nil
}

// nothingToCommit takes a chunk whose every row is of a thread with a cached state (a watched
// thread seen before) and changes nothing in it that must be committed (seen.sameDurable: its
// UpdatedAt, Active, a run's start) — a run's steps up to its end, most of a busy machine's
// chunks: the cached states take the rows' changes, as
// applyLocked would, without its read of the tracked rows (a read transaction and a decode per
// thread, most of such a chunk's cost). It reports false, having changed nothing, for any other
// chunk. Whether a thread is still tracked and watched need not be read for this: a chunk that
// produces no event and no state to commit changes nothing that a stale answer could get wrong,
// and every chunk that does goes through applyLocked's read. One process only (no lease): in
// replica mode a cached state is used only with its tracked row (load).
//
// Only a chunk of a few rows (nothingToCommitRows) is tried: that is what a machine sends while the
// connector keeps up, and each row's state is looked up among the chunk's rows one by one; a
// larger chunk goes through applyLocked's read. Called with the machine's lock held (ApplyQuick,
// applyLocked): no other goroutine changes its cached states meanwhile.
func (d *Detector) nothingToCommit(c watch.Change) bool {
	if len(c.Passed)+len(c.Threads) > nothingToCommitRows {
		return false
	}
	type state struct {
		k string
		s cached
	}
	var states [nothingToCommitRows]state
	seenNow := states[:0]
	for _, rs := range [][]*t3rpc.ThreadShell{c.Passed, c.Threads} {
		for _, row := range rs {
			k := key(c.Machine, row.ID)
			j := slices.IndexFunc(seenNow, func(st state) bool { return st.k == k })
			var prev cached
			if j >= 0 {
				prev = seenNow[j].s
			} else {
				hit, ok := d.cache.get(k)
				if !ok {
					return false
				}
				prev = hit
			}
			cur, out := d.observe(prev.s, row, store.Thread{}, c.Machine, false)
			if len(out) > 0 || d.mustCommit(prev.s, cur) {
				return false
			}
			if d.hooks.quickJudged != nil {
				d.hooks.quickJudged(c.Machine)
			}
			prev.s = cur
			if j >= 0 {
				seenNow[j].s = prev
			} else {
				seenNow = append(seenNow, state{k, prev})
			}
		}
	}
	for _, st := range seenNow {
		d.cache.put(st.k, st.s)
	}
	return true
}

// nothingToCommitRows bounds the chunks nothingToCommit tries (see there).
const nothingToCommitRows = 8

// quietThreads returns, by thread id, the new cached states of the threads of a chunk's rows
// (a machine's, not a snapshot, no lease) whose every row, judged in order from the thread's
// cached state, changes nothing that must be committed: what nothingToCommit proves for a whole
// chunk, thread by thread, for applyLocked, which then reads the tracked records of the other
// threads alone. A busy machine's chunk holds a few settled runs among many runs' steps; each
// record read is a B-tree search and a decode on the Ack path. A thread with no cached state,
// or one row that would commit or report something, is left out whole (applyLocked judges all
// of its rows again from the start). Called with the machine's lock held: no other goroutine
// changes this machine's cached states meanwhile, so each is read once and judged.
func (d *Detector) quietThreads(machine string, rows []*t3rpc.ThreadShell) map[string]cached {
	var states map[string]cached
	var loud map[string]struct{}
	for _, row := range rows {
		if _, no := loud[row.ID]; no {
			continue
		}
		st, ok := states[row.ID]
		if !ok {
			st, ok = d.cache.get(key(machine, row.ID))
		}
		if ok {
			cur, out := d.observe(st.s, row, store.Thread{}, machine, false)
			if len(out) == 0 && !d.mustCommit(st.s, cur) {
				if states == nil {
					states = make(map[string]cached, len(rows))
				}
				st.s = cur
				states[row.ID] = st
				continue
			}
		}
		if loud == nil {
			loud = map[string]struct{}{}
		}
		loud[row.ID] = struct{}{}
		delete(states, row.ID)
	}
	return states
}

// observe compares one row of a thread with what was seen last. It decides
// from the row's run pointers (threadstate.Judge), never from the status
// string alone, and hands to a look-up whatever the row cannot say.
func (d *Detector) observe(s seen, row *t3rpc.ThreadShell, tr store.Thread, machine string, snapshot bool) (seen, []Transition) {
	prev := s
	s.Open = slices.Clone(s.Open)
	s.Asked = slices.Clone(s.Asked)
	latest := threadstate.LatestRun(row)
	s.Active = threadstate.ActiveRun(row)
	var out []Transition

	if latest != "" && latest != s.Latest {
		// A new latest run: the one before it, if it was not reported, is now
		// an older run still to be followed to its end.
		if s.Latest != "" && !s.Settled && !slices.Contains(s.Open, s.Latest) {
			s.Open = append(s.Open, s.Latest)
		}
		if snapshot && !s.Gap {
			// A snapshot shows each thread's last state only: runs between
			// the one seen last and this one may have come and gone.
			s.Gap, s.GapAfter, s.Lookup = true, s.Latest, true
		}
		s.Latest, s.Settled = latest, false
	}
	// Older runs: the row says they are busy only while one is the active
	// run; otherwise it cannot tell how they ended.
	for _, o := range s.Open {
		if _, v := threadstate.Judge(row, o); v != threadstate.RunBusy {
			s.Lookup = true
		}
	}
	if s.Latest != "" && !s.Settled {
		outcome, v := threadstate.Judge(row, s.Latest)
		switch {
		case v == threadstate.RunSettledUnreadable:
			s.Lookup = true
		case v == threadstate.RunSettled && !s.Lookup:
			t := d.transition(machine, row, tr, s.Latest, outcome, "", "")
			t.RunStatus = row.Status // RunSettled: the status is about this run
			if outcome == threadstate.Completed {
				t.Reply, _ = rowReply(row, s.Latest)
			}
			out = append(out, t)
			s.Settled = true
			// Otherwise a look-up is pending: it reports this run after the
			// older ones, so a thread's events keep their order.
		}
	}
	if p, ok := threadstate.PendingRequest(row); ok {
		if p.ID != s.Question && !slices.Contains(s.Asked, p.ID) {
			run := s.Active
			if run == "" {
				run = s.Latest
			}
			out = append(out, d.transition(machine, row, tr, run, threadstate.Question, p.ID, p.Kind))
			s.Asked = append(s.Asked, p.ID)
		}
		s.Question = p.ID
	}
	updated := row.UpdatedAt.Or("")
	if snapshot && prev.busy() && updated != "" && updated != prev.UpdatedAt {
		// The thread changed while we were not looking, with a run underway:
		// a question may have been asked and answered in between.
		s.Lookup = true
	}
	s.UpdatedAt = updated
	if !s.busy() && !s.Lookup {
		s.Asked = nil // every run is reported: their requests cannot come back
	}
	if s.Lookup && (!prev.Lookup || s.Latest != prev.Latest || !slices.Equal(s.Open, prev.Open) || s.Gap != prev.Gap) {
		s.Gen++
	}
	return s, out
}

// eventID is stable: the same transition always gets the same id, so the
// store skips a repeated insert whatever path found it again. It hashes the
// event type ("thread.completed"), as it always has.
func eventID(machine, thread string, o threadstate.Outcome, subject string) string {
	h := sha256.Sum256([]byte(machine + "\x00" + thread + "\x00" + string(eventType(o)) + "\x00" + subject))
	return "evt_" + hex.EncodeToString(h[:12])
}

func (d *Detector) transition(machine string, row *t3rpc.ThreadShell, tr store.Thread, runID string, o threadstate.Outcome, requestID, kind string) Transition {
	subject := runID
	if o == threadstate.Question {
		subject = requestID
	}
	at := d.now().UTC()
	if o != threadstate.Question {
		if v, ok := row.LatestRunCompletedAt.Get(); ok && runID == threadstate.LatestRun(row) {
			if t, ok := parseTime(v); ok {
				at = t
			}
		}
	} else if p, ok := row.PendingRuntimeRequest.Get(); ok {
		if t, ok := parseTime(p.CreatedAt.Or("")); ok {
			at = t
		}
	}
	return Transition{
		ID: eventID(machine, row.ID, o, subject), Outcome: o, Machine: machine, ThreadID: row.ID,
		RunID: runID, RequestID: requestID, Kind: kind, ProjectID: row.ProjectId, Title: row.Title, Tracked: tr, At: at,
		Branch: row.Branch.Or(""), Worktree: row.WorktreePath.Or(""),
	}
}
