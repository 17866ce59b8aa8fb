package events

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// gatedReader serves thread t1 with run r1 failed; each read signals started and then waits for
// release (or its context), failing the first failFirst reads.
type gatedReader struct {
	started chan struct{} // one value per read
	release chan struct{} // closed: reads answer
	mu      sync.Mutex
	reads   int
	fail    int
}

func newGatedReader(fail int) *gatedReader {
	return &gatedReader{started: make(chan struct{}, 16), release: make(chan struct{}), fail: fail}
}

func (r *gatedReader) ReadThread(ctx context.Context, _, threadID string) (*t3api.ThreadProjection, error) {
	r.mu.Lock()
	r.reads++
	n := r.reads
	r.mu.Unlock()
	r.started <- struct{}{}
	select {
	case <-r.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if n <= r.fail {
		return nil, errors.New("HTTP 503")
	}
	return &t3api.ThreadProjection{
		Thread: t3api.AppThread{ID: threadID, ProjectId: "p1", Title: "T"},
		Runs:   []t3api.Run{{ID: "r1", ThreadId: threadID, Ordinal: 1, Status: "failed"}},
		TurnItems: []t3api.TurnItem{{ID: "i-err", Type: "error", Ordinal: 1, RunId: t3api.NewOptNilString("r1"),
			Failure: t3api.NewOptFailure(t3api.Failure{Message: "provider quota exceeded"})}},
	}, nil
}

func (r *gatedReader) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reads
}

// commitWhenRead is a Committer whose commits of events wait until a thread read has started:
// a chunk's commit can complete only if the enrichment read runs beside it.
type commitWhenRead struct {
	*store.Group
	started <-chan struct{}
}

func (c commitWhenRead) Commit(b store.Batch) error {
	if len(b.Events) > 0 {
		select {
		case <-c.started:
		case <-time.After(time.Minute): // a failure, not a measurement: no read would ever start
			return errors.New("no enrichment read started beside the commit")
		}
	}
	return c.Group.Commit(b)
}

// prefetchEnv is an env whose detector hands its events to an Enricher's Prefetch, reading
// through r, with RunPrefetch running until the test ends.
func prefetchEnv(t *testing.T, r *gatedReader, run bool) (*env, *Enricher) {
	t.Helper()
	e := newEnv(t, "")
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	en := NewEnricher(r).WithMetrics(m)
	if run {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); en.RunPrefetch(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		waitRunning(en)
	}
	var c Committer = e.g
	if run {
		c = commitWhenRead{e.g, r.started}
	}
	e.d = New(Options{Store: c, Tracked: e.st, Read: ReaderFunc(e.read), Logger: quiet(), Prefetch: en.Prefetch})
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	return e, en
}

// prefetches is the enricher's count of prefetch outcome o.
func prefetches(t *testing.T, en *Enricher, o string) float64 {
	t.Helper()
	var mm dto.Metric
	if err := en.m.prefetch.WithLabelValues(o).Write(&mm); err != nil {
		t.Fatal(err)
	}
	return mm.GetCounter().GetValue()
}

