package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// LookupOptions tune the look-ups: reads of a thread for what its shell rows
// could not say, run beside the watchers, each thread on its own backoff.
type LookupOptions struct {
	// Concurrency bounds the reads in flight across all machines (default 8).
	Concurrency int
	// Timeout bounds one read (default 30s; the machine's HTTP client may cut
	// it sooner).
	Timeout time.Duration
	// MinBackoff and MaxBackoff bound the wait before a thread is read again
	// after a failed read, or while a run it follows is still settling
	// (defaults 500ms and 1m).
	MinBackoff, MaxBackoff time.Duration
}

// lookups is the queue of threads needing a look-up: in memory, rebuilt from
// the durable notes (seen.Lookup) at start.
type lookups struct {
	opt  LookupOptions
	mu   sync.Mutex
	wake chan struct{}
	// tasks by detector key; a key is in running while a read is in flight.
	tasks   map[string]*lookupTask
	running map[string]bool
}

type lookupTask struct {
	next    time.Time
	bo      *backoff.ExponentialBackOff
	lastErr error // the last read failed (for health: LookupStatus.Failing)
}

func newLookups(o LookupOptions) *lookups {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 500 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	return &lookups{opt: o, wake: make(chan struct{}, 1), tasks: map[string]*lookupTask{}, running: map[string]bool{}}
}

func (l *lookups) newBackoff() *backoff.ExponentialBackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval = l.opt.MinBackoff, l.opt.MaxBackoff
	b.Reset()
	return b
}

// add queues a look-up of the thread now (or keeps the one queued).
func (l *lookups) add(k string) {
	l.mu.Lock()
	t, ok := l.tasks[k]
	if !ok {
		l.tasks[k] = &lookupTask{bo: l.newBackoff()}
	} else if t.lastErr == nil {
		t.next = time.Time{} // not failing: read again at once
	}
	l.mu.Unlock()
	l.poke()
}

func (l *lookups) drop(k string) {
	l.mu.Lock()
	delete(l.tasks, k)
	l.mu.Unlock()
}

// dropMachine forgets the look-ups queued for one machine's threads.
func (l *lookups) dropMachine(machine string) {
	prefix := key(machine, "")
	l.mu.Lock()
	for k := range l.tasks {
		if strings.HasPrefix(k, prefix) {
			delete(l.tasks, k)
		}
	}
	l.mu.Unlock()
}

func (l *lookups) poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// due takes the keys whose time has come, up to free slots.
func (l *lookups) due(now time.Time, free int) (keys []string, next time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, t := range l.tasks {
		if l.running[k] {
			continue
		}
		if !t.next.After(now) {
			keys = append(keys, k)
		} else if next.IsZero() || t.next.Before(next) {
			next = t.next
		}
	}
	sort.Slice(keys, func(i, j int) bool { return l.tasks[keys[i]].next.Before(l.tasks[keys[j]].next) })
	if len(keys) > free {
		next = now
		keys = keys[:free]
	}
	for _, k := range keys {
		l.running[k] = true
	}
	return keys, next
}

// done records a look-up's end: remove the task, or try again after a
// backoff (err: the read failed; retry: a run it follows is still settling;
// again: the state moved on while reading, read again at once).
func (l *lookups) done(k string, err error, retry, again bool) {
	l.mu.Lock()
	delete(l.running, k)
	t, ok := l.tasks[k]
	switch {
	case !ok:
	case again:
		t.next = time.Time{}
	case err != nil || retry:
		t.lastErr = err
		t.next = time.Now().Add(t.bo.NextBackOff())
	default:
		delete(l.tasks, k)
	}
	l.mu.Unlock()
	l.poke()
}

// LookupStatus is one machine's look-ups.
type LookupStatus struct {
	Pending int // threads waiting for a look-up
	Failing int // of those, threads whose last read failed
}

// Lookups reports, per machine, the threads whose events wait for a look-up.
func (d *Detector) Lookups() map[string]LookupStatus {
	l := d.lookups
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]LookupStatus{}
	for k, t := range l.tasks {
		m, _, _ := splitKey(k)
		s := out[m]
		s.Pending++
		if t.lastErr != nil {
			s.Failing++
		}
		out[m] = s
	}
	return out
}

