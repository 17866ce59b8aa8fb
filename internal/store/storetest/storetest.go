// Package storetest is the contract of store.Store: one suite that every backend runs (the bbolt
// file in internal/store, PostgreSQL in internal/store/pgstore), so that the connector behaves
// the same whichever one holds its state.
package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Opener returns a new, empty store for one test, and reopen, which closes that store and opens
// the same storage again (what a restart does). The opener registers the cleanup of what it
// creates; the suite closes the stores it reopens.
type Opener func(t *testing.T) (s store.Store, reopen func(t *testing.T) store.Store)

// T0 is the suite's clock origin. Times are whole microseconds: what every backend keeps.
var T0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// OpenBolt opens a bbolt store in a new temporary directory of tb, closed when tb ends: the
// store of benchmarks and tests that need a real file but no contract of their own.
func OpenBolt(tb testing.TB) *store.Bolt {
	tb.Helper()
	s, err := store.Open(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// Ev is an event of the suite: a body naming its id.
func Ev(id, stream string) store.Event {
	return store.Event{ID: id, Stream: stream, Body: fmt.Appendf(nil, `{"id":%q}`, id), CreatedAt: T0}
}

// ids returns the events' ids in order.
func ids(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.ID
	}
	return out
}

// Run runs the contract suite on the backend open makes.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"Threads", testThreads},
		{"DetectorAndBatch", testDetectorAndBatch},
		{"BatchAllOrNothing", testBatchAllOrNothing},
		{"EventsIdempotentAndOrdered", testEventsIdempotentAndOrdered},
		{"BodyKeptByteForByte", testBodyKeptByteForByte},
		{"PendingIndexAndAfter", testPendingIndexAndAfter},
		{"GroupCommit", testGroupCommit},
		{"Record", testRecord},
		{"RecordSkipsWhatCannotApply", testRecordSkips},
		{"RecordBySequenceNumber", testRecordBySeq},
		{"HeadsFollowDelivery", testHeads},
		{"DeadAndRequeue", testDeadAndRequeue},
		{"Prune", testPrune},
		{"PruneOnlyWhatWasJudged", testPruneOnlyWhatWasJudged},
		{"PruneByDeliveryTime", testPruneByDeliveryTime},
		{"ReopenKeepsEverything", testReopen},
		{"IdempotencyClaimOnceAcrossReopen", testIdempotencyClaimOnceAcrossReopen},
		{"IdempotencyConcurrentClaimsOneWinner", testIdempotencyConcurrentClaimsOneWinner},
		{"IdempotencyPrune", testIdempotencyPrune},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func counts(t *testing.T, s store.Store, pending, dead, delivered int) {
	t.Helper()
	p, d, dl, err := s.Counts()
	must(t, err)
	if p != pending || d != dead || dl != delivered {
		t.Fatalf("Counts = pending %d, dead %d, delivered %d; want %d, %d, %d", p, d, dl, pending, dead, delivered)
	}
}

func commit(t *testing.T, s store.Store, evs ...store.Event) {
	t.Helper()
	must(t, s.Commit(store.Batch{Events: evs}))
}

func recordOne(t *testing.T, s store.Store, op store.Op) {
	t.Helper()
	errs, err := s.Record([]store.Op{op})
	must(t, err)
	must(t, errs[0])
}

func get(t *testing.T, s store.Store, id string) store.Event {
	t.Helper()
	e, err := s.Get(id)
	must(t, err)
	return e
}

func sameTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(want) {
		t.Fatalf("%s = %v, want %v", what, got, want)
	}
}

