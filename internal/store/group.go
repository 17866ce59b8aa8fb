package store

import "sync"

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
}

type groupReq struct {
	b    Batch
	done chan error
}

// NewGroup returns the group committer of s. A store should have one (more
// would only split the groups).
func NewGroup(s Store) *Group { return &Group{s: s} }

// Commit writes b, grouped with the batches of other callers, and returns when
// it is durable. A batch that fails on its own (an invalid event) fails alone:
// the others are written without it.
func (g *Group) Commit(b Batch) error {
	if err := validate(b); err != nil {
		return err
	}
	r := &groupReq{b: b, done: make(chan error, 1)}
	g.mu.Lock()
	g.pending = append(g.pending, r)
	if !g.writing {
		g.writing = true
		go g.write()
	}
	g.mu.Unlock()
	return <-r.done
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

		bs := make([]Batch, len(reqs))
		for i, r := range reqs {
			bs[i] = r.b
		}
		err := g.s.CommitBatches(bs)
		if err != nil && len(reqs) > 1 {
			// One batch (or the disk) failed the group: write each alone, so
			// every caller gets its own answer.
			for _, r := range reqs {
				r.done <- g.s.Commit(r.b)
			}
			continue
		}
		for _, r := range reqs {
			r.done <- err
		}
	}
}

// ForEachDetector calls fn with every detector key and value (Store.ForEachDetector).
func (g *Group) ForEachDetector(fn func(key string, value []byte) error) error {
	return g.s.ForEachDetector(fn)
}
