package outbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// inflightGauge counts the receiver's concurrent requests, overall and per stream.
type inflightGauge struct {
	mu         sync.Mutex
	cur, peak  int
	perStream  map[string]int
	streamPeak int
}

func (g *inflightGauge) enter(stream string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.perStream == nil {
		g.perStream = map[string]int{}
	}
	g.cur++
	g.peak = max(g.peak, g.cur)
	g.perStream[stream]++
	g.streamPeak = max(g.streamPeak, g.perStream[stream])
}

func (g *inflightGauge) leave(stream string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cur--
	g.perStream[stream]--
}

func (g *inflightGauge) get() (cur, peak, streamPeak int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cur, g.peak, g.streamPeak
}

func backlog(streams, perStream int) []store.Event {
	var evs []store.Event
	for n := 1; n <= perStream; n++ {
		for s := range streams {
			evs = append(evs, mkEvent(fmt.Sprintf("m/t%04d", s), n))
		}
	}
	return evs
}

// checkOrder fails unless every stream's events were accepted exactly once each, in order.
func checkOrder(t *testing.T, rc *receiver, streams, perStream int) {
	t.Helper()
	for s := range streams {
		name := fmt.Sprintf("m/t%04d", s)
		if got := rc.acceptedBy(name); !reflect.DeepEqual(got, seq(perStream)) {
			t.Fatalf("stream %s arrived as %v", name, got)
		}
	}
}

// Many streams at once: several are delivered in parallel, never two events of one stream, and
// each stream's events arrive in order.
func TestParallelDeliveryKeepsPerThreadOrder(t *testing.T) {
	rc := newReceiver(t)
	var g inflightGauge
	rc.setHandle(func(_ http.ResponseWriter, _ *http.Request, req request) int {
		g.enter(req.Stream)
		defer g.leave(req.Stream)
		return http.StatusNoContent
	})
	h := start(t, Config{URL: rc.srv.URL, Concurrency: 8})
	const streams, per = 60, 8
	h.commit(t, backlog(streams, per)...)
	eventually(t, "all delivered", func() bool { p, _, dl := h.counts(); return p == 0 && dl == streams*per })
	checkOrder(t, rc, streams, per)
	if _, peak, streamPeak := g.get(); peak > 8 || streamPeak != 1 {
		t.Fatalf("peak in flight %d (limit 8), per stream %d (want 1)", peak, streamPeak)
	}
	if n := len(rc.requests()); n != streams*per {
		t.Fatalf("%d requests for %d events", n, streams*per)
	}
}

// The limit on requests in flight holds, and is reached: the receiver holds every request until
// as many as the limit are waiting.
func TestConcurrencyLimit(t *testing.T) {
	rc := newReceiver(t)
	var g inflightGauge
	gate := make(chan struct{})
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, req request) int {
		g.enter(req.Stream)
		defer g.leave(req.Stream)
		select {
		case <-gate:
		case <-r.Context().Done():
		}
		return http.StatusOK
	})
	const limit = 5
	h := start(t, Config{URL: rc.srv.URL, Concurrency: limit})
	h.commit(t, backlog(40, 2)...)
	eventually(t, "the limit in flight", func() bool { cur, _, _ := g.get(); return cur == limit })
	close(gate)
	eventually(t, "all delivered", func() bool { _, _, dl := h.counts(); return dl == 80 })
	if _, peak, streamPeak := g.get(); peak != limit || streamPeak != 1 {
		t.Fatalf("peak in flight = %d, want %d; per stream %d", peak, limit, streamPeak)
	}
	checkOrder(t, rc, 40, 2)
}

