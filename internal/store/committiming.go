package store

import (
	"reflect"
	"time"

	bolt "go.etcd.io/bbolt"
)

// CommitTiming is one group transaction taken apart, exactly (Group.ObserveCommits): where the
// time between the writer taking its requests and their callers' release went, and what the
// transaction wrote. It is for benchmarks and measurements (docs/benchmarks.md, "the group
// commit's timeline"); the connector does not observe it.
type CommitTiming struct {
	// Batches and Ops are the requests the transaction held (chunks' batches, the outbox's
	// record ops); Events the events it appended.
	Batches, Ops, Events int
	// Waited is how long the oldest request waited before the writer took it.
	Waited time.Duration
	// Writes: the writer took the requests → the transaction's puts and deletes done (the
	// batches, the ops, the journals' checkpoint slices), before bbolt's Commit.
	Writes time.Duration
	// Commit: bbolt's Commit, until the data is durable: Spill (the dirty nodes written into
	// pages), Write (the pages' pwrites, the meta page's and the two fdatasyncs) and the rest
	// (rebalance, the freelist, a file's growth).
	Commit, Spill, Write time.Duration
	// Durable: bbolt's Commit returned → the journals' overlays and the counts applied and the
	// appended events handed over (OnDurable).
	Durable time.Duration
	// Release: → every request's caller released (each Commit's and Record's return).
	Release time.Duration
	// Checkpointed is the journals' keys (detector states, event ids) the transaction moved
	// into their buckets (detjournal.go's checkpoint), Dropped the dead journal records it deleted.
	Checkpointed, Dropped int
	// Pages is the pages the transaction wrote (bbolt's TxStats.Write: each dirty node spilled
	// into a page and pwritten, the freelist's, the meta page).
	Pages int
	// Nodes is the dirty nodes (leaf and branch pages materialised for writing) per bucket when
	// the writes were done, "" for the root (the buckets' headers); before a node's split at spill.
	Nodes map[string]int
}

// ObserveCommits makes g call fn with the timing of each transaction it writes, on the writer's
// goroutine once the transaction's callers are released (fn must be quick and must not call g).
// Timing works only on the bbolt store (the Commit parts and the pages, by bbolt's statistics); it
// reports false otherwise. Set it before the first Commit; it costs a dirty-node count per
// transaction, so it is for benchmarks and measurements.
func (g *Group) ObserveCommits(fn func(CommitTiming)) bool {
	if _, ok := g.s.(*Bolt); !ok {
		return false
	}
	g.observe = fn
	g.timing.countNodes = true
	return true
}

// txTiming is what Bolt.update measures of one transaction for CommitTiming and the group's
// metrics.
type txTiming struct {
	written, synced time.Time
	spill, write    time.Duration
	pages           int
	moved, dropped  int
	// countNodes asks for nodes (a walk of the transaction's buckets: ObserveCommits only).
	countNodes bool
	nodes      map[string]int
}

// measure notes, at the end of the transaction's writes, the time (and the dirty nodes per bucket
// when asked), and has the commit's end and bbolt's statistics noted once it is durable.
func (t *txTiming) measure(tx *bolt.Tx) {
	t.nodes = nil
	if t.countNodes {
		t.nodes = map[string]int{"": dirtyNodes(tx.Cursor().Bucket())}
		_ = tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			if n := dirtyNodes(b); n > 0 {
				t.nodes[string(name)] = n
			}
			return nil
		})
	}
	t.synced = time.Time{}
	tx.OnCommit(func() {
		t.synced = time.Now()
		st := tx.Stats()
		t.spill, t.write, t.pages = st.GetSpillTime(), st.GetWriteTime(), int(st.GetWrite())
	})
	t.written = time.Now()
}

// dirtyNodes is how many nodes bbolt has materialised for writing in b in this transaction (its
// unexported node cache: a node is read into it only by a put or a delete on its page or below).
func dirtyNodes(b *bolt.Bucket) int {
	v := reflect.ValueOf(b).Elem().FieldByName("nodes")
	if !v.IsValid() || v.Kind() != reflect.Map {
		return 0
	}
	return v.Len()
}