func testThreads(t *testing.T, open Opener) {
	s, _ := open(t)
	a := store.Thread{ID: "th-b", Machine: "mac", ProjectID: "p1", ProjectTitle: "api", Title: "fix it", Origin: "mcp", Watch: true,
		LastMessageID: "m1", LastRunID: "r1", CreatedAt: T0, UpdatedAt: T0.Add(time.Minute)}
	b := store.Thread{ID: "th-a", Machine: "box", CreatedAt: T0.Add(time.Hour), UpdatedAt: T0.Add(time.Hour)}
	c := store.Thread{ID: "th-0", Machine: "box", CreatedAt: T0.Add(time.Hour), UpdatedAt: T0.Add(time.Hour)}
	for _, th := range []store.Thread{a, b, c} {
		must(t, s.PutThread(th))
	}
	if err := s.PutThread(store.Thread{ID: "x"}); err == nil {
		t.Fatal("a thread without machine was accepted")
	}
	got, ok, err := s.GetThread("th-b")
	if err != nil || !ok || !threadEqual(got, a) {
		t.Fatalf("GetThread = %#v %v %v", got, ok, err)
	}
	if _, ok, err := s.GetThread("nope"); ok || err != nil {
		t.Fatalf("GetThread(nope) = %v %v", ok, err)
	}
	many, err := s.GetThreads([]string{"th-a", "nope", "th-b", "th-a"})
	if err != nil || len(many) != 2 || !threadEqual(many["th-b"], a) || !threadEqual(many["th-a"], b) {
		t.Fatalf("GetThreads = %+v %v", many, err)
	}
	if none, err := s.GetThreads(nil); err != nil || len(none) != 0 {
		t.Fatalf("GetThreads(nil) = %+v %v", none, err)
	}
	a.LastRunID, a.UpdatedAt = "r2", T0.Add(2*time.Minute)
	must(t, s.PutThread(a)) // replaces
	list, err := s.ListThreads()
	must(t, err)
	var gotIDs []string
	for _, th := range list {
		gotIDs = append(gotIDs, th.ID)
	}
	if !slices.Equal(gotIDs, []string{"th-b", "th-0", "th-a"}) { // CreatedAt, then ID
		t.Fatalf("ListThreads order = %v", gotIDs)
	}
	if list[0].LastRunID != "r2" {
		t.Fatalf("PutThread did not replace: %+v", list[0])
	}
	must(t, s.DeleteThread("th-a"))
	must(t, s.DeleteThread("never-there"))
	if _, ok, _ := s.GetThread("th-a"); ok {
		t.Fatal("deleted thread still there")
	}
	// A batch upserts and deletes threads with the rest.
	must(t, s.Commit(store.Batch{Threads: []store.Thread{b}, DeleteThreads: []string{"th-0"}}))
	list, err = s.ListThreads()
	must(t, err)
	if len(list) != 2 || list[0].ID != "th-b" || list[1].ID != "th-a" {
		t.Fatalf("after a batch: %+v", list)
	}
	if err := s.Commit(store.Batch{Threads: []store.Thread{{ID: "y"}}}); err == nil {
		t.Fatal("a batch with a thread without machine was accepted")
	}
}

// testPruneOnlyWhatWasJudged: a batch's PruneThreads and PruneStates delete only what the
// tracked rows, as the commit finds them, still allow — the prune judged them earlier, and a
// Track through another replica may have committed in between (issue 16: no transition lost).
func testPruneOnlyWhatWasJudged(t *testing.T, open Opener) {
	s, _ := open(t)
	later := T0.Add(time.Second)
	state := []byte(`{"latest":"r0"}`)
	must(t, s.Commit(store.Batch{
		Threads: []store.Thread{
			{ID: "gone", Machine: "m", CreatedAt: T0, UpdatedAt: T0},
			// judged unwatched at T0, then watched again (a Track: new row and baseline at once)
			{ID: "retracked", Machine: "m", Watch: true, CreatedAt: T0, UpdatedAt: later},
			// judged at T0, then updated (still unwatched): no longer the row judged
			{ID: "touched", Machine: "m", CreatedAt: T0, UpdatedAt: later},
			{ID: "moved", Machine: "m2", Watch: true, CreatedAt: T0, UpdatedAt: T0},
		},
		Detector: map[string][]byte{"m\x00gone": state, "m\x00retracked": state, "m\x00moved": state, "m\x00absent": state},
	}))
	owner := func(th string) store.StateOwner { return store.StateOwner{Machine: "m", Thread: th} }
	must(t, s.Commit(store.Batch{
		PruneThreads: map[string]time.Time{"gone": T0, "retracked": T0, "touched": T0, "never-there": T0},
		PruneStates: map[string]store.StateOwner{"m\x00gone": owner("gone"), "m\x00retracked": owner("retracked"),
			"m\x00moved": owner("moved"), "m\x00absent": owner("absent"), "m\x00never-there": owner("never-there")},
	}))
	for id, want := range map[string]bool{"gone": false, "retracked": true, "touched": true, "moved": true} {
		if _, ok, err := s.GetThread(id); err != nil || ok != want {
			t.Fatalf("thread %s after the prune: found=%v err=%v, want found=%v", id, ok, err, want)
		}
	}
	for k, want := range map[string]bool{"m\x00gone": false, "m\x00retracked": true, "m\x00moved": false, "m\x00absent": false} {
		if _, ok, err := s.Detector(k); err != nil || ok != want {
			t.Fatalf("detector state %q after the prune: found=%v err=%v, want found=%v", k, ok, err, want)
		}
	}
	if err := s.Commit(store.Batch{PruneStates: map[string]store.StateOwner{"": owner("x")}}); err == nil {
		t.Fatal("a batch pruning a detector state without a key was accepted")
	}
}