// Run performs the look-ups until ctx ends: first every note left by an
// earlier process, then each thread as its note appears, reads bounded in
// number, each thread retried on its own backoff. It also prunes tracked
// threads past their retention (Prune) at start and every PruneEvery.
func (d *Detector) Run(ctx context.Context) {
	if err := d.store.ForEachDetector(func(k string, v []byte) error {
		var s seen
		if json.Unmarshal(v, &s) == nil && s.Lookup {
			d.lookups.add(k)
		}
		return nil
	}); err != nil {
		d.log.Error("could not read the detector's pending look-ups; they resume with the threads' next changes", "err", err)
	}
	l := d.lookups
	var wg sync.WaitGroup
	defer wg.Wait()
	inFlight := make(chan struct{}, l.opt.Concurrency)
	prune := time.NewTicker(d.pruneIntv)
	defer prune.Stop()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	if _, err := d.Prune(); err != nil {
		d.log.Warn("pruning tracked threads failed", "err", err)
	}
	for {
		keys, next := l.due(time.Now(), l.opt.Concurrency-len(inFlight))
		for _, k := range keys {
			inFlight <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-inFlight }()
				res, err := d.lookup(ctx, k)
				if ctx.Err() != nil {
					l.done(k, nil, false, true)
					return
				}
				l.done(k, err, res == lookupRetry, res == lookupAgain)
			}()
		}
		var due <-chan time.Time
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-l.wake:
		case <-due:
		case <-prune.C:
			if _, err := d.Prune(); err != nil {
				d.log.Warn("pruning tracked threads failed", "err", err)
			}
		}
	}
}

type lookupResult int

const (
	lookupDone  lookupResult = iota
	lookupRetry              // runs it follows are still settling: read again after a backoff
	lookupAgain              // the note changed while reading: read again at once
)

// lookup reads one thread and settles what its note asks. An error means the
// read (or the commit) failed: the thread is read again after a backoff.
func (d *Detector) lookup(ctx context.Context, k string) (lookupResult, error) {
	machine, threadID, ok := splitKey(k)
	if !ok {
		return lookupDone, nil
	}
	if d.lease != nil {
		if _, held := d.lease(machine); !held {
			d.passOver(machine) // the note stays: whoever holds the lease next takes it up (Adopt)
			return lookupDone, nil
		}
	}
	tr, found, err := d.tracked.GetThread(threadID)
	if err != nil {
		return lookupDone, err
	}
	if !found || !tr.Watch || tr.Machine != machine {
		return lookupDone, nil
	}
	// The machine's cached states are read and written under its lock (seenCache), held here
	// for the look-up of the state alone, not over the read of the thread below.
	mu := d.machineLock(machine)
	mu.Lock()
	s, known, err := d.load(k, tr.UpdatedAt)
	mu.Unlock()
	if err != nil {
		return lookupDone, err
	}
	if !known || !s.Lookup {
		return lookupDone, nil
	}
	if d.read == nil {
		return lookupDone, errors.New("no reader configured")
	}
	rctx, cancel := context.WithTimeout(ctx, d.lookups.opt.Timeout)
	p, rerr := d.read.ReadThread(rctx, machine, threadID)
	cancel()
	if rerr != nil {
		d.log.Warn("thread look-up failed; its events wait and the machine goes on", "machine", machine, "thread", threadID, "err", rerr)
		return lookupDone, fmt.Errorf("read thread %q: %w", threadID, rerr)
	}

	mu.Lock()
	defer mu.Unlock()
	fence, mine, err := d.fenceLocked(machine)
	if err != nil || !mine {
		return lookupDone, err
	}
	if tr, found, err = d.tracked.GetThread(threadID); err != nil {
		return lookupDone, err
	}
	if !found || !tr.Watch || tr.Machine != machine {
		return lookupDone, nil
	}
	cur, known, err := d.load(k, tr.UpdatedAt)
	if err != nil {
		return lookupDone, err
	}
	if !known || !cur.Lookup {
		return lookupDone, nil
	}
	if cur.Gen != s.Gen {
		return lookupAgain, nil
	}
	next, trs := d.resolve(cur, p, machine, tr)
	var evs []store.Event
	for _, t := range trs {
		body, enrich, err := render(t, p)
		if err != nil {
			return lookupDone, err
		}
		evs = append(evs, store.Event{ID: t.ID, Stream: machine + "/" + threadID, Body: body, Enrich: enrich, CreatedAt: t.At})
	}
	raw, _ := json.Marshal(next)
	if err := d.store.Commit(store.Batch{Detector: map[string][]byte{k: raw}, Events: evs, Fence: fence}); err != nil {
		if errors.Is(err, store.ErrFenced) {
			return lookupDone, nil // the new holder takes the look-up over
		}
		return lookupDone, err
	}
	d.cache.put(k, cached{next, tr.UpdatedAt})
	if len(evs) > 0 {
		for _, e := range evs {
			d.log.Debug("event recorded", "id", e.ID, "stream", e.Stream, "from", "look-up")
		}
		d.notify()
	}
	if next.Lookup {
		return lookupRetry, nil
	}
	return lookupDone, nil
}

