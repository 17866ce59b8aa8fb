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
// becomes the writer, takes every pending batch, writes them, releases their
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
	CommitBatchesAndOps(bs []Batch, ops []Op) (errs []error, err error)
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
	r := &groupReq{ops: ops, done: make(chan error, 1)}
	g.enqueue(r)
	err := <-r.done
	if err != nil {
		return nil, err
	}
	return r.errs, nil
}

func (g *Group) enqueue(r *groupReq) {
	if g.m != nil {
		r.at = time.Now()
	}
	g.mu.Lock()
	g.pending = append(g.pending, r)
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
		reqs := g.pending
		g.pending = nil
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
		if hasOps {
			errs, err = g.s.(OpsCommitter).CommitBatchesAndOps(bs, ops)
		} else {
			err = g.s.CommitBatches(bs)
		}
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
	}
}

// ForEachDetector calls fn with every detector key and value (Store.ForEachDetector).
func (g *Group) ForEachDetector(fn func(key string, value []byte) error) error {
	return g.s.ForEachDetector(fn)
}
