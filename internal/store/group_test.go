package store

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestGroupFailsABatchAlone: batches waiting for the same commit are written in one
// transaction, and when one of them cannot be written the others are still written and only its
// caller gets the error.
func TestGroupFailsABatchAlone(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(s)

	first := make(chan error, 1)
	release := holdWriter(t, s, g, func() { first <- g.Commit(Batch{Events: []Event{ev("g1", "a")}}) })
	good, bad := make(chan error, 1), make(chan error, 1)
	go func() { good <- g.Commit(Batch{Events: []Event{ev("g2", "b")}}) }()
	// bbolt: key too large (an empty key would be refused before the group, by validate).
	go func() {
		bad <- g.Commit(Batch{Detector: map[string][]byte{strings.Repeat("k", bolt.MaxKeySize+1): []byte("x")}})
	}()
	waitPending(g, 2)
	release()

	if err := <-first; err != nil {
		t.Fatalf("first batch: %v", err)
	}
	if err := <-good; err != nil {
		t.Fatalf("a good batch grouped with a failing one: %v", err)
	}
	if err := <-bad; err == nil {
		t.Fatal("a batch with a too large detector key was written")
	}
	if e, err := s.Get("g2"); err != nil || e.Stream != "b" {
		t.Fatalf("g2 after the group: %+v %v", e, err)
	}
	if txs, batches := g.Stats(); txs != 2 || batches != 3 {
		t.Fatalf("Stats = %d transactions, %d batches; want 2, 3 (the last two grouped)", txs, batches)
	}
}

// holdWriter holds bbolt's writer lock until the returned release is called, once the group's
// writer has taken the first request and waits for the lock: requests made meanwhile queue up
// and go into the group's next transaction together.
func holdWriter(t *testing.T, s *Bolt, g *Group, first func()) (release func()) {
	t.Helper()
	tx, err := s.db.Begin(true)
	if err != nil {
		t.Fatal(err)
	}
	go first()
	for {
		g.mu.Lock()
		taken := g.writing && len(g.pending) == 0
		g.mu.Unlock()
		if taken {
			break
		}
		runtime.Gosched()
	}
	return func() {
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
	}
}

func waitPending(g *Group, n int) {
	for {
		g.mu.Lock()
		p := len(g.pending)
		g.mu.Unlock()
		if p >= n {
			return
		}
		runtime.Gosched()
	}
}

// TestGroupRecordSharesTheTransaction: the outbox's records (Group.Record) and the detector's
// batches waiting together are written in one transaction, and each op's own result comes back
// to its caller at its index (an unknown id is skipped and reported, the rest applied).
func TestGroupRecordSharesTheTransaction(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(s)
	if !g.SharesRecords() {
		t.Fatal("the bbolt store does not share records")
	}
	if err := s.Commit(Batch{Events: []Event{ev("r1", "a"), ev("r2", "b")}}); err != nil {
		t.Fatal(err)
	}
	first := make(chan error, 1)
	release := holdWriter(t, s, g, func() { first <- g.Commit(Batch{Events: []Event{ev("c1", "c")}}) })
	rec := make(chan recorded, 1)
	go func() {
		errs, err := g.Record([]Op{{ID: "r1", Kind: OpDelivered, At: t0}, {ID: "nope", Kind: OpDelivered, At: t0}, {ID: "r2", Kind: OpRetry, Next: t0, Error: "HTTP 503"}})
		rec <- recorded{errs, err}
	}()
	committed := make(chan error, 1)
	go func() { committed <- g.Commit(Batch{Events: []Event{ev("c2", "d")}}) }()
	waitPending(g, 2)
	release()

	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	r := <-rec
	if r.err != nil || len(r.errs) != 3 || r.errs[0] != nil || !errors.Is(r.errs[1], ErrNotFound) || r.errs[2] != nil {
		t.Fatalf("Record = %v %v", r.errs, r.err)
	}
	if e, _ := s.Get("r1"); e.State != StateDelivered {
		t.Fatalf("r1 = %+v", e)
	}
	if e, _ := s.Get("r2"); e.State != StatePending || e.Attempts != 1 || e.LastError != "HTTP 503" {
		t.Fatalf("r2 = %+v", e)
	}
	if _, err := s.Get("c2"); err != nil {
		t.Fatal(err)
	}
	if txs, batches := g.Stats(); txs != 2 || batches != 3 {
		t.Fatalf("Stats = %d transactions, %d requests; want 2, 3 (the record and the last batch grouped)", txs, batches)
	}
	if p, _, d, _ := s.Counts(); p != 3 || d != 1 {
		t.Fatalf("Counts: %d pending, %d delivered", p, d)
	}
}

// recorded is what a Group.Record returned.
type recorded struct {
	errs []error
	err  error
}

// onlyStore hides the bbolt store's OpsCommitter.
type onlyStore struct{ Store }

// TestGroupRecordAloneWithoutOpsCommitter: a store that cannot apply ops with batches (the
// PostgreSQL one) records through its own Record.
func TestGroupRecordAloneWithoutOpsCommitter(t *testing.T) {
	s := open(t, t.TempDir())
	g := NewGroup(onlyStore{s})
	if g.SharesRecords() {
		t.Fatal("SharesRecords on a store without CommitBatchesAndOps")
	}
	if err := s.Commit(Batch{Events: []Event{ev("r1", "a")}}); err != nil {
		t.Fatal(err)
	}
	errs, err := g.Record([]Op{{ID: "r1", Kind: OpDelivered, At: t0}})
	if err != nil || len(errs) != 1 || errs[0] != nil {
		t.Fatalf("Record = %v %v", errs, err)
	}
	if txs, _ := g.Stats(); txs != 0 {
		t.Fatalf("the group wrote %d transactions for a record it does not share", txs)
	}
}