func threadEqual(a, b store.Thread) bool {
	if !a.CreatedAt.Equal(b.CreatedAt) || !a.UpdatedAt.Equal(b.UpdatedAt) {
		return false
	}
	a.CreatedAt, a.UpdatedAt, b.CreatedAt, b.UpdatedAt = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return reflect.DeepEqual(a, b)
}

func testDetectorAndBatch(t *testing.T, open Opener) {
	s, _ := open(t)
	must(t, s.Commit(store.Batch{Detector: map[string][]byte{"m/t2": []byte("two"), "m/t1": []byte("one"), "gone": []byte("x"), "m\x00t": {0, 1}}}))
	must(t, s.Commit(store.Batch{Detector: map[string][]byte{"gone": nil, "m/t1": []byte("uno")}, Events: []store.Event{Ev("e1", "m/t1")}}))
	v, ok, err := s.Detector("m/t1")
	if err != nil || !ok || string(v) != "uno" {
		t.Fatalf("Detector(m/t1) = %q %v %v", v, ok, err)
	}
	if _, ok, err := s.Detector("gone"); ok || err != nil {
		t.Fatalf("a nil value did not delete: %v %v", ok, err)
	}
	var keys []string
	must(t, s.ForEachDetector(func(k string, v []byte) error {
		keys = append(keys, k+"="+string(v))
		v[0] = 'X' // a copy: changing it changes nothing stored
		return nil
	}))
	if !slices.Equal(keys, []string{"m\x00t=\x00\x01", "m/t1=uno", "m/t2=two"}) { // byte order; a NUL in a key (events.key) kept
		t.Fatalf("ForEachDetector = %v (want key order)", keys)
	}
	if v, _, _ := s.Detector("m/t2"); string(v) != "two" {
		t.Fatalf("ForEachDetector handed out stored memory: %q", v)
	}
	if v, ok, err := s.Detector("m\x00t"); err != nil || !ok || !slices.Equal(v, []byte{0, 1}) {
		t.Fatalf("Detector(key with NUL) = %v %v %v", v, ok, err)
	}
	stop := errors.New("stop")
	if err := s.ForEachDetector(func(string, []byte) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("ForEachDetector did not return fn's error: %v", err)
	}
	must(t, s.Commit(store.Batch{Detector: map[string][]byte{"m\x00t": nil}}))
	if _, ok, _ := s.Detector("m\x00t"); ok {
		t.Fatal("a key with NUL was not deleted")
	}
	counts(t, s, 1, 0, 0)
}

func testBatchAllOrNothing(t *testing.T, open Opener) {
	s, _ := open(t)
	bad := []store.Batch{
		{Detector: map[string][]byte{"k": []byte("v")}, Events: []store.Event{Ev("ok", "s"), {ID: "", Stream: "s", Body: []byte(`{}`)}}},
		{Detector: map[string][]byte{"k": []byte("v")}, Events: []store.Event{Ev("ok", "s"), {ID: "x", Stream: "", Body: []byte(`{}`)}}},
		{Detector: map[string][]byte{"k": []byte("v")}, Events: []store.Event{Ev("ok", "s"), {ID: "x", Stream: "a\x00b", Body: []byte(`{}`)}}},
		{Detector: map[string][]byte{"k": []byte("v")}, Events: []store.Event{Ev("ok", "s"), {ID: "x", Stream: "s", Body: []byte(`{nope`)}}},
	}
	for i, b := range bad {
		if err := s.Commit(b); err == nil {
			t.Fatalf("bad batch %d committed", i)
		}
	}
	if err := s.CommitBatches([]store.Batch{{Events: []store.Event{Ev("ok", "s")}}, bad[3]}); err == nil {
		t.Fatal("CommitBatches with a bad batch committed")
	}
	if _, ok, _ := s.Detector("k"); ok {
		t.Fatal("a failed batch left its detector state")
	}
	if _, err := s.Get("ok"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a failed batch left its event: %v", err)
	}
	counts(t, s, 0, 0, 0)
}

