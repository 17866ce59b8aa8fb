package store

import (
	"sync"
	"time"
)

// Group commits the batches of many concurrent callers together: one
// transaction and one fsync for every batch waiting when the previous commit
// ended (group commit). Each caller's Commit returns only once its own batch is
// durable, so a watcher still acknowledges a chunk only after its part is on
// disk, while a hundred machines' watchers share the fsyncs instead of queueing
// for one each.
//
// There is one writer at a time: the goroutine that finds no commit running
// becomes the writer, takes every pending batch (and of the outbox's records, while
// batches wait, a bounded share: recordShare), writes them, releases their
// callers and goes on while batches keep arriving; it then ends, so nothing
// runs while nothing is written.
type Group struct {
	s Store

	mu      sync.Mutex
	pending []*groupReq
	writing bool

	// Stats: transactions written and batches they held (benchmarks, tests).
	txs, batches uint64

	m *GroupMetrics // nil: none

	// durable, when set (OnDurable), gets the events each transaction appended once it is
	// durable; appended is the writer's buffer for them (one writer at a time uses it).
	durable  func([]Event)
	appended []Event

	// observe, when set (ObserveCommits), gets each transaction's timing; timing is the
	// writer's note of the running one.
	observe func(CommitTiming)
	timing  txTiming
}

type groupReq struct {
	b Batch
	// ops, when not nil, make this a Record request: its per-op results go to errs.
	ops  []Op
	errs []error
	done chan error
	at   time.Time // when it was queued (the metrics' wait)
}

// OpsCommitter is a Store that can apply outbox ops (Record) in the same transaction as batches
// (the bbolt store): Group.Record then shares the detector's fsyncs.
type OpsCommitter interface {
	// CommitBatchesAndOps writes bs and applies ops in one fsynced transaction; errs reports the
	// ops that could not apply (as Record does), err a failure of the whole transaction.
	// appended, when not nil, is called inside the transaction with every event appended, as
	// stored (Seq set), in sequence order: the transaction may still fail after it.
	CommitBatchesAndOps(bs []Batch, ops []Op, appended func(Event)) (errs []error, err error)
}

// NewGroup returns the group committer of s. A store should have one (more
// would only split the groups).
func NewGroup(s Store) *Group { return &Group{s: s} }

// WithMetrics makes g observe its transactions on m; call it before the first Commit.
func (g *Group) WithMetrics(m *GroupMetrics) *Group {
	g.m = m
	return g
}

// Commit writes b, grouped with the batches of other callers, and returns when
// it is durable. A batch that fails on its own (an invalid event) fails alone:
// the others are written without it.
func (g *Group) Commit(b Batch) error {
	if err := validate(b); err != nil {
		return err
	}
	r := &groupReq{b: b, done: make(chan error, 1)}
	g.enqueue(r)
	return <-r.done
}

// OnDurable makes g call fn with the events each of its transactions appended (as stored: Seq
// set, duplicates skipped, in sequence order) once the transaction is durable and before its
// callers' Commit returns, so that whoever delivers them (the outbox) has them in memory instead
// of reading them back. It works only on an OpsCommitter (the bbolt store; it reports false and
// fn is never called otherwise) and must be set before the first Commit. fn runs on the writer's
// goroutine between transactions: it must be quick, must not call g, and must not keep the slice
// (it is reused); the events' bodies are the committers' and must not be modified.
func (g *Group) OnDurable(fn func([]Event)) bool {
	if _, ok := g.s.(OpsCommitter); !ok {
		return false
	}
	g.durable = fn
	return true
}

// SharesRecords reports whether Record joins the group's transactions (the store is an
// OpsCommitter); otherwise Record is the store's own.
func (g *Group) SharesRecords() bool {
	_, ok := g.s.(OpsCommitter)
	return ok
}