// waitRunning waits until RunPrefetch has taken its context (a condition, not a duration).
func waitRunning(en *Enricher) {
	for {
		en.pre.mu.Lock()
		running := en.pre.ctx != nil
		en.pre.mu.Unlock()
		if running {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// pendingEvent is the one event the store holds.
func (e *env) pendingEvent() store.Event {
	e.t.Helper()
	evs, err := e.st.Pending(10)
	if err != nil || len(evs) != 1 {
		e.t.Fatalf("pending events %v, %v; want one", evs, err)
	}
	return evs[0]
}

// A failed run's event needs its error from T3. Its read starts before the chunk's commit (the
// commit here completes only once a read has started), the chunk's Apply returns while that read
// is still under way (the read holds no Ack), and the outbox's Enrich takes the read's result:
// one read in all, the body complete.
func TestEnrichmentReadRunsBesideTheCommit(t *testing.T) {
	r := newGatedReader(0)
	e, en := prefetchEnv(t, r, true)
	e.apply(row("t1", "failed", "", "r1", "")) // returns: committed while the read waits for release
	ev := e.pendingEvent()
	if !ev.Enrich {
		t.Fatal("the failed run's event was committed complete; want its facts, to be enriched")
	}
	type result struct {
		body []byte
		err  error
	}
	got := make(chan result, 1)
	go func() {
		b, err := en.Enrich(context.Background(), ev)
		got <- result{b, err}
	}()
	close(r.release)
	res := <-got
	if res.err != nil || !strings.Contains(string(res.body), `"error":"provider quota exceeded"`) {
		t.Fatalf("enriched body %s, %v", res.body, res.err)
	}
	if n := r.count(); n != 1 {
		t.Fatalf("%d thread reads, want the prefetch's one", n)
	}
	if used, none := prefetches(t, en, prefetchUsed), prefetches(t, en, prefetchNone); used != 1 || none != 0 {
		t.Fatalf("prefetch outcomes: used %v, none %v; want 1 and 0", used, none)
	}
}

// A prefetch read that failed is not the answer: Enrich reads the thread again (the outbox's
// retries and partial body apply to that read as before).
func TestFailedPrefetchIsReadAgain(t *testing.T) {
	r := newGatedReader(1)
	e, en := prefetchEnv(t, r, true)
	e.apply(row("t1", "failed", "", "r1", ""))
	close(r.release)
	body, err := en.Enrich(context.Background(), e.pendingEvent())
	if err != nil || !strings.Contains(string(body), `"error":"provider quota exceeded"`) {
		t.Fatalf("enriched body %s, %v", body, err)
	}
	if n := r.count(); n != 2 {
		t.Fatalf("%d thread reads, want 2 (the failed prefetch and Enrich's)", n)
	}
	if failed := prefetches(t, en, prefetchFailed); failed != 1 {
		t.Fatalf("prefetch outcome failed counted %v times, want 1", failed)
	}
}

// Without RunPrefetch (or after it ended) nothing is read ahead: Enrich reads, as before.
func TestNoPrefetchWithoutRun(t *testing.T) {
	r := newGatedReader(0)
	close(r.release)
	e, en := prefetchEnv(t, r, false)
	e.apply(row("t1", "failed", "", "r1", ""))
	if n := r.count(); n != 0 {
		t.Fatalf("%d reads before Enrich without RunPrefetch", n)
	}
	body, err := en.Enrich(context.Background(), e.pendingEvent())
	if err != nil || !strings.Contains(string(body), "provider quota exceeded") || r.count() != 1 {
		t.Fatalf("enriched body %s, %v after %d reads", body, err, r.count())
	}
	if none := prefetches(t, en, prefetchNone); none != 1 {
		t.Fatalf("prefetch outcome none counted %v times, want 1", none)
	}
}

// A read that hangs ends with RunPrefetch's context: RunPrefetch returns once it has (goleak
// checks that no goroutine is left).
func TestPrefetchEndsWithItsContext(t *testing.T) {
	r := newGatedReader(0)
	en := NewEnricher(r)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); en.RunPrefetch(ctx) }()
	waitRunning(en)
	b, _, err := render(Transition{ID: "evt_1", Machine: "m", ThreadID: "t1", RunID: "r1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	en.Prefetch(store.Event{ID: "evt_1", Stream: "m/t1", Body: b, Enrich: true})
	<-r.started // under way, and never released
	cancel()
	<-done
	if f := en.pre.take("evt_1"); f != nil {
		t.Fatal("a result kept after RunPrefetch ended")
	}
}

// A result nobody takes (the event was stored already, a fenced commit) is dropped after
// prefetchKeep, at the next Prefetch, and counted; its event's Enrich then reads the thread.
func TestUnclaimedPrefetchIsDropped(t *testing.T) {
	r := newGatedReader(0)
	close(r.release)
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	en := NewEnricher(r).WithMetrics(m)
	var mu sync.Mutex
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	en.pre.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); en.RunPrefetch(ctx) }()
	defer func() { cancel(); <-done }()
	waitRunning(en)
	event := func(id string) store.Event {
		b, _, err := render(Transition{ID: id, Machine: "m", ThreadID: "t1", RunID: "r1"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return store.Event{ID: id, Stream: "m/t1", Body: b, Enrich: true}
	}
	en.Prefetch(event("evt_1"))
	<-r.started
	for { // the read answered: its result is held
		en.pre.mu.Lock()
		f := en.pre.m["evt_1"]
		en.pre.mu.Unlock()
		if f == nil {
			t.Fatal("evt_1's prefetch is not held")
		}
		select {
		case <-f.done:
		default:
			time.Sleep(time.Millisecond)
			continue
		}
		break
	}
	mu.Lock()
	now = now.Add(prefetchKeep)
	mu.Unlock()
	en.Prefetch(event("evt_2")) // sweeps
	<-r.started
	if dropped := prefetches(t, en, prefetchDropped); dropped != 1 {
		t.Fatalf("dropped %v, want 1", dropped)
	}
	if _, err := en.Enrich(context.Background(), event("evt_1")); err != nil {
		t.Fatal(err)
	}
	if none := prefetches(t, en, prefetchNone); none != 1 || r.count() != 3 {
		t.Fatalf("Enrich of the dropped one: none %v, %d reads; want 1 and 3", none, r.count())
	}
}