// One thread's receiver never answers (until the test ends): every other thread's backlog
// drains meanwhile, and the hung thread's later events are not sent.
func TestHungReceiverForOneThreadDoesNotHoldOthers(t *testing.T) {
	rc := newReceiver(t)
	release := make(chan struct{})
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, req request) int {
		if req.Stream == "m/t0000" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		return http.StatusOK
	})
	h := start(t, Config{URL: rc.srv.URL, Concurrency: 4})
	const streams, per = 100, 5
	h.commit(t, backlog(streams, per)...)
	eventually(t, "every other thread delivered", func() bool { _, _, dl := h.counts(); return dl == (streams-1)*per })
	for _, r := range rc.requests() {
		if r.Stream == "m/t0000" && r.N != 1 {
			t.Fatalf("event %d of the hung thread sent while event 1 hangs", r.N)
		}
	}
	close(release)
	eventually(t, "the hung thread delivered", func() bool { _, _, dl := h.counts(); return dl == streams*per })
	checkOrder(t, rc, streams, per)
}

// A backlog of 20,000 events over 2,000 threads drains completely, in order per thread (4,000
// over 2,000 under the race detector).
func TestLargeBacklogDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 deliveries")
	}
	rc := newReceiver(t)
	dir := t.TempDir()
	streams, per := 2000, 10
	if raceEnabled {
		per = 2
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	evs := backlog(streams, per)
	for i := 0; i < len(evs); i += 1000 {
		if err := st.Commit(store.Batch{Events: evs[i:min(i+1000, len(evs))]}); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()
	// An attempt that outlasts its Timeout is sent again (at least once: the receiver dedupes by
	// webhook-id), which this test's count of requests would take for a double delivery; on a
	// starved machine under the race detector one of 4,000 requests took more than the default
	// 10 s (CI-like run: "stream m/t0020 arrived as [1 1 2]"). The timeout is not tested here.
	h := startOn(t, dir, Config{URL: rc.srv.URL, Timeout: 5 * time.Minute}, nil)
	// A safety net only (this machine may be loaded, and -race slows every request).
	eventuallyWithin(t, 5*time.Minute, "the backlog drained", func() bool { p, _, dl := h.counts(); return p == 0 && dl == streams*per })
	checkOrder(t, rc, streams, per)
	if n := len(rc.requests()); n != streams*per {
		t.Fatalf("%d requests for %d events", n, streams*per)
	}
	if v := value(h.m.recordBatch); v >= float64(streams*per) {
		t.Fatalf("%v record transactions for %d outcomes: no group commit", v, streams*per)
	}
}

// The counts (/healthz, gauges) are right after a restart and after a dead-letter requeue.
func TestCountsAfterRestartAndRequeue(t *testing.T) {
	rc := newReceiver(t)
	var reject atomic.Bool
	reject.Store(true)
	rc.setHandle(func(_ http.ResponseWriter, _ *http.Request, req request) int {
		if reject.Load() && req.N == 1 {
			return http.StatusBadRequest
		}
		return http.StatusOK
	})
	dir := t.TempDir()
	h := startOn(t, dir, Config{URL: rc.srv.URL}, nil)
	h.commit(t, backlog(3, 2)...) // event 1 of each stream dies, event 2 is delivered
	eventually(t, "first run settled", func() bool { p, d, dl := h.counts(); return p == 0 && d == 3 && dl == 3 })
	eventually(t, "gauges", func() bool { return value(h.m.dead) == 3 && value(h.m.pending) == 0 })
	h.stop()
	h.st.Close()

	reject.Store(false)
	h = startOn(t, dir, Config{URL: rc.srv.URL}, nil)
	if p, d, dl := h.counts(); p != 0 || d != 3 || dl != 3 {
		t.Fatalf("after restart: %d %d %d", p, d, dl)
	}
	eventually(t, "gauges after restart", func() bool { return value(h.m.dead) == 3 })
	// Requeued as `t3code-mcp dead-letters retry` does: in the store, while no outbox runs.
	h.stop()
	if n, err := h.st.Requeue(t0); n != 3 || err != nil {
		t.Fatalf("Requeue = %d %v", n, err)
	}
	h.st.Close()
	h = startOn(t, dir, Config{URL: rc.srv.URL}, nil)
	eventually(t, "requeued delivered", func() bool { p, d, dl := h.counts(); return p == 0 && d == 0 && dl == 6 })
	eventually(t, "gauges after requeue", func() bool { return value(h.m.dead) == 0 && value(h.m.pending) == 0 })
}

// crashingQueue makes Record "crash" from its n-th call on: the batch never becomes durable and
// the call only returns (with an error) once the test releases it, as if the process had died
// in the middle of the fsync.
type crashingQueue struct {
	store.Store
	n       atomic.Int32
	crashAt int32
	crashed chan struct{}
	release chan struct{}
	once    sync.Once
}

var errCrashed = errors.New("crashed")

func (q *crashingQueue) Record(ops []store.Op) ([]error, error) {
	if q.n.Add(1) >= q.crashAt {
		q.once.Do(func() { close(q.crashed) })
		<-q.release
		return nil, errCrashed
	}
	return q.Store.Record(ops)
}

// Outcomes recorded in batches survive a crash: after a restart nothing recorded as delivered is
// sent again; only events of the batch being written when the process died (and those never
// attempted) are, with the same webhook-id.
func TestBatchedRecordsSurviveCrash(t *testing.T) {
	rc := newReceiver(t)
	dir := t.TempDir()
	q := &crashingQueue{crashAt: 4, crashed: make(chan struct{}), release: make(chan struct{})}
	h := startOn(t, dir, Config{URL: rc.srv.URL, Concurrency: 8}, func(st store.Store) Queue { q.Store = st; return q })
	const streams, per = 30, 4
	h.commit(t, backlog(streams, per)...)
	<-q.crashed
	// The "dead" process delivers nothing more: wait until its workers are all stuck on the
	// recorder, then stop it.
	firstRun := func() map[string]int {
		got := map[string]int{}
		for _, r := range rc.requests() {
			got[r.ID]++
		}
		return got
	}
	close(q.release)
	h.stop()
	sentBefore := firstRun()
	durable, _ := h.st.Pending(0)
	pendingAfterCrash := map[string]bool{}
	for _, e := range durable {
		pendingAfterCrash[e.ID] = true
	}
	h.st.Close()
	if len(pendingAfterCrash) == 0 || len(pendingAfterCrash) == streams*per {
		t.Fatalf("%d pending after the crash: the test did not crash mid-drain", len(pendingAfterCrash))
	}

	rc2 := newReceiver(t)
	h2 := startOn(t, dir, Config{URL: rc2.srv.URL}, nil)
	eventually(t, "drained after restart", func() bool { p, _, dl := h2.counts(); return p == 0 && dl == streams*per })
	for _, r := range rc2.requests() {
		if !pendingAfterCrash[r.ID] {
			t.Fatalf("%s was recorded delivered before the crash and sent again", r.ID)
		}
	}
	resent := 0
	for _, r := range rc2.requests() {
		if sentBefore[r.ID] > 0 {
			resent++ // an unrecorded delivery: sent once more, same webhook-id
		}
	}
	// Unrecorded at the crash: the batch being written and the outcomes waiting for it — at most
	// one per stream, since a stream's next event waits for its previous one's record (and never
	// more than maxUnrecorded).
	if resent > min(streams, maxUnrecorded) {
		t.Fatalf("%d events sent again: more than could be waiting for their record", resent)
	}
	t.Logf("%d of %d events sent again after the crash", resent, streams*per)
	// Order holds across the crash: per stream, the first run's accepted events and the
	// second run's continue each other.
	for s := range streams {
		name := fmt.Sprintf("m/t%04d", s)
		var ns []int
		for _, n := range append(rc.acceptedBy(name), rc2.acceptedBy(name)...) {
			if len(ns) == 0 || n != ns[len(ns)-1] { // a resent event repeats the last one
				ns = append(ns, n)
			}
		}
		if !reflect.DeepEqual(ns, seq(per)) {
			t.Fatalf("stream %s: %v", name, ns)
		}
	}
}

// failingQueue fails Record n times (a full disk), then works.
type failingQueue struct {
	store.Store
	fails atomic.Int32
}

func (q *failingQueue) Record(ops []store.Op) ([]error, error) {
	if q.fails.Add(-1) >= 0 {
		return nil, errors.New("write t3code-mcp.db: no space left on device")
	}
	return q.Store.Record(ops)
}

// When the outcome cannot be recorded the event stays pending and is sent again, after a pause,
// not in a hot loop.
func TestRecordFailurePausesAndResends(t *testing.T) {
	rc := newReceiver(t)
	q := &failingQueue{}
	q.fails.Store(2)
	h := startOn(t, t.TempDir(), Config{URL: rc.srv.URL}, func(st store.Store) Queue { q.Store = st; return q })
	e := mkEvent("m/a", 1)
	h.commit(t, e)
	eventually(t, "delivered", func() bool { return h.event(t, e.ID).State == store.StateDelivered })
	if n := len(rc.requests()); n != 3 {
		t.Fatalf("%d requests: want 3 (two unrecorded, one recorded)", n)
	}
	for _, r := range rc.requests() {
		if r.ID != e.ID {
			t.Fatalf("webhook-id %s", r.ID)
		}
	}
	if !strings.Contains(h.logs.String(), "outbox: recording the attempt") {
		t.Fatal("the failure is not logged")
	}
}

// After an outage of the receiver (every thread failing), the first success wakes every thread
// waiting for a retry: the backlog drains without waiting out the backoff (an hour here, on a
// clock that does not move).
func TestOutageEndsWakesWaitingThreads(t *testing.T) {
	rc := newReceiver(t)
	var down atomic.Bool
	down.Store(true)
	rc.setHandle(func(http.ResponseWriter, *http.Request, request) int {
		if down.Load() {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	h := start(t, Config{URL: rc.srv.URL, Backoff: constBackoff(time.Hour), Concurrency: 4})
	const streams, per = 20, 3
	h.commit(t, backlog(streams, per)...)
	eventually(t, "every thread failed once", func() bool { return value(h.m.retries.WithLabelValues(causeReceiver)) == streams })
	down.Store(false)
	// A new thread's first event is attempted at once and succeeds: the receiver is back.
	h.commit(t, mkEvent("m/new", 1))
	eventually(t, "the backlog drained", func() bool { p, _, _ := h.counts(); return p == 0 })
	checkOrder(t, rc, streams, per)
	if !strings.Contains(h.logs.String(), "the receiver answers again") {
		t.Fatal("the end of the outage is not logged")
	}
}

// One thread failing among working ones is no outage: its retry keeps its backoff.
func TestOneFailingThreadKeepsItsBackoff(t *testing.T) {
	rc := newReceiver(t)
	rc.setHandle(func(_ http.ResponseWriter, _ *http.Request, req request) int {
		if req.Stream == "m/t0000" {
			return http.StatusInternalServerError
		}
		return http.StatusNoContent
	})
	h := start(t, Config{URL: rc.srv.URL, Backoff: constBackoff(time.Hour), Concurrency: 2})
	h.commit(t, backlog(30, 2)...)
	eventually(t, "the others delivered", func() bool { _, _, dl := h.counts(); return dl == 29*2 })
	n := 0
	for _, r := range rc.requests() {
		if r.Stream == "m/t0000" {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("the failing thread was tried %d times within its hour of backoff", n)
	}
}

// heldRecords is a store whose Record waits until release is closed: a record queued behind a
// long group commit (the detector's transactions under a heavy commit load).
type heldRecords struct {
	store.Store
	release chan struct{}
}

func (q heldRecords) Record(ops []store.Op) ([]error, error) {
	<-q.release
	return q.Store.Record(ops)
}

// TestSlowRecordDoesNotHoldBackRequests: while the outbox's records wait for a slow commit, the
// request slots keep working through the other threads (a worker hands its outcome over and
// frees its slot; the recorder takes everything that gathered meanwhile in its next
// transaction), and a thread whose event is not recorded yet sends nothing more of its own.
// Before, a bounded hand-off of Concurrency outcomes filled and every worker waited for the
// record: delivery ran at the outcomes one commit could take, not at the requests' pace.
func TestSlowRecordDoesNotHoldBackRequests(t *testing.T) {
	rc := newReceiver(t)
	q := heldRecords{release: make(chan struct{})}
	h := startOn(t, t.TempDir(), Config{URL: rc.srv.URL, Concurrency: 2}, func(st store.Store) Queue {
		q.Store = st
		return q
	})
	var once sync.Once
	release := func() { once.Do(func() { close(q.release) }) }
	t.Cleanup(release) // runs before the outbox is stopped, which waits for its records
	const single = 20  // threads of one event each: 10 times the request slots
	evs := backlog(single, 1)
	evs = append(evs, mkEvent("m/multi", 1), mkEvent("m/multi", 2), mkEvent("m/multi", 3))
	h.commit(t, evs...)
	eventually(t, "every thread's first event sent while no record is done", func() bool {
		seen := map[string]bool{}
		for _, r := range rc.requests() {
			seen[r.Stream] = true
		}
		return len(seen) == single+1
	})
	for _, r := range rc.requests() {
		if r.Stream == "m/multi" && r.N != 1 {
			t.Fatalf("m/multi sent event %d before its first was recorded", r.N)
		}
	}
	if p, _, _ := h.counts(); p != single+3 {
		t.Fatalf("pending = %d while records wait, want %d", p, single+3)
	}
	release()
	eventually(t, "all delivered", func() bool { _, _, dl := h.counts(); return dl == single+3 })
	if got := rc.acceptedBy("m/multi"); !reflect.DeepEqual(got, seq(3)) {
		t.Fatalf("m/multi order = %v", got)
	}
	checkOrder(t, rc, single, 1)
}

// TestFinishedRequestWakesTheLoopOnlyForAWaitingHead: with request slots to spare, no head
// waits for one, so a finished request does not wake the loop (its recorded outcome does, once);
// the events are still delivered exactly once and in order. TestSlowRecordDoesNotHoldBackRequests
// shows the other side: with every slot taken, a finished request wakes the loop.
func TestFinishedRequestWakesTheLoopOnlyForAWaitingHead(t *testing.T) {
	const streams, perStream = 12, 3
	rc := newReceiver(t)
	h := start(t, Config{URL: rc.srv.URL, Concurrency: 64})
	n := 0
	for i := 1; i <= perStream; i++ {
		for s := range streams {
			h.commit(t, mkEvent(fmt.Sprintf("m/t%04d", s), i))
			n++
			eventually(t, "the event delivered and recorded", func() bool { _, _, dl := h.counts(); return dl == n })
		}
	}
	if w := h.ob.slotWakes.Load(); w != 0 {
		t.Fatalf("finished requests woke the loop %d times with slots to spare, want 0", w)
	}
	if got := len(rc.requests()); got != streams*perStream {
		t.Fatalf("%d requests, want %d (exactly once)", got, streams*perStream)
	}
	checkOrder(t, rc, streams, perStream)
}

// TestInFlightFollowsTheBacklog: the requests in flight start at startInFlight, grow while
// events wait for a slot and the receiver accepts them (up to Concurrency), are halved back when
// the receiver answers 503, and never exceed Concurrency; per-thread order holds throughout.
func TestInFlightFollowsTheBacklog(t *testing.T) {
	const (
		limit   = startInFlight + 8 // Concurrency: the cap
		streams = 100
		quick   = limit // requests answered at once before the receiver starts holding them
	)
	rc := newReceiver(t)
	var g inflightGauge
	var n atomic.Int64
	var status atomic.Int64
	status.Store(http.StatusServiceUnavailable)
	hold := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(hold) }) }
	t.Cleanup(release)
	rc.setHandle(func(_ http.ResponseWriter, r *http.Request, req request) int {
		g.enter(req.Stream)
		defer g.leave(req.Stream)
		if n.Add(1) <= quick {
			return http.StatusNoContent
		}
		select {
		case <-hold:
		case <-r.Context().Done():
		}
		return int(status.Load())
	})
	h := start(t, Config{URL: rc.srv.URL, Concurrency: limit})
	eventually(t, "the limit at its start value", func() bool { return value(h.m.inflightLimit) == startInFlight })
	h.commit(t, backlog(streams, 2)...)
	// The first startInFlight requests are answered at once while the other threads wait: the
	// limit grows, and the receiver then holds more requests than the start allowed.
	eventually(t, "Concurrency requests held at once", func() bool { cur, _, _ := g.get(); return cur == limit })
	if got := value(h.m.inflightLimit); got != limit {
		t.Fatalf("in-flight limit with a backlog = %v, want %d", got, limit)
	}
	release() // every held request is answered 503: the receiver is overloaded
	eventually(t, "the limit halved back to the start", func() bool { return value(h.m.inflightLimit) == startInFlight })
	status.Store(http.StatusNoContent)
	eventually(t, "all delivered", func() bool { _, _, dl := h.counts(); return dl == streams*2 })
	if _, peak, streamPeak := g.get(); peak > limit || streamPeak != 1 {
		t.Fatalf("peak requests in flight = %d (cap %d), per thread = %d (want 1)", peak, limit, streamPeak)
	}
	checkOrder(t, rc, streams, 2)
}

// TestRecordBoundLeavesTheLoopAsleep: with as many outcomes unrecorded as the bound allows (the
// records held) and every request slot free again, the heads left waiting do not keep the loop
// turning: it sleeps until a record comes back. (A loop that took the waiting heads for heads
// waiting for a slot would return from every sleep at once: a core's worth of turns, which in the
// outage phase's drain starved the very records it waited for.)
func TestRecordBoundLeavesTheLoopAsleep(t *testing.T) {
	rc := newReceiver(t)
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	q := heldRecords{Store: st, release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(q.release) }) }
	defer release()
	ob, err := New(q, Config{URL: rc.srv.URL, Concurrency: 8, Backoff: constBackoff(0), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Clock: (&fakeClock{t: t0}).Now})
	if err != nil {
		t.Fatal(err)
	}
	ob.unrecordedMax = 3
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ob.Run(ctx); close(done) }()
	defer func() { release(); cancel(); <-done }()

	const streams = 10
	if err := st.Commit(store.Batch{Events: backlog(streams, 1)}); err != nil {
		t.Fatal(err)
	}
	ob.Notify()
	// A worker that finished its request before the loop handed out the next job takes that one
	// too (the run needs 1 to 3 workers), so "idle again" is every live worker idle, not 3.
	eventually(t, "as many requests as outcomes may wait unrecorded, their workers idle again", func() bool {
		w := ob.workers.Load()
		return len(rc.requests()) == 3 && w > 0 && ob.idleWorkers.Load() == w
	})
	turns := ob.turns.Load()
	// Wake-ups that find nothing new: a turn or two each for a sleeping loop; a loop that never
	// sleeps never even takes them.
	for range 3 {
		ob.Notify()
		eventually(t, "the Notify taken", func() bool { return !ob.scanAsked.Load() })
	}
	if n := ob.turns.Load() - turns; n > 20 {
		t.Fatalf("the loop turned %d times for 3 wake-ups while the records were held", n)
	}
	if n := len(rc.requests()); n != 3 {
		t.Fatalf("%d requests while 3 outcomes were unrecorded, want 3", n)
	}
	release()
	eventually(t, "all delivered", func() bool { p, _, dl, err := st.Counts(); return err == nil && p == 0 && dl == streams })
	checkOrder(t, rc, streams, 1)
}