// Record applies the outbox's ops (Store.Record's contract) in the group's next transaction,
// together with the detector's batches waiting then: while chunks are being committed, the
// deliveries' records ride along instead of queueing for the single writer and an fsync of their
// own. It returns once they are durable. A store that is not an OpsCommitter records them alone.
func (g *Group) Record(ops []Op) ([]error, error) {
	if !g.SharesRecords() {
		return g.s.Record(ops)
	}
	if ops == nil {
		ops = []Op{}
	}
	// In parts of at most recordPart ops, so that a chunk's batch waiting meanwhile need not
	// wait for all of them (write takes the parts while batches wait within recordShare).
	parts := make([]*groupReq, 0, (len(ops)+recordPart-1)/recordPart+1)
	for i := 0; i == 0 || i < len(ops); i += recordPart {
		parts = append(parts, &groupReq{ops: ops[i:min(i+recordPart, len(ops))], done: make(chan error, 1)})
	}
	g.enqueue(parts...)
	errs := make([]error, 0, len(ops))
	var failed error
	for _, r := range parts {
		if err := <-r.done; err != nil && failed == nil {
			failed = err
		}
		errs = append(errs, r.errs...)
	}
	if failed != nil {
		// Other parts (in transactions of their own) may be durable: the caller treats the ops
		// as not recorded and finds those applied when it tries again (Store.Record's
		// ErrNotPending).
		return nil, failed
	}
	return errs, nil
}

// recordPart and recordBudget bound the outbox's share of a transaction that chunks' batches
// wait for: a Record is queued in parts of recordPart ops, and while batches are waiting a
// transaction takes parts of at most recordShare ops in all (the rest go into the next one). A
// delivery outcome costs ~25 µs in a transaction (BenchmarkRecord256): a backlog's 2,048
// outcomes in one transaction were ~50 ms that every chunk arriving meanwhile waited for, and a
// chunk is the more likely to arrive during the longest transactions. With no batch waiting the
// transaction takes every part (a backlog drains in as few fsyncs as before).
const (
	recordPart   = 128
	recordBudget = 256
)

// recordShare is how many record ops a transaction takes while batches appending events are
// among it: recordBudget, or twice the events those batches append when that is more. Every
// appended event is one record op once delivered, so a fixed budget capped the recorded
// deliveries at recordBudget per transaction however many events the transaction appended: under
// a steady 5,000 transitions/s the transactions took 100-190 ms and the deliveries recorded
// stopped at 1,400-1,800/s, a third of what was committed (docs/benchmarks.md, "Night quiet
// window"). Twice the appended events lets the outbox keep pace and work off a backlog, while a
// transaction's record part stays in proportion to the part its chunks wait for anyway.
func recordShare(events int) int {
	return max(recordBudget, 2*events)
}

func (g *Group) enqueue(rs ...*groupReq) {
	if g.m != nil || g.observe != nil {
		now := time.Now()
		for _, r := range rs {
			r.at = now
		}
	}
	g.mu.Lock()
	g.pending = append(g.pending, rs...)
	if !g.writing {
		g.writing = true
		go g.write()
	}
	g.mu.Unlock()
}

// Detector returns the detector state stored under key.
func (g *Group) Detector(key string) ([]byte, bool, error) { return g.s.Detector(key) }

// Stats reports how many transactions were written and how many batches they
// held.
func (g *Group) Stats() (txs, batches uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.txs, g.batches
}