func testEventsIdempotentAndOrdered(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, Ev("a1", "a"), Ev("b1", "b"), Ev("a1", "a"))
	commit(t, s, Ev("a2", "a"), Ev("b1", "b"))
	must(t, s.CommitBatches([]store.Batch{{Events: []store.Event{Ev("a3", "a")}}, {Events: []store.Event{Ev("a3", "a"), Ev("b2", "b")}}}))
	p, err := s.Pending(0)
	must(t, err)
	if !slices.Equal(ids(p), []string{"a1", "b1", "a2", "a3", "b2"}) {
		t.Fatalf("Pending = %v", ids(p))
	}
	for i := 1; i < len(p); i++ {
		if p[i].Seq <= p[i-1].Seq {
			t.Fatalf("sequence numbers not increasing: %v then %v", p[i-1].Seq, p[i].Seq)
		}
	}
	if p2, _ := s.Pending(2); !slices.Equal(ids(p2), []string{"a1", "b1"}) {
		t.Fatalf("Pending(2) = %v", ids(p2))
	}
	e := p[0]
	if e.State != store.StatePending || e.Attempts != 0 || string(e.Body) != `{"id":"a1"}` || e.Stream != "a" {
		t.Fatalf("stored event = %+v", e)
	}
	sameTime(t, "CreatedAt", e.CreatedAt, T0)
	sameTime(t, "EnqueuedAt", e.EnqueuedAt, T0)
	// An event without CreatedAt gets the commit time.
	before := time.Now().Add(-time.Second)
	commit(t, s, store.Event{ID: "now", Stream: "c", Body: []byte(`{}`), Enrich: true})
	n := get(t, s, "now")
	if n.CreatedAt.Before(before) || !n.EnqueuedAt.Equal(n.CreatedAt) || !n.Enrich {
		t.Fatalf("event without CreatedAt: %+v", n)
	}
	counts(t, s, 6, 0, 0)
}

func testBodyKeptByteForByte(t *testing.T, open Opener) {
	s, _ := open(t)
	body := []byte("{ \"b\":1,  \"a\" : [ 2.50 ,\"\\u00e9\"],\n\"a\":3 }")
	commit(t, s, store.Event{ID: "raw", Stream: "s", Body: body, CreatedAt: T0})
	if e := get(t, s, "raw"); string(e.Body) != string(body) {
		t.Fatalf("body changed in the store:\n got %q\nwant %q", e.Body, body)
	}
	newBody := []byte(`{"z" :  0}`)
	recordOne(t, s, store.Op{ID: "raw", Kind: store.OpBody, Body: newBody})
	if e := get(t, s, "raw"); string(e.Body) != string(newBody) {
		t.Fatalf("recorded body changed in the store: %q", e.Body)
	}
}

func testPendingIndexAndAfter(t *testing.T, open Opener) {
	s, _ := open(t)
	last, err := s.PendingIndex(func(string, uint64) { t.Fatal("empty store indexed an event") })
	must(t, err)
	if last != 0 {
		t.Fatalf("empty store: last = %d", last)
	}
	commit(t, s, Ev("a1", "a"), Ev("b1", "b"), Ev("a2", "a"))
	got := map[string][]uint64{}
	last, err = s.PendingIndex(func(stream string, seq uint64) { got[stream] = append(got[stream], seq) })
	must(t, err)
	a1, b1, a2 := get(t, s, "a1"), get(t, s, "b1"), get(t, s, "a2")
	if !reflect.DeepEqual(got, map[string][]uint64{"a": {a1.Seq, a2.Seq}, "b": {b1.Seq}}) {
		t.Fatalf("PendingIndex = %v", got)
	}
	if last < a2.Seq {
		t.Fatalf("last = %d, below the newest event's %d", last, a2.Seq)
	}
	if after, err := s.PendingAfter(last, 0); err != nil || len(after) != 0 {
		t.Fatalf("PendingAfter(last) before any commit = %v %v", ids(after), err)
	}
	commit(t, s, Ev("c1", "c"), Ev("a3", "a"))
	after, err := s.PendingAfter(last, 0)
	must(t, err)
	if !slices.Equal(ids(after), []string{"c1", "a3"}) || after[0].Body != nil {
		t.Fatalf("PendingAfter(last) = %v (bodies must be left out)", ids(after))
	}
	if one, _ := s.PendingAfter(last, 1); !slices.Equal(ids(one), []string{"c1"}) {
		t.Fatalf("PendingAfter(last, 1) = %v", ids(one))
	}
	pe, err := s.PendingEvent(a1.Seq, true)
	if err != nil || pe.ID != "a1" || string(pe.Body) != `{"id":"a1"}` {
		t.Fatalf("PendingEvent(withBody) = %+v %v", pe, err)
	}
	if pe, err := s.PendingEvent(a1.Seq, false); err != nil || pe.ID != "a1" || pe.Body != nil {
		t.Fatalf("PendingEvent(no body) = %+v %v", pe, err)
	}
	recordOne(t, s, store.Op{ID: "a1", Kind: store.OpDelivered, At: T0})
	if _, err := s.PendingEvent(a1.Seq, false); !errors.Is(err, store.ErrNotPending) {
		t.Fatalf("PendingEvent of a delivered event: %v", err)
	}
	if _, err := s.PendingEvent(1<<40, false); !errors.Is(err, store.ErrNotPending) {
		t.Fatalf("PendingEvent of an unknown seq: %v", err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(nope): %v", err)
	}
}

func testGroupCommit(t *testing.T, open Opener) {
	s, _ := open(t)
	g := store.NewGroup(s)
	const n = 16
	var wg sync.WaitGroup
	errs := make([]error, n+1)
	for i := range n {
		wg.Go(func() {
			errs[i] = g.Commit(store.Batch{
				Detector: map[string][]byte{fmt.Sprintf("k%02d", i): []byte("v")},
				Events:   []store.Event{Ev(fmt.Sprintf("g%02d", i), fmt.Sprintf("s%d", i%3))},
			})
		})
	}
	wg.Go(func() { errs[n] = g.Commit(store.Batch{Detector: map[string][]byte{"": []byte("x")}}) }) // no key: refused alone
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("batch %d: %v", i, errs[i])
		}
	}
	if errs[n] == nil {
		t.Fatal("a batch with an empty detector key was written")
	}
	if err := g.Commit(store.Batch{Events: []store.Event{{ID: "bad", Stream: "s"}}}); err == nil {
		t.Fatal("an invalid batch was accepted by the group")
	}
	for i := range n {
		if _, ok, _ := g.Detector(fmt.Sprintf("k%02d", i)); !ok {
			t.Fatalf("batch %d's detector state is missing", i)
		}
		get(t, s, fmt.Sprintf("g%02d", i))
	}
	txs, batches := g.Stats()
	if batches != n || txs == 0 || txs > batches { // the keyless batch was refused before the group
		t.Fatalf("Stats = %d transactions, %d batches", txs, batches)
	}
	var keys int
	must(t, g.ForEachDetector(func(string, []byte) error { keys++; return nil }))
	if keys != n {
		t.Fatalf("%d detector keys, want %d", keys, n)
	}
	counts(t, s, n, 0, 0)
}

