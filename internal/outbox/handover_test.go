package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// readCounter is the store as the app wires it with bbolt (Record through the group commit),
// counting what the outbox reads back: events returned by PendingAfter (the scan) and by
// PendingEvent (a head's read).
type readCounter struct {
	*store.Bolt
	g *store.Group

	mu      sync.Mutex
	scans   int      // PendingAfter calls
	scanned []string // ids the scans returned
	read    []string // ids PendingEvent returned
}

func (q *readCounter) Record(ops []store.Op) ([]error, error) { return q.g.Record(ops) }

func (q *readCounter) PendingAfter(after uint64, limit int) ([]store.Event, error) {
	evs, err := q.Bolt.PendingAfter(after, limit)
	q.mu.Lock()
	q.scans++
	for _, e := range evs {
		q.scanned = append(q.scanned, e.ID)
	}
	q.mu.Unlock()
	return evs, err
}

func (q *readCounter) PendingEvent(seq uint64, withBody bool) (store.Event, error) {
	e, err := q.Bolt.PendingEvent(seq, withBody)
	if err == nil {
		q.mu.Lock()
		q.read = append(q.read, e.ID)
		q.mu.Unlock()
	}
	return e, err
}

// reads returns how many scans ran, and the ids scanned and read so far.
func (q *readCounter) reads() (scans int, scanned, read []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.scans, slices.Clone(q.scanned), slices.Clone(q.read)
}

// handedHarness is an outbox fed by the group commit's hand-over, as the app wires it with bbolt.
type handedHarness struct {
	st   *store.Bolt
	g    *store.Group
	q    *readCounter
	ob   *Outbox
	logs *syncBuffer
	stop func()
}

// startHanded runs an outbox with HandOver over the store in dir, fed by its group commit, with
// no periodic scan (an hour apart); tune, when not nil, adjusts the outbox before Run.
func startHanded(t *testing.T, dir string, cfg Config, tune func(*Outbox)) *handedHarness {
	t.Helper()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := &handedHarness{st: st, g: store.NewGroup(st), logs: &syncBuffer{}}
	h.q = &readCounter{Bolt: st, g: h.g}
	cfg.HandOver = true
	if cfg.Clock == nil {
		cfg.Clock = (&fakeClock{t: t0}).Now // the events' time: none is past MaxAge
	}
	if cfg.Backoff == nil {
		cfg.Backoff = constBackoff(0)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if cfg.Metrics == nil {
		cfg.Metrics, _ = NewMetrics(prometheus.NewRegistry())
	}
	if h.ob, err = New(h.q, cfg); err != nil {
		t.Fatal(err)
	}
	if !h.g.OnDurable(h.ob.Committed) {
		t.Fatal("the bbolt group refused the hand-over")
	}
	h.ob.handScanEvery = time.Hour
	if tune != nil {
		tune(h.ob)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { h.ob.Run(ctx); close(done) }()
	var once sync.Once
	h.stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(func() { h.stop(); st.Close() })
	// The loop's first turn scans the store (what was pending before it started); events
	// committed after it are the hand-over's.
	eventually(t, "the first scan", func() bool { n, _, _ := h.q.reads(); return n > 0 })
	return h
}

// commit commits evs through the group commit, one batch each, the way the detector's watchers
// do: no Notify (the hand-over wakes the outbox).
func (h *handedHarness) commit(t *testing.T, evs ...store.Event) {
	t.Helper()
	for _, e := range evs {
		if err := h.g.Commit(store.Batch{Events: []store.Event{e}}); err != nil {
			t.Fatal(err)
		}
	}
}

// delivered waits until n events are delivered and nothing is pending.
func (h *handedHarness) delivered(t *testing.T, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d events delivered", n), func() bool {
		p, _, dl, err := h.st.Counts()
		return err == nil && p == 0 && dl == n
	})
}

// held is the bytes of handed-over bodies the outbox still counts against its budget.
func (h *handedHarness) held() int64 { return h.ob.hand.held.Load() }

// streamEvents makes n events on each of the streams, interleaved.
func streamEvents(streams []string, n int) []store.Event {
	var evs []store.Event
	for i := 1; i <= n; i++ {
		for _, s := range streams {
			evs = append(evs, mkEvent(s, i))
		}
	}
	return evs
}

// checkStreams fails unless each named stream's events were accepted once each, in order.
func checkStreams(t *testing.T, rc *receiver, streams []string, n int) {
	t.Helper()
	for _, s := range streams {
		if got := rc.acceptedBy(s); !slices.Equal(got, seq(n)) {
			t.Errorf("stream %s accepted %v, want %v", s, got, seq(n))
		}
	}
}