// txLog is the bbolt store with the composition of every CommitBatchesAndOps logged.
type txLog struct {
	*Bolt
	mu  sync.Mutex
	txs [][2]int // batches, ops
}

func (l *txLog) CommitBatchesAndOps(bs []Batch, ops []Op, appended func(Event)) ([]error, error) {
	l.mu.Lock()
	l.txs = append(l.txs, [2]int{len(bs), len(ops)})
	l.mu.Unlock()
	return l.Bolt.CommitBatchesAndOps(bs, ops, appended)
}

// TestGroupRecordYieldsToBatches: a chunk's batch waiting beside a large Record goes into a
// transaction with at most recordBudget of its ops; the rest follow in the next one (no batch
// waits then: all of them), and the caller gets every op's result at its index.
func TestGroupRecordYieldsToBatches(t *testing.T) {
	s := open(t, t.TempDir())
	l := &txLog{Bolt: s}
	g := NewGroup(l)
	const n = 600 // five parts: 4 × recordPart + 88
	var evs []Event
	ops := make([]Op, n)
	for i := range ops {
		id := fmt.Sprintf("y%03d", i)
		evs = append(evs, ev(id, "s"+id))
		ops[i] = Op{ID: id, Kind: OpDelivered, At: t0}
	}
	ops[400].ID = "nope" // in the third transaction's share: reported at its index
	if err := s.Commit(Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	r := recordBesideBatch(t, s, g, ops, []Event{ev("c2", "d")})
	if r.err != nil || len(r.errs) != n {
		t.Fatalf("Record = %d results, %v", len(r.errs), r.err)
	}
	for i, err := range r.errs {
		if (i == 400) != (err != nil) || (i == 400 && !errors.Is(err, ErrNotFound)) {
			t.Fatalf("result %d = %v", i, err)
		}
	}
	l.mu.Lock()
	got := fmt.Sprint(l.txs)
	l.mu.Unlock()
	if want := fmt.Sprint([][2]int{{1, 2 * recordPart}, {0, n - 2*recordPart}}); got != want {
		t.Fatalf("transactions (batches, ops) = %s, want %s", got, want)
	}
	if p, _, d, _ := s.Counts(); p != 3 || d != n-1 {
		t.Fatalf("Counts: %d pending, %d delivered", p, d)
	}
}

// A transaction whose batches append many events takes as many more record ops (recordShare):
// with a fixed budget the deliveries recorded per transaction stayed at recordBudget however
// many events each transaction appended, and fell behind the commits under a steady load.
func TestGroupRecordKeepsPaceWithTheEventsAppended(t *testing.T) {
	s := open(t, t.TempDir())
	l := &txLog{Bolt: s}
	g := NewGroup(l)
	const n = 900 // eight parts: 7 × recordPart + 4
	var evs []Event
	ops := make([]Op, n)
	for i := range ops {
		id := fmt.Sprintf("k%03d", i)
		evs = append(evs, ev(id, "s"+id))
		ops[i] = Op{ID: id, Kind: OpDelivered, At: t0}
	}
	if err := s.Commit(Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	const appended = 300 // recordShare(300) = 600: four parts (512 ops) fit, the fifth does not
	var batch []Event
	for i := range appended {
		id := fmt.Sprintf("a%03d", i)
		batch = append(batch, ev(id, "t"+id))
	}
	r := recordBesideBatch(t, s, g, ops, batch)
	if r.err != nil || len(r.errs) != n {
		t.Fatalf("Record = %d results, %v", len(r.errs), r.err)
	}
	for i, err := range r.errs {
		if err != nil {
			t.Fatalf("result %d = %v", i, err)
		}
	}
	l.mu.Lock()
	got := fmt.Sprint(l.txs)
	l.mu.Unlock()
	if want := fmt.Sprint([][2]int{{1, 4 * recordPart}, {0, n - 4*recordPart}}); got != want {
		t.Fatalf("transactions (batches, ops) = %s, want %s", got, want)
	}
	if p, _, d, _ := s.Counts(); p != 1+appended || d != n {
		t.Fatalf("Counts: %d pending, %d delivered", p, d)
	}
}

// recordBesideBatch holds the group's writer on a commit of event c1, queues Record(ops) (in
// its parts) and then a commit of batch behind it, releases the writer, and returns Record's
// answer once both are done.
func recordBesideBatch(t *testing.T, s *Bolt, g *Group, ops []Op, batch []Event) recorded {
	t.Helper()
	parts := (len(ops) + recordPart - 1) / recordPart
	first := make(chan error, 1)
	release := holdWriter(t, s, g, func() { first <- g.Commit(Batch{Events: []Event{ev("c1", "c")}}) })
	rec := make(chan recorded, 1)
	go func() {
		errs, err := g.Record(ops)
		rec <- recorded{errs, err}
	}()
	waitPending(g, parts)
	committed := make(chan error, 1)
	go func() { committed <- g.Commit(Batch{Events: batch}) }()
	waitPending(g, parts+1)
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	return <-rec
}