func (g *Group) write() {
	for {
		g.mu.Lock()
		reqs := g.takeLocked()
		if len(reqs) == 0 {
			g.writing = false
			g.mu.Unlock()
			return
		}
		g.txs++
		g.batches += uint64(len(reqs))
		g.mu.Unlock()

		bs := make([]Batch, 0, len(reqs))
		var ops []Op
		hasOps := false
		for _, r := range reqs {
			if r.ops != nil {
				ops = append(ops, r.ops...)
				hasOps = true
			} else {
				bs = append(bs, r.b)
			}
		}
		var err error
		var errs []error
		start := time.Now()
		g.m.started(reqs, start)
		if hasOps || g.durable != nil || g.timed() {
			errs, err = g.commitReporting(bs, ops)
		} else {
			err = g.s.CommitBatches(bs)
		}
		handed := time.Now()
		g.m.committed(start)
		if err != nil && len(reqs) > 1 {
			// One batch (or the disk) failed the group: write each alone, so
			// every caller gets its own answer.
			for _, r := range reqs {
				if r.ops != nil {
					r.errs, err = g.s.Record(r.ops)
					r.done <- err
					continue
				}
				if g.durable != nil {
					_, err = g.commitReporting([]Batch{r.b}, nil)
					r.done <- err
					continue
				}
				r.done <- g.s.Commit(r.b)
			}
			continue
		}
		for _, r := range reqs {
			if r.ops != nil && err == nil {
				r.errs, errs = errs[:len(r.ops):len(r.ops)], errs[len(r.ops):]
			}
			r.done <- err
		}
		if err == nil && g.timed() {
			ct := g.timeline(reqs, bs, len(ops), start, handed)
			g.m.parts(ct)
			if g.observe != nil {
				g.observe(ct)
			}
		}
	}
}

// timed says whether the group times its transactions' parts (metrics or an observer).
func (g *Group) timed() bool {
	_, bolt := g.s.(*Bolt)
	return bolt && (g.m != nil || g.observe != nil)
}

// timeline is the CommitTiming of the transaction of reqs the writer took at start, committed and
// handed over at handed, its callers released now.
func (g *Group) timeline(reqs []*groupReq, bs []Batch, ops int, start, handed time.Time) CommitTiming {
	released := time.Now()
	t := &g.timing
	ct := CommitTiming{Batches: len(bs), Ops: ops, Writes: t.written.Sub(start), Commit: t.synced.Sub(t.written),
		Spill: t.spill, Write: t.write, Durable: handed.Sub(t.synced), Release: released.Sub(handed),
		Pages: t.pages, Nodes: t.nodes, Checkpointed: t.moved, Dropped: t.dropped}
	for _, b := range bs {
		ct.Events += len(b.Events)
	}
	for _, r := range reqs {
		ct.Waited = max(ct.Waited, start.Sub(r.at))
	}
	return ct
}

// commitReporting writes bs and ops in one transaction of the OpsCommitter and, once it is
// durable, hands the events it appended to the OnDurable function.
func (g *Group) commitReporting(bs []Batch, ops []Op) ([]error, error) {
	var appended func(Event)
	if g.durable != nil {
		g.appended = g.appended[:0]
		appended = func(e Event) { g.appended = append(g.appended, e) }
	}
	var errs []error
	var err error
	if b, ok := g.s.(*Bolt); ok && g.timed() {
		errs, err = b.commitTimed(bs, ops, appended, &g.timing)
	} else {
		errs, err = g.s.(OpsCommitter).CommitBatchesAndOps(bs, ops, appended)
	}
	if err == nil && len(g.appended) > 0 {
		g.durable(g.appended)
	}
	clear(g.appended) // the bodies are the receiver's now, not the buffer's
	g.appended = g.appended[:0]
	return errs, err
}

// takeLocked takes the requests of the next transaction from pending: every batch, and the
// Record parts in their order up to recordShare ops while a batch is among them (all of them
// otherwise); the parts left stay pending, ahead of what comes next.
func (g *Group) takeLocked() []*groupReq {
	batches, events := false, 0
	for _, r := range g.pending {
		if r.ops == nil {
			batches = true
			events += len(r.b.Events)
		}
	}
	if !batches {
		reqs := g.pending
		g.pending = nil
		return reqs
	}
	share := recordShare(events)
	var take, left []*groupReq
	ops := 0
	for _, r := range g.pending {
		switch {
		case r.ops == nil:
			take = append(take, r)
		case len(left) == 0 && ops+len(r.ops) <= share:
			take = append(take, r)
			ops += len(r.ops)
		default:
			left = append(left, r) // and every part after it, so that the parts keep their order
		}
	}
	g.pending = left
	return take
}

// ForEachDetector calls fn with every detector key and value (Store.ForEachDetector).
func (g *Group) ForEachDetector(fn func(key string, value []byte) error) error {
	return g.s.ForEachDetector(fn)
}
