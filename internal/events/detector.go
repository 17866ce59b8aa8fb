// Package events turns the run transitions of watched threads into event
// records, exactly once: a run reaching completed, interrupted or failed, and a
// new pending question. The detector is the watcher's Sink: it sees every
// applied chunk before T3 gets the Ack, and commits its last-seen state and the
// events that chunk produced in one fsynced transaction, so neither a reconnect
// replay, a snapshot fallback nor a crash can lose or repeat a transition.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// Type is the event type.
type Type string

const (
	Completed   Type = "thread.completed"
	Interrupted Type = "thread.interrupted"
	Failed      Type = "thread.failed"
	Question    Type = "thread.question"
)

// Transition is one detected transition, handed to the Builder.
type Transition struct {
	ID        string // stable: the same transition always gets the same id
	Type      Type
	Machine   string
	ThreadID  string
	RunID     string
	RequestID string // for questions
	Kind      string // runtime request kind for questions
	Shell     t3rpc.ThreadShell
	Tracked   store.Thread
	At        time.Time
}

// Builder renders a transition into the event body (JSON). It may read the
// thread from T3 (final reply, error, questions); it must not fail for lack of
// detail: a body with less detail beats a lost event.
type Builder func(ctx context.Context, tr Transition) ([]byte, error)

// RunStatus reads one run's status from T3, for a run that the shell stream
// moved past before its settling was seen (a reconnect, a snapshot, a restart).
type RunStatus func(ctx context.Context, machine, threadID, runID string) (status string, found bool, err error)

// RunInfo is one run of a thread as T3 lists it.
type RunInfo struct {
	ID      string
	Ordinal int64
	Status  string
}

// Runs lists a thread's runs, oldest first. The detector reads them when runs
// may have started and settled between two observations of the thread: a
// chunk or a snapshot carries each thread's last state only, so a run that
// came and went inside one (a queued follow-up, a reconnect) is not in it.
type Runs func(ctx context.Context, machine, threadID string) ([]RunInfo, error)

// Tracked tells which threads are watched.
type Tracked interface {
	GetThread(id string) (store.Thread, bool, error)
}

// Committer makes detector state and events durable together.
type Committer interface {
	Commit(b store.Batch) error
	Detector(key string) ([]byte, bool, error)
}

// seen is the detector's last-seen state of one thread, persisted per thread.
type seen struct {
	RunID    string `json:"run,omitempty"`
	Settled  bool   `json:"settled,omitempty"`
	Question string `json:"question,omitempty"`
	// Open lists earlier runs the thread moved past before they settled (a
	// run still checkpointing while a queued one starts): each is looked up
	// until it settles, so its event comes however late.
	Open []string `json:"open,omitempty"`
}

func (s seen) equal(o seen) bool {
	return s.RunID == o.RunID && s.Settled == o.Settled && s.Question == o.Question && slices.Equal(s.Open, o.Open)
}

// Detector is a watch.Sink.
type Detector struct {
	store   Committer
	tracked Tracked
	build   Builder
	run     RunStatus
	runs    Runs
	notify  func()
	log     *slog.Logger
	now     func() time.Time

	mu    sync.Mutex
	cache map[string]seen
	locks map[string]*sync.Mutex // per machine: Apply and Track
}

// Options for a Detector.
type Options struct {
	Store     Committer
	Tracked   Tracked
	Build     Builder
	RunStatus RunStatus
	// Runs, when set, finds runs that settled between two observations.
	Runs Runs
	// Notify is called after events were committed (wakes the outbox).
	Notify func()
	Logger *slog.Logger
	Now    func() time.Time
}

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
	return &Detector{store: o.Store, tracked: o.Tracked, build: o.Build, run: o.RunStatus, runs: o.Runs, notify: o.Notify, log: o.Logger, now: o.Now, cache: map[string]seen{}, locks: map[string]*sync.Mutex{}}
}

func key(machine, thread string) string { return machine + "\x00" + thread }

// Track records a tracked thread (store.PutThread's job) and, when the thread
// starts being watched, its detector baseline, in one transaction: only
// transitions after this moment are reported, never the thread's past. A
// thread whose watch is turned off loses its detector state in the same
// transaction. Track is serialised with the chunks the machine's watcher
// applies, so a chunk in flight can neither miss the new watch nor overwrite
// the fresh baseline with state derived before it. shell is the thread's row
// as the caller saw it (nil for a thread T3 has not created yet).
func (d *Detector) Track(machine string, t store.Thread, shell *t3rpc.ThreadShell) error {
	if t.Machine == "" {
		t.Machine = machine
	}
	if t.Machine != machine {
		return fmt.Errorf("track thread %q: it is on machine %q, not %q", t.ID, t.Machine, machine)
	}
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
	d.mu.Lock()
	switch {
	case t.Watch && !wasWatched:
		d.cache[k] = s
	case !t.Watch:
		delete(d.cache, k)
	}
	d.mu.Unlock()
	return nil
}