// resolve settles a note from the thread's projection: every run it follows
// (older runs passed over, the latest when the row could not say, runs a
// snapshot skipped), in the projection's order, with the questions each run
// asked that were not reported yet; then the latest run and its questions.
func (d *Detector) resolve(s seen, p *t3api.ThreadProjection, machine string, tr store.Thread) (seen, []Transition) {
	runs := threadview.New(p).Runs()
	want := d.followedRuns(s, runs, machine, tr.ID)
	requests := requestsOf(p, want)

	next := s
	next.Open, next.Asked = nil, slices.Clone(s.Asked)
	next.Gap, next.GapAfter = false, ""
	base := Transition{Machine: machine, ThreadID: tr.ID, ProjectID: p.Thread.ProjectId, Title: p.Thread.Title, Tracked: tr,
		Branch: p.Thread.Branch.Or(""), Worktree: p.Thread.WorktreePath.Or("")}
	var out []Transition
	retry := false
	for _, r := range runs {
		if !want[r.ID] {
			continue
		}
		delete(want, r.ID)
		out = d.questions(out, &next, base, r.ID, requests[r.ID], s.Question)
		if o, ok := threadstate.Settled(r.Status); ok {
			t := base
			t.Outcome, t.RunID, t.RunStatus = o, r.ID, r.Status
			t.ID, t.At = eventID(machine, tr.ID, o, r.ID), timeOr(r.CompletedAt.Or(""), d.now())
			out = append(out, t)
			if r.ID == s.Latest {
				next.Settled = true
			}
			continue
		}
		if r.ID == s.Latest {
			// Still underway: its rows report its end. A row that could not
			// say (no active run, a status like "idle") is read again.
			if r.ID != s.Active {
				retry = true
			}
			continue
		}
		next.Open = append(next.Open, r.ID)
		if r.ID != s.Active {
			retry = true // passed over and still settling: read again later
		}
	}
	for id := range want {
		// A run the rows named that T3 does not list (rolled back, or a
		// replaced database): nothing can be learnt of its end.
		d.log.Warn("a run the thread's rows named is not in its projection; no event for it", "machine", machine, "thread", tr.ID, "run", id)
		if id == s.Latest {
			next.Settled = true
		}
	}
	next.Lookup = retry
	if !next.busy() && !next.Lookup {
		next.Asked = nil
	}
	return next, out
}

// followedRuns is the set of runs a note follows: its open runs, its latest unless settled, and
// after a gap the runs between the one seen last and the latest.
func (d *Detector) followedRuns(s seen, runs []t3api.Run, machine, threadID string) map[string]bool {
	want := map[string]bool{}
	for _, o := range s.Open {
		want[o] = true
	}
	if s.Latest != "" && !s.Settled {
		want[s.Latest] = true
	}
	if !s.Gap {
		return want
	}
	index := make(map[string]int, len(runs))
	for i, r := range runs {
		index[r.ID] = i
	}
	start := 0
	if s.GapAfter != "" {
		if i, ok := index[s.GapAfter]; ok {
			start = i + 1
		} else {
			d.log.Warn("the run seen last is unknown to T3 now: runs between it and the latest cannot be placed; reporting the runs known",
				"machine", machine, "thread", threadID, "run", s.GapAfter)
			start = len(runs)
		}
	}
	end := len(runs)
	if i, ok := index[s.Latest]; ok {
		end = i + 1
	}
	for _, r := range runs[start:max(start, end)] {
		want[r.ID] = true
	}
	return want
}

// requestsOf lists the questions (input and approval requests) of the wanted runs, per run, in
// item order.
func requestsOf(p *t3api.ThreadProjection, want map[string]bool) map[string][]*t3api.TurnItem {
	requests := map[string][]*t3api.TurnItem{}
	for i := range p.TurnItems {
		it := &p.TurnItems[i]
		run, ok := it.RunId.Get()
		if !ok || !want[run] || (it.Type != "user_input_request" && it.Type != "approval_request") {
			continue
		}
		requests[run] = append(requests[run], it)
	}
	for _, list := range requests {
		sort.SliceStable(list, func(i, j int) bool { return list[i].Ordinal < list[j].Ordinal })
	}
	return requests
}

// questions appends a question event for each of a run's requests not reported yet (not in
// next.Asked, not the one the rows already reported) and notes it as asked.
func (d *Detector) questions(out []Transition, next *seen, base Transition, runID string, requests []*t3api.TurnItem, reported string) []Transition {
	for _, it := range requests {
		req, _ := it.RequestId.Get()
		if req == "" || slices.Contains(next.Asked, req) || req == reported {
			continue
		}
		t := base
		t.Outcome, t.RunID, t.RequestID, t.Kind = threadstate.Question, runID, req, "user_input"
		if it.Type == "approval_request" {
			t.Kind = it.RequestKind.Or("approval")
		}
		t.ID, t.At = eventID(base.Machine, base.ThreadID, threadstate.Question, req), timeOr(it.StartedAt.Or(""), d.now())
		out = append(out, t)
		next.Asked = append(next.Asked, req)
	}
	return out
}

func timeOr(s string, def time.Time) time.Time {
	if t, ok := parseTime(s); ok {
		return t
	}
	return def.UTC()
}