func testRecord(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, store.Event{ID: "e1", Stream: "s", Body: []byte(`{"v":1}`), CreatedAt: T0, Enrich: true}, Ev("e2", "s"), Ev("e3", "t"), Ev("e4", "u"))
	next := T0.Add(time.Minute)
	errs, err := s.Record([]store.Op{
		{ID: "e1", Kind: store.OpBody, Body: []byte(`{"v":2}`)},
		{ID: "e2", Kind: store.OpRetry, Next: next, Error: "HTTP 503"},
		{ID: "e3", Kind: store.OpDelivered, At: T0.Add(2 * time.Second), Body: []byte(`{"v":3}`)},
		{ID: "e4", Kind: store.OpDead, At: T0.Add(3 * time.Second), Error: "HTTP 400"},
	})
	must(t, err)
	for i, e := range errs {
		if e != nil {
			t.Fatalf("op %d: %v", i, e)
		}
	}
	e1 := get(t, s, "e1")
	if e1.Enrich || string(e1.Body) != `{"v":2}` || e1.Attempts != 0 || e1.State != store.StatePending {
		t.Fatalf("after OpBody: %+v", e1)
	}
	e2 := get(t, s, "e2")
	if e2.State != store.StatePending || e2.Attempts != 1 || e2.LastError != "HTTP 503" {
		t.Fatalf("after OpRetry: %+v", e2)
	}
	sameTime(t, "NextAttempt", e2.NextAttempt, next)
	recordOne(t, s, store.Op{ID: "e2", Kind: store.OpRetry, Next: next.Add(time.Minute), Error: "HTTP 502"})
	if e2 = get(t, s, "e2"); e2.Attempts != 2 || e2.LastError != "HTTP 502" {
		t.Fatalf("second OpRetry: %+v", e2)
	}
	e3 := get(t, s, "e3")
	if e3.State != store.StateDelivered || e3.Attempts != 1 || string(e3.Body) != `{"v":3}` || !e3.NextAttempt.IsZero() {
		t.Fatalf("after OpDelivered: %+v", e3)
	}
	sameTime(t, "DeliveredAt", e3.DeliveredAt, T0.Add(2*time.Second))
	e4 := get(t, s, "e4")
	if e4.State != store.StateDead || e4.Attempts != 1 || e4.LastError != "HTTP 400" {
		t.Fatalf("after OpDead: %+v", e4)
	}
	sameTime(t, "DeadAt", e4.DeadAt, T0.Add(3*time.Second))
	counts(t, s, 2, 1, 1)
	if p, _ := s.Pending(0); !slices.Equal(ids(p), []string{"e1", "e2"}) {
		t.Fatalf("Pending = %v", ids(p))
	}
	if d, _ := s.Dead(); !slices.Equal(ids(d), []string{"e4"}) || string(d[0].Body) != `{"id":"e4"}` {
		t.Fatalf("Dead = %v", ids(d))
	}
	// A final outcome after retries counts that attempt too.
	recordOne(t, s, store.Op{ID: "e2", Kind: store.OpDelivered, At: T0})
	if e2 = get(t, s, "e2"); e2.Attempts != 3 || e2.State != store.StateDelivered {
		t.Fatalf("delivered after two retries: %+v", e2)
	}
	counts(t, s, 1, 1, 2)
}