// TestHandedOverEventsAreNeverReadBack: events committed through the group commit are delivered
// from the hand-over alone — no scan returns them, no head is read from the store — exactly once
// each and in order within their thread, and the budget's bytes all come back.
func TestHandedOverEventsAreNeverReadBack(t *testing.T) {
	rc := newReceiver(t)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, nil)
	streams := []string{"m/a", "m/b", "m/c"}
	h.commit(t, streamEvents(streams, 20)...)
	h.delivered(t, 60)
	checkStreams(t, rc, streams, 20)
	if len(rc.requests()) != 60 {
		t.Errorf("%d requests for 60 events", len(rc.requests()))
	}
	if _, scanned, read := h.q.reads(); len(scanned) != 0 || len(read) != 0 {
		t.Fatalf("handed-over events read back: scanned %v, read %v", scanned, read)
	}
	if n := h.held(); n != 0 {
		t.Fatalf("%d bytes of handed-over bodies still counted after every delivery", n)
	}
}

// TestHandedOverEventsCompletedWithoutReads: events committed with their facts only are completed
// from the hand-over's facts (the head's and those ahead of it), once each, and delivered
// complete, without a read of the store.
func TestHandedOverEventsCompletedWithoutReads(t *testing.T) {
	rc := newReceiver(t)
	en := &fakeEnricher{}
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL, Enricher: en}, nil)
	var evs []store.Event
	for i := 1; i <= 5; i++ {
		evs = append(evs, enrichEvent("m/a", i), enrichEvent("m/b", i))
	}
	h.commit(t, evs...)
	h.delivered(t, len(evs))
	checkStreams(t, rc, []string{"m/a", "m/b"}, 5)
	for _, r := range rc.requests() {
		if !strings.Contains(string(r.Body), `"summary":"done: `+r.ID+`"`) {
			t.Errorf("sent %s", r.Body)
		}
	}
	for _, e := range evs {
		if n := en.count(e.ID); n != 1 {
			t.Errorf("%s completed %d times", e.ID, n)
		}
	}
	if _, scanned, read := h.q.reads(); len(scanned) != 0 || len(read) != 0 {
		t.Fatalf("handed-over events read back: scanned %v, read %v", scanned, read)
	}
}

// TestRestartReadsPendingEventsFromTheStore: after a restart nothing is in memory: the events a
// previous run left pending are read from the store (the fallback) and delivered once each, in
// order, ahead of the new ones, which are the hand-over's and are not read.
func TestRestartReadsPendingEventsFromTheStore(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	// The previous run committed these and died before delivering them.
	old := []store.Event{mkEvent("m/a", 1), mkEvent("m/a", 2), mkEvent("m/a", 3), mkEvent("m/b", 1)}
	if err := store.NewGroup(st).Commit(store.Batch{Events: old}); err != nil {
		t.Fatal(err)
	}
	st.Close()

	rc := newReceiver(t)
	h := startHanded(t, dir, Config{URL: rc.srv.URL}, nil)
	h.commit(t, mkEvent("m/a", 4), mkEvent("m/a", 5), mkEvent("m/b", 2))
	h.delivered(t, 7)
	checkStreams(t, rc, []string{"m/a"}, 5)
	checkStreams(t, rc, []string{"m/b"}, 2)
	_, _, read := h.q.reads()
	slices.Sort(read)
	if want := ids(old); !slices.Equal(read, want) {
		t.Fatalf("read from the store %v, want the previous run's %v only", read, want)
	}
	if n := h.held(); n != 0 {
		t.Fatalf("%d bytes still counted", n)
	}
}

// ids returns the events' ids, sorted.
func ids(evs []store.Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.ID)
	}
	slices.Sort(out)
	return out
}

// TestGapFallsBackToTheStore: an event committed other than through the group commit (no
// hand-over, no Notify) is found by the scan the gap it leaves before the next handed-over event
// asks for, read from the store and delivered; the handed-over event is not read.
func TestGapFallsBackToTheStore(t *testing.T) {
	rc := newReceiver(t)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, nil)
	aside, handed := mkEvent("m/a", 1), mkEvent("m/b", 1)
	if err := h.st.Commit(store.Batch{Events: []store.Event{aside}}); err != nil {
		t.Fatal(err)
	}
	h.commit(t, handed)
	h.delivered(t, 2)
	_, scanned, read := h.q.reads()
	if !slices.Equal(scanned, []string{aside.ID, handed.ID}) || !slices.Equal(read, []string{aside.ID}) {
		t.Fatalf("scanned %v, read %v; want both scanned, %s alone read", scanned, read, aside.ID)
	}
}