// baselineOf is the seen state of a thread as its row shows it now.
func baselineOf(shell *t3rpc.ThreadShell) seen {
	s := seen{}
	if shell != nil {
		s.RunID = threadstate.LatestRun(shell)
		if s.RunID != "" {
			_, s.Settled = threadstate.Settled(shell.Status)
		}
		if p, ok := threadstate.PendingRequest(shell); ok {
			s.Question = p.ID
		}
	}
	return s
}

// machineLock serialises one machine's chunk application with Track.
func (d *Detector) machineLock(machine string) *sync.Mutex {
	d.mu.Lock()
	defer d.mu.Unlock()
	mu, ok := d.locks[machine]
	if !ok {
		mu = &sync.Mutex{}
		d.locks[machine] = mu
	}
	return mu
}

func (d *Detector) load(k string) (seen, bool, error) {
	d.mu.Lock()
	s, ok := d.cache[k]
	d.mu.Unlock()
	if ok {
		return s, true, nil
	}
	raw, ok, err := d.store.Detector(k)
	if err != nil || !ok {
		return seen{}, false, err
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return seen{}, false, fmt.Errorf("detector state %q: %w", k, err)
	}
	d.mu.Lock()
	d.cache[k] = s
	d.mu.Unlock()
	return s, true, nil
}

// Apply implements watch.Sink.
func (d *Detector) Apply(ctx context.Context, c watch.Change) error {
	mu := d.machineLock(c.Machine)
	mu.Lock()
	defer mu.Unlock()
	// One chunk may need a thread's projection several times (runs between
	// observations, each event's details): read it once per chunk.
	ctx = context.WithValue(ctx, readCacheKey{}, map[string]readResult{})
	states := map[string][]byte{}
	next := map[string]seen{}
	var evs []store.Event
	for i := range c.Threads {
		shell := &c.Threads[i]
		tr, ok, err := d.tracked.GetThread(shell.ID)
		if err != nil {
			return err
		}
		if !ok || !tr.Watch || tr.Machine != c.Machine {
			continue
		}
		k := key(c.Machine, shell.ID)
		prev, known := next[k]
		if !known {
			prev, known, err = d.load(k)
			if err != nil {
				return err
			}
		}
		cur, transitions, err := d.detect(ctx, c.Machine, shell, tr, prev, known)
		if err != nil {
			return err
		}
		if !cur.equal(prev) || !known {
			next[k] = cur
			b, _ := json.Marshal(cur)
			states[k] = b
		}
		for _, t := range transitions {
			body, err := d.build(ctx, t)
			if err != nil {
				return fmt.Errorf("build event %s for thread %q: %w", t.Type, t.ThreadID, err)
			}
			evs = append(evs, store.Event{ID: t.ID, Stream: c.Machine + "/" + t.ThreadID, Body: body, CreatedAt: t.At})
		}
	}
	if len(states) == 0 && len(evs) == 0 {
		return nil
	}
	if err := d.store.Commit(store.Batch{Detector: states, Events: evs}); err != nil {
		return err
	}
	d.mu.Lock()
	for k, s := range next {
		d.cache[k] = s
	}
	d.mu.Unlock()
	if len(evs) > 0 {
		for _, e := range evs {
			d.log.Info("event recorded", "id", e.ID, "stream", e.Stream)
		}
		d.notify()
	}
	return nil
}