// testRecordBySeq: an op's sequence number (Op.Seq) is a hint for finding the event; the op
// applies to the event its ID names whatever the number says, and to none when the ID is
// unknown, even if the number is another pending event's.
func testRecordBySeq(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, Ev("e1", "s"), Ev("e2", "s"), Ev("e3", "t"))
	seqs := map[string]uint64{}
	p, err := s.Pending(0)
	must(t, err)
	for _, e := range p {
		seqs[e.ID] = e.Seq
	}
	errs, err := s.Record([]store.Op{
		{ID: "e1", Seq: seqs["e1"], Kind: store.OpDelivered, At: T0},
		{ID: "e2", Seq: seqs["e3"], Kind: store.OpRetry, Next: T0.Add(time.Minute), Error: "HTTP 503"}, // another event's number
		{ID: "nope", Seq: seqs["e3"], Kind: store.OpDelivered, At: T0},
		{ID: "e3", Seq: 1 << 40, Kind: store.OpDead, At: T0, Error: "HTTP 400"}, // no event has it
	})
	must(t, err)
	if errs[0] != nil || errs[1] != nil || errs[3] != nil {
		t.Fatalf("errs = %v", errs)
	}
	if !errors.Is(errs[2], store.ErrNotFound) {
		t.Fatalf("unknown id with another event's number: %v", errs[2])
	}
	if e := get(t, s, "e1"); e.State != store.StateDelivered || e.Attempts != 1 {
		t.Fatalf("e1: %+v", e)
	}
	if e := get(t, s, "e2"); e.State != store.StatePending || e.Attempts != 1 || e.LastError != "HTTP 503" {
		t.Fatalf("e2: %+v", e)
	}
	if e := get(t, s, "e3"); e.State != store.StateDead || e.LastError != "HTTP 400" {
		t.Fatalf("e3 (recorded by its id, the number matching none): %+v", e)
	}
	counts(t, s, 1, 1, 1)
	// A number given for an event no longer pending: found by its id, refused as not pending.
	errs, err = s.Record([]store.Op{{ID: "e1", Seq: seqs["e1"], Kind: store.OpDelivered, At: T0}})
	must(t, err)
	if !errors.Is(errs[0], store.ErrNotPending) {
		t.Fatalf("a delivered event recorded again by its number: %v", errs[0])
	}
}

func testRecordSkips(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, Ev("e1", "s"), Ev("e2", "s"), Ev("e3", "s"))
	recordOne(t, s, store.Op{ID: "e1", Kind: store.OpDelivered, At: T0})
	errs, err := s.Record([]store.Op{
		{ID: "nope", Kind: store.OpDelivered, At: T0},
		{ID: "e1", Kind: store.OpDead, At: T0, Error: "x"},
		{ID: "e2", Kind: store.OpBody, Body: []byte(`{broken`)},
		{ID: "e3", Kind: store.OpDelivered, At: T0},
		{ID: "e3", Kind: store.OpDelivered, At: T0}, // the same id twice in one batch: the second is no longer pending
	})
	must(t, err)
	if len(errs) != 5 {
		t.Fatalf("%d errs for 5 ops", len(errs))
	}
	if !errors.Is(errs[0], store.ErrNotFound) {
		t.Errorf("unknown id: %v", errs[0])
	}
	if !errors.Is(errs[1], store.ErrNotPending) {
		t.Errorf("delivered event: %v", errs[1])
	}
	if errs[2] == nil {
		t.Error("a body that is not JSON was recorded")
	}
	if errs[3] != nil {
		t.Errorf("a good op beside bad ones: %v", errs[3])
	}
	if !errors.Is(errs[4], store.ErrNotPending) {
		t.Errorf("second outcome of one event: %v", errs[4])
	}
	if e := get(t, s, "e2"); string(e.Body) != `{"id":"e2"}` || e.State != store.StatePending {
		t.Fatalf("the skipped op changed e2: %+v", e)
	}
	counts(t, s, 1, 0, 2)
	if errs, err := s.Record(nil); err != nil || len(errs) != 0 {
		t.Fatalf("Record(nil) = %v %v", errs, err)
	}
}