// TestEventsCommittedAsideAreFound: with the hand-over on, an event committed other than through
// the group is still found: at once after a Notify, and with no Notify by the periodic scan.
func TestEventsCommittedAsideAreFound(t *testing.T) {
	t.Run("notify", func(t *testing.T) {
		rc := newReceiver(t)
		h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, nil)
		if err := h.st.Commit(store.Batch{Events: []store.Event{mkEvent("m/a", 1)}}); err != nil {
			t.Fatal(err)
		}
		h.ob.Notify()
		h.delivered(t, 1)
	})
	t.Run("periodic", func(t *testing.T) {
		rc := newReceiver(t)
		h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, func(o *Outbox) { o.handScanEvery = time.Millisecond })
		if err := h.st.Commit(store.Batch{Events: []store.Event{mkEvent("m/a", 1)}}); err != nil {
			t.Fatal(err)
		}
		h.delivered(t, 1)
	})
}

// TestHandOverBeyondItsBudgetReadsBodies: with no room in the budget the hand-over carries the
// headers only: the loop still takes the events in without a scan, and reads each body when it
// sends it; order and exactly-once hold. (An event the hand-over sends at once, startHanded, is
// never held: its body goes to the worker, as a held one does when it is sent.)
func TestHandOverBeyondItsBudgetReadsBodies(t *testing.T) {
	rc := newReceiver(t)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, func(o *Outbox) { o.handBudget = 0 })
	streams := []string{"m/a", "m/b"}
	evs := streamEvents(streams, 5)
	h.commit(t, evs...)
	h.delivered(t, len(evs))
	checkStreams(t, rc, streams, 5)
	_, scanned, read := h.q.reads()
	slices.Sort(read)
	started := int(h.ob.handStarts.Load())
	if len(scanned) != 0 || len(slices.Compact(slices.Clone(read))) != len(read) || len(read)+started != len(evs) {
		t.Fatalf("scanned %v (want none), read %v and %d sent from the hand-over (want every other event read once)", scanned, read, started)
	}
}

// TestHandOverDroppedWhenFullIsScanned: events the full hand-over buffer dropped are found by the
// scan the loop makes when it learns of the drop, and delivered in order after the one it took.
func TestHandOverDroppedWhenFullIsScanned(t *testing.T) {
	rc := newReceiver(t)
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL}, func(o *Outbox) { o.handMax = 1 })
	evs := []store.Event{mkEvent("m/a", 1), mkEvent("m/a", 2), mkEvent("m/a", 3)}
	if err := h.g.Commit(store.Batch{Events: evs}); err != nil { // one transaction: two dropped
		t.Fatal(err)
	}
	h.delivered(t, 3)
	checkStreams(t, rc, []string{"m/a"}, 3)
	_, scanned, read := h.q.reads()
	if slices.Contains(read, evs[0].ID) || !slices.Contains(scanned, evs[2].ID) {
		t.Fatalf("scanned %v, read %v: want the dropped ones scanned, the first not read", scanned, read)
	}
	if n := h.held(); n != 0 {
		t.Fatalf("%d bytes still counted", n)
	}
}

// TestHeldBodiesGivenBackAtShutdown: the bodies held for events waiting behind a failing head
// count against the budget while they wait, and all of it is given back when Run returns (a
// next Run of the same outbox starts with the whole budget).
func TestHeldBodiesGivenBackAtShutdown(t *testing.T) {
	rc := newReceiver(t)
	rc.setHandle(func(http.ResponseWriter, *http.Request, request) int { return http.StatusServiceUnavailable })
	h := startHanded(t, t.TempDir(), Config{URL: rc.srv.URL, Backoff: constBackoff(time.Hour)}, nil)
	evs := []store.Event{mkEvent("m/a", 1), mkEvent("m/a", 2), mkEvent("m/a", 3)}
	h.commit(t, evs...)
	waiting := int64(len(evs[1].Body) + len(evs[2].Body))
	eventually(t, "the head attempted, the two behind it held", func() bool {
		return len(rc.requests()) >= 1 && h.held() == waiting
	})
	h.stop()
	if n := h.held(); n != 0 {
		t.Fatalf("%d bytes still counted after Run returned", n)
	}
}