// detect compares a thread's new row with what was seen last.
func (d *Detector) detect(ctx context.Context, machine string, shell *t3rpc.ThreadShell, tr store.Thread, prev seen, known bool) (seen, []Transition, error) {
	latest := threadstate.LatestRun(shell)
	outcome, settled := threadstate.Settled(shell.Status)
	if latest == "" {
		settled = false
	}
	cur := seen{RunID: latest, Settled: settled, Question: prev.Question}
	if !known {
		// A watched thread with no recorded state (watch turned on before
		// Baseline existed): take the present as the baseline.
		if p, ok := threadstate.PendingRequest(shell); ok {
			cur.Question = p.ID
		}
		return cur, nil, nil
	}
	var out []Transition
	// Runs we saw start but never saw settle, that the thread has moved past
	// (dispatched into right after settling, queued behind a checkpoint, or
	// missed while disconnected): read how each ended, so no event is lost;
	// one still running stays open and is read again next time.
	open := append([]string(nil), prev.Open...)
	if prev.RunID != "" && prev.RunID != latest && !prev.Settled {
		open = append(open, prev.RunID)
	}
	if latest != "" && latest != prev.RunID && d.runs != nil && mayHaveSkipped(prev.RunID, latest) {
		between, err := d.between(ctx, machine, shell.ID, prev.RunID, latest)
		if err != nil {
			return prev, nil, err
		}
		for _, r := range between {
			if o, ok := threadstate.Settled(r.Status); ok {
				out = append(out, d.transition(machine, shell, tr, r.ID, typeOf(o), "", ""))
			} else if !slices.Contains(open, r.ID) {
				open = append(open, r.ID)
			}
		}
	}
	for _, runID := range open {
		if runID == latest || d.run == nil {
			continue // the latest run is judged from the row itself, below
		}
		status, found, err := d.run(ctx, machine, shell.ID, runID)
		if err != nil {
			return prev, nil, fmt.Errorf("read run %q of thread %q: %w", runID, shell.ID, err)
		}
		if o, ok := threadstate.Settled(status); ok && found {
			out = append(out, d.transition(machine, shell, tr, runID, typeOf(o), "", ""))
		} else if found {
			cur.Open = append(cur.Open, runID)
		}
	}
	if settled && !(prev.RunID == latest && prev.Settled) {
		out = append(out, d.transition(machine, shell, tr, latest, typeOf(outcome), "", ""))
	}
	if p, ok := threadstate.PendingRequest(shell); ok && p.ID != prev.Question {
		cur.Question = p.ID
		out = append(out, d.transition(machine, shell, tr, latest, Question, p.ID, p.Kind))
	}
	return cur, out, nil
}

// runOrdinal reads n from T3's run ids, "run:thread:<threadId>:ordinal:<n>".
func runOrdinal(id string) (int64, bool) {
	i := strings.LastIndex(id, ":ordinal:")
	if i < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(id[i+len(":ordinal:"):], 10, 64)
	return n, err == nil
}

// mayHaveSkipped reports whether runs may lie between the run seen last and
// the latest one. T3 numbers a thread's runs, so the usual next run (or a
// thread's first) needs no read; ids of another shape always get one.
func mayHaveSkipped(prev, latest string) bool {
	l, ok := runOrdinal(latest)
	if !ok {
		return true
	}
	if prev == "" {
		return l > 1
	}
	p, ok := runOrdinal(prev)
	return !ok || l-p > 1
}

// between lists the runs after prev ("" for none) and before latest.
func (d *Detector) between(ctx context.Context, machine, threadID, prev, latest string) ([]RunInfo, error) {
	runs, err := d.runs(ctx, machine, threadID)
	if err != nil {
		return nil, fmt.Errorf("read the runs of thread %q: %w", threadID, err)
	}
	lo, loOK := int64(0), prev == ""
	hi, hiOK := int64(0), false
	for _, r := range runs {
		if r.ID == prev {
			lo, loOK = r.Ordinal, true
		}
		if r.ID == latest {
			hi, hiOK = r.Ordinal, true
		}
	}
	if !loOK {
		if lo, loOK = runOrdinal(prev); !loOK {
			return nil, nil // the run seen last is unknown to T3 now: no way to tell what is newer
		}
	}
	var out []RunInfo
	for _, r := range runs {
		if r.Ordinal > lo && r.ID != prev && r.ID != latest && (!hiOK || r.Ordinal < hi) {
			out = append(out, r)
		}
	}
	return out, nil
}

func typeOf(o threadstate.Outcome) Type {
	switch o {
	case threadstate.Completed:
		return Completed
	case threadstate.Interrupted:
		return Interrupted
	}
	return Failed
}

func (d *Detector) transition(machine string, shell *t3rpc.ThreadShell, tr store.Thread, runID string, typ Type, requestID, kind string) Transition {
	subject := runID
	if typ == Question {
		subject = requestID
	}
	h := sha256.Sum256([]byte(machine + "\x00" + shell.ID + "\x00" + string(typ) + "\x00" + subject))
	at := d.now().UTC()
	if typ != Question {
		if v, ok := shell.LatestRunCompletedAt.Get(); ok && runID == threadstate.LatestRun(shell) {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				at = t.UTC()
			}
		}
	} else if p, ok := shell.PendingRuntimeRequest.Get(); ok {
		if v, ok := p.CreatedAt.Get(); ok {
			if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
				at = t.UTC()
			}
		}
	}
	return Transition{
		ID: "evt_" + hex.EncodeToString(h[:12]), Type: typ, Machine: machine, ThreadID: shell.ID,
		RunID: runID, RequestID: requestID, Kind: kind, Shell: *shell, Tracked: tr, At: at,
	}
}