func testHeads(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, Ev("b1", "b"), Ev("a1", "a"), Ev("a2", "a"), Ev("b2", "b"), Ev("c1", "c"))
	heads := func(limit int) []string {
		h, err := s.Heads(limit)
		must(t, err)
		return ids(h)
	}
	if got := heads(0); !slices.Equal(got, []string{"a1", "b1", "c1"}) {
		t.Fatalf("Heads = %v", got)
	}
	if got := heads(2); !slices.Equal(got, []string{"a1", "b1"}) {
		t.Fatalf("Heads(2) = %v", got)
	}
	recordOne(t, s, store.Op{ID: "a1", Kind: store.OpDelivered, At: T0})
	recordOne(t, s, store.Op{ID: "b1", Kind: store.OpRetry, Next: T0.Add(time.Hour)}) // a retry keeps the head
	recordOne(t, s, store.Op{ID: "c1", Kind: store.OpDead, At: T0})
	if got := heads(0); !slices.Equal(got, []string{"a2", "b1"}) {
		t.Fatalf("Heads after outcomes = %v", got)
	}
	if h, _ := s.Heads(0); string(h[0].Body) != `{"id":"a2"}` {
		t.Fatalf("Heads without body: %+v", h[0])
	}
}

func testDeadAndRequeue(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, Ev("d1", "a"), Ev("d2", "b"), Ev("p1", "c"), Ev("x1", "d"))
	recordOne(t, s, store.Op{ID: "d1", Kind: store.OpDead, At: T0, Error: "HTTP 400"})
	recordOne(t, s, store.Op{ID: "d2", Kind: store.OpDead, At: T0, Error: "HTTP 410"})
	recordOne(t, s, store.Op{ID: "x1", Kind: store.OpDelivered, At: T0})
	commit(t, s, Ev("a2", "a")) // later in d1's stream
	counts(t, s, 2, 2, 1)

	if _, err := s.Requeue(T0, "d1", "unknown"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Requeue with an unknown id: %v", err)
	}
	counts(t, s, 2, 2, 1) // nothing moved
	at := T0.Add(time.Hour)
	evs, err := s.RequeueEvents(at, "d1", "d1", "p1", "x1") // pending and delivered ids are skipped
	must(t, err)
	if !slices.Equal(ids(evs), []string{"d1"}) || evs[0].State != store.StatePending || evs[0].Attempts != 0 || evs[0].LastError != "HTTP 400" {
		t.Fatalf("RequeueEvents = %+v", evs)
	}
	sameTime(t, "requeued EnqueuedAt", evs[0].EnqueuedAt, at)
	d1 := get(t, s, "d1")
	if d1.State != store.StatePending || !d1.DeadAt.IsZero() || d1.Attempts != 0 {
		t.Fatalf("requeued d1 = %+v", d1)
	}
	sameTime(t, "d1 CreatedAt", d1.CreatedAt, T0)
	counts(t, s, 3, 1, 1)
	// It goes back to its place: ahead of the later event of its stream.
	if h, _ := s.Heads(0); !slices.Equal(ids(h), []string{"d1", "p1"}) {
		t.Fatalf("Heads after requeue = %v", ids(h))
	}
	if n, err := s.Requeue(at); err != nil || n != 1 {
		t.Fatalf("Requeue all = %d %v", n, err)
	}
	if d, _ := s.Dead(); len(d) != 0 {
		t.Fatalf("dead letters left: %v", ids(d))
	}
	if n, err := s.Requeue(at); err != nil || n != 0 {
		t.Fatalf("Requeue of nothing = %d %v", n, err)
	}
	counts(t, s, 4, 0, 1)
}

func testPrune(t *testing.T, open Opener) {
	s, _ := open(t)
	commit(t, s, Ev("old", "a"), Ev("new", "a"), Ev("dead", "b"), Ev("pend", "c"))
	recordOne(t, s, store.Op{ID: "old", Kind: store.OpDelivered, At: T0})
	recordOne(t, s, store.Op{ID: "new", Kind: store.OpDelivered, At: T0.Add(2 * time.Hour)})
	recordOne(t, s, store.Op{ID: "dead", Kind: store.OpDead, At: T0})
	n, err := s.Prune(T0.Add(time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("Prune = %d %v", n, err)
	}
	if _, err := s.Get("old"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("pruned event: %v", err)
	}
	get(t, s, "new")
	get(t, s, "dead")
	counts(t, s, 1, 1, 1)
	commit(t, s, Ev("old", "a")) // a pruned id is new again
	if e := get(t, s, "old"); e.State != store.StatePending {
		t.Fatalf("re-inserted pruned id: %+v", e)
	}
	counts(t, s, 2, 1, 1)
}

// testPruneByDeliveryTime: a prune deletes by when an event was delivered, not by when it was
// inserted (events delivered in another order than they were committed, one requeued from the
// dead letters and delivered last); one delivered exactly at the cutoff is kept; a second prune
// with the same cutoff finds nothing; the kept ones survive a reopen and a later cutoff takes them.
func testPruneByDeliveryTime(t *testing.T, open Opener) {
	s, reopen := open(t)
	commit(t, s, Ev("e1", "a"), Ev("e2", "b"), Ev("e3", "c"), Ev("e4", "d"), Ev("e5", "e"))
	cut := T0.Add(time.Hour)
	recordOne(t, s, store.Op{ID: "e1", Kind: store.OpDelivered, At: cut.Add(time.Minute)}) // first in, delivered late
	recordOne(t, s, store.Op{ID: "e2", Kind: store.OpDelivered, At: T0})
	recordOne(t, s, store.Op{ID: "e3", Kind: store.OpDelivered, At: cut}) // at the cutoff: kept
	recordOne(t, s, store.Op{ID: "e4", Kind: store.OpDead, At: T0})
	if _, err := s.Requeue(T0, "e4"); err != nil {
		t.Fatal(err)
	}
	recordOne(t, s, store.Op{ID: "e4", Kind: store.OpDelivered, At: T0.Add(time.Minute)})
	recordOne(t, s, store.Op{ID: "e5", Kind: store.OpDelivered, At: cut.Add(-time.Nanosecond)})
	counts(t, s, 0, 0, 5)
	if n, err := s.Prune(cut); err != nil || n != 3 {
		t.Fatalf("Prune = %d %v, want 3 (e2, e4, e5)", n, err)
	}
	for _, id := range []string{"e2", "e4", "e5"} {
		if _, err := s.Get(id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s delivered before the cutoff: %v", id, err)
		}
	}
	get(t, s, "e1")
	get(t, s, "e3")
	counts(t, s, 0, 0, 2)
	if n, err := s.Prune(cut); err != nil || n != 0 {
		t.Fatalf("second Prune = %d %v", n, err)
	}
	s = reopen(t)
	t.Cleanup(func() { s.Close() })
	if n, err := s.Prune(cut.Add(time.Hour)); err != nil || n != 2 {
		t.Fatalf("Prune after reopen = %d %v, want 2", n, err)
	}
	counts(t, s, 0, 0, 0)
}

func testReopen(t *testing.T, open Opener) {
	s, reopen := open(t)
	th := store.Thread{ID: "t1", Machine: "m", CreatedAt: T0, UpdatedAt: T0}
	must(t, s.Commit(store.Batch{Threads: []store.Thread{th}, Detector: map[string][]byte{"k": []byte("v")}, Events: []store.Event{Ev("e1", "s"), Ev("e2", "s"), Ev("e3", "t")}}))
	recordOne(t, s, store.Op{ID: "e2", Kind: store.OpDead, At: T0, Error: "gone"})
	recordOne(t, s, store.Op{ID: "e3", Kind: store.OpDelivered, At: T0})
	last := get(t, s, "e3").Seq

	s = reopen(t)
	t.Cleanup(func() { s.Close() })
	if got, ok, err := s.GetThread("t1"); err != nil || !ok || !threadEqual(got, th) {
		t.Fatalf("thread after reopen: %+v %v %v", got, ok, err)
	}
	if v, ok, _ := s.Detector("k"); !ok || string(v) != "v" {
		t.Fatalf("detector after reopen: %q %v", v, ok)
	}
	counts(t, s, 1, 1, 1)
	if e := get(t, s, "e2"); e.State != store.StateDead || e.LastError != "gone" {
		t.Fatalf("dead letter after reopen: %+v", e)
	}
	commit(t, s, Ev("e1", "s"), Ev("e4", "s")) // e1 is still known
	if e := get(t, s, "e4"); e.Seq <= last {
		t.Fatalf("sequence went back after reopen: %d <= %d", e.Seq, last)
	}
	counts(t, s, 2, 1, 1)
}
