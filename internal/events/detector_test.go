package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeRun is a run of the test's thread as T3 would list it.
type fakeRun struct {
	id, status string
	requests   []string // user_input_request items in the run
}

type env struct {
	t      *testing.T
	dir    string
	st     store.Store
	g      *store.Group // the detector's committer: its Stats count the commits
	d      *Detector
	mu     sync.Mutex
	runs   map[string][]fakeRun // thread → runs, in T3's order
	fail   map[string]error     // thread → read error
	reads  int
	notify int
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEnv(t *testing.T, dir string) *env {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, dir: dir, st: st, g: store.NewGroup(st), runs: map[string][]fakeRun{}, fail: map[string]error{}}
	e.d = New(Options{
		Store: e.g, Tracked: st, Read: ReaderFunc(e.read), Logger: quiet(),
		Notify: func() { e.mu.Lock(); e.notify++; e.mu.Unlock() },
	})
	return e
}

// read serves the projection of a thread from e.runs: runs in order with an
// ordinal field (never parsed from ids), a reply per run and its requests.
func (e *env) read(_ context.Context, _, threadID string) (*t3api.ThreadProjection, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reads++
	if err := e.fail[threadID]; err != nil {
		return nil, err
	}
	p := &t3api.ThreadProjection{Thread: t3api.AppThread{ID: threadID, ProjectId: "p1", Title: "T"}}
	ord := int64(0)
	for i, r := range e.runs[threadID] {
		p.Runs = append(p.Runs, t3api.Run{ID: r.id, ThreadId: threadID, Ordinal: int64(i + 1), Status: r.status})
		for _, q := range r.requests {
			ord++
			p.TurnItems = append(p.TurnItems, t3api.TurnItem{ID: "i-" + q, Type: "user_input_request", Ordinal: ord, RunId: t3api.NewOptNilString(r.id), RequestId: t3api.NewOptString(q),
				Questions: []t3api.Question{{ID: "pick", Question: "Which one?"}}})
		}
		ord++
		p.TurnItems = append(p.TurnItems, t3api.TurnItem{ID: "i-" + r.id, Type: "assistant_message", Ordinal: ord, RunId: t3api.NewOptNilString(r.id), Text: t3api.NewOptString("reply of " + r.id)})
	}
	return p, nil
}

func (e *env) setRuns(thread string, runs ...fakeRun) {
	e.mu.Lock()
	e.runs[thread] = runs
	e.mu.Unlock()
}

func (e *env) setFail(thread string, err error) {
	e.mu.Lock()
	e.fail[thread] = err
	e.mu.Unlock()
}

// row builds a shell row. active/latest: "" null, "-" absent.
func row(id, status, active, latest, pending string) t3rpc.ThreadShell {
	s := t3rpc.ThreadShell{ID: id, ProjectId: "p1", Title: "T", Status: status}
	ptr := func(v string) t3rpc.OptNilString {
		switch v {
		case "-":
			return t3rpc.OptNilString{}
		case "":
			var o t3rpc.OptNilString
			o.SetToNull()
			return o
		}
		return t3rpc.NewOptNilString(v)
	}
	s.ActiveRunId, s.LatestRunId = ptr(active), ptr(latest)
	if pending != "" {
		s.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(t3rpc.PendingRuntimeRequest{ID: pending, Kind: "user_input"})
	}
	return s
}

func (e *env) watchThread(id, origin string, base *t3rpc.ThreadShell) {
	e.t.Helper()
	if err := e.d.Track("m", store.Thread{ID: id, Machine: "m", ProjectID: "p1", ProjectTitle: "proj", Origin: origin, Watch: true}, base); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) apply(threads ...t3rpc.ThreadShell) {
	e.t.Helper()
	if err := e.d.Apply(context.Background(), watch.Change{Machine: "m", Threads: watch.RowsOf(threads)}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) snapshot(threads ...t3rpc.ThreadShell) {
	e.t.Helper()
	if err := e.d.Apply(context.Background(), watch.Change{Machine: "m", Snapshot: true, Threads: watch.RowsOf(threads)}); err != nil {
		e.t.Fatal(err)
	}
}

// lookups runs every due look-up once, as Run would, and reports how many
// are still pending.
func (e *env) lookups() int {
	e.t.Helper()
	l := e.d.lookups
	l.mu.Lock()
	var keys []string
	for k := range l.tasks {
		keys = append(keys, k)
	}
	l.mu.Unlock()
	for _, k := range keys {
		res, err := e.d.lookup(context.Background(), k)
		l.done(k, err, res == lookupRetry, res == lookupAgain)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tasks)
}

type body struct {
	ID, Type, Machine, Origin, Summary, Error string
	ThreadID                                  string `json:"thread_id"`
	Run                                       string `json:"run_id"`
	RunStatus                                 string `json:"run_status"`
	Project                                   struct{ ID, Title string }
	Question                                  *struct {
		RequestID string `json:"request_id"`
		Questions []struct{ ID, Text string }
	}
	Partial       bool
	Missing       []string
	PartialReason string `json:"partial_reason"`
}

type record struct {
	body
	enrich bool
}

func (e *env) records() []record {
	e.t.Helper()
	evs, err := e.st.Pending(1000)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []record
	for _, ev := range evs {
		var b body
		if err := json.Unmarshal(ev.Body, &b); err != nil {
			e.t.Fatal(err)
		}
		if b.ID != ev.ID || ev.Stream != "m/"+b.ThreadID {
			e.t.Fatalf("record %s/%s does not match body %+v", ev.ID, ev.Stream, b)
		}
		out = append(out, record{b, ev.Enrich})
	}
	return out
}

// kinds lists events as "type run" (or "question request").
func (e *env) kinds() []string {
	var out []string
	for _, r := range e.records() {
		if r.Question != nil {
			out = append(out, "question "+r.Question.RequestID)
			continue
		}
		out = append(out, r.Type[len("thread."):]+" "+r.Run)
	}
	return out
}

func (e *env) want(want ...string) {
	e.t.Helper()
	got := e.kinds()
	if len(got) != len(want) {
		e.t.Fatalf("events %q, want %q", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			e.t.Fatalf("events %q, want %q", got, want)
		}
	}
}

func TestRunCompletesOnceAcrossReplays(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "chat-42", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.apply(row("t1", "waiting", "r1", "r1", ""))
	e.want()
	done := row("t1", "completed", "", "r1", "")
	e.apply(done)
	e.apply(done) // replayed after a reconnect
	e.snapshot(done)
	e.want("completed r1")
	ev := e.records()[0]
	// Committed in the Ack path with the row's facts only, for the outbox to enrich.
	if !ev.enrich || ev.Origin != "chat-42" || ev.Project.Title != "proj" || ev.Summary != "" {
		t.Fatalf("event = %+v", ev)
	}
	if e.notify != 1 || e.reads != 0 {
		t.Errorf("outbox notified %d times (want 1), T3 read %d times (want 0)", e.notify, e.reads)
	}
}

// Nothing in Apply reads T3, even when the rows cannot settle a run: the
// chunk is committed (and acknowledged) at once and a look-up is noted.
func TestApplyNeverReadsAndNotesLookups(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	// r2 starts; the row no longer says how r1 ended.
	e.apply(row("t1", "running", "r2", "r2", ""))
	if e.reads != 0 {
		t.Fatalf("Apply read T3 %d times", e.reads)
	}
	e.want()
	if s := e.d.Lookups()["m"]; s.Pending != 1 {
		t.Fatalf("look-ups = %+v, want 1 pending", s)
	}
	raw, ok, _ := e.st.Detector(key("m", "t1"))
	var st seen
	if !ok || json.Unmarshal(raw, &st) != nil || !st.Lookup {
		t.Fatalf("the look-up note is not durable: %s", raw)
	}
	e.setRuns("t1", fakeRun{id: "r1", status: "failed"}, fakeRun{id: "r2", status: "running"})
	if n := e.lookups(); n != 0 {
		t.Fatalf("%d look-ups still pending", n)
	}
	e.want("failed r1")
	if r := e.records()[0]; r.enrich || r.Summary != "reply of r1" {
		t.Fatalf("a look-up has the thread at hand: the body should be complete, got %+v", r)
	}
	e.apply(row("t1", "interrupted", "", "r2", ""))
	e.want("failed r1", "interrupted r2")
}

// Fixture 21: a follow-up queued while run 1 runs. The row's status follows
// the newest run ("queued"), run 1 ends while run 2 waits, then run 2 runs and
// ends: one event per run, in order.
func TestQueuedFollowUpOneEventPerRun(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.apply(row("t1", "queued", "r1", "r2", "")) // r2 queued behind r1
	e.want()
	if e.d.Lookups()["m"].Pending != 0 {
		t.Fatal("r1 is the active run: the row says it is busy, no look-up needed")
	}
	// r1 completes, r2 starts: r1 is neither active nor latest now.
	e.apply(row("t1", "running", "r2", "r2", ""))
	e.setRuns("t1", fakeRun{id: "r1", status: "completed"}, fakeRun{id: "r2", status: "running"})
	e.lookups()
	e.want("completed r1")
	e.apply(row("t1", "completed", "", "r2", ""))
	e.apply(row("t1", "completed", "", "r2", ""))
	e.want("completed r1", "completed r2")
}

// Fixture 21: the newest queued run cancelled while an older one runs on: the
// row says "cancelled" about the newest run only.
func TestCancelledNewestQueuedRun(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r2", "r2", ""))
	e.apply(row("t1", "queued", "r2", "r4", ""))
	e.apply(row("t1", "cancelled", "r2", "r4", "")) // r4 cancelled; r2 runs on
	e.want("interrupted r4")
	if e.d.Lookups()["m"].Pending != 0 {
		t.Fatal("r2 is still active: nothing to look up")
	}
	e.apply(row("t1", "cancelled", "", "r4", "")) // r2 ended; the row says nothing of it
	e.setRuns("t1", fakeRun{id: "r2", status: "completed"}, fakeRun{id: "r4", status: "cancelled"})
	e.lookups()
	e.want("interrupted r4", "completed r2")
	// The contract's type is interrupted; the body says what T3 said: the
	// row's status (r4) and the run's own record read by the look-up (r2).
	for _, r := range e.records() {
		if want := map[string]string{"r4": "cancelled", "r2": "completed"}[r.Run]; r.RunStatus != want {
			t.Errorf("event for %s: run_status %q, want %q", r.Run, r.RunStatus, want)
		}
	}
}

// A server that reports "idle" after a finished run: the row cannot say how
// it ended; a look-up reads it. A row whose status and pointers disagree
// (status "running", no active run) is not mistaken for anything.
func TestIdleAfterRunAndDisagreeingRow(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.apply(row("t1", "completed", "r1", "r1", "")) // status says done, r1 still active
	e.want()
	e.apply(row("t1", "idle", "", "r1", ""))
	e.want()
	e.setRuns("t1", fakeRun{id: "r1", status: "completed"})
	e.lookups()
	e.want("completed r1")
	e.apply(row("t1", "idle", "", "r1", ""))
	e.apply(row("t1", "completed", "", "r1", ""))
	e.want("completed r1")
}

func TestQuestionOncePerRequest(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", "q1"))
	e.apply(row("t1", "running", "r1", "r1", "q1"))
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.apply(row("t1", "running", "r1", "r1", "q2"))
	e.want("question q1", "question q2")
}

// A question asked and answered while the connector was not looking (a
// reconnect's snapshot shows the thread changed, with the same run still
// going): the look-up finds it in the thread and reports it once.
func TestQuestionAskedAndAnsweredBetweenObservations(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	r := row("t1", "running", "r1", "r1", "")
	r.UpdatedAt = t3rpc.NewOptString("2026-12-01T10:00:00Z")
	e.apply(r)
	r.UpdatedAt = t3rpc.NewOptString("2026-12-01T10:05:00Z")
	e.snapshot(r)
	e.setRuns("t1", fakeRun{id: "r1", status: "running", requests: []string{"q-missed"}})
	e.lookups()
	e.want("question q-missed")
	if q := e.records()[0].Question; len(q.Questions) != 1 || q.Questions[0].Text != "Which one?" {
		t.Fatalf("question = %+v", q)
	}
	// Inside one chunk (the watcher keeps the rows it folded): asked and
	// answered between two chunks' final rows.
	asked := row("t1", "running", "r1", "r1", "q-folded")
	if err := e.d.Apply(context.Background(), watch.Change{Machine: "m", Passed: watch.RowsOf([]t3rpc.ThreadShell{asked}), Threads: watch.RowsOf([]t3rpc.ThreadShell{row("t1", "running", "r1", "r1", "")})}); err != nil {
		t.Fatal(err)
	}
	e.want("question q-missed", "question q-folded")
}

// Runs that came and went while the connector was away (a snapshot after a
// reconnect shows only the latest): listed from the projection in its order —
// run ids are opaque, nothing is read out of them.
func TestRunsSkippedBySnapshotComeFromTheProjection(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "zz", "zz", ""))
	e.apply(row("t1", "completed", "", "zz", ""))
	e.snapshot(row("t1", "completed", "", "aa", ""))
	e.want("completed zz")
	e.setRuns("t1",
		fakeRun{id: "zz", status: "completed"}, fakeRun{id: "mm", status: "failed", requests: []string{"q-mm"}},
		fakeRun{id: "bb", status: "interrupted"}, fakeRun{id: "aa", status: "completed"})
	e.lookups()
	e.want("completed zz", "question q-mm", "failed mm", "interrupted bb", "completed aa")
	// The same snapshot again, and the rows after it: nothing new.
	e.snapshot(row("t1", "completed", "", "aa", ""))
	e.lookups()
	e.apply(row("t1", "completed", "", "aa", ""))
	e.want("completed zz", "question q-mm", "failed mm", "interrupted bb", "completed aa")
}

// Inside one chunk the watcher folds a thread's rows; the ones it replaced
// (Change.Passed) still show a run that started and ended there.
func TestRunInsideOneChunk(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	err := e.d.Apply(context.Background(), watch.Change{Machine: "m",
		Passed:  watch.RowsOf([]t3rpc.ThreadShell{row("t1", "running", "r1", "r1", ""), row("t1", "completed", "", "r1", ""), row("t1", "running", "r2", "r2", "")}),
		Threads: watch.RowsOf([]t3rpc.ThreadShell{row("t1", "completed", "", "r2", "")})})
	if err != nil {
		t.Fatal(err)
	}
	e.want("completed r1", "completed r2")
	if e.reads != 0 {
		t.Fatalf("%d reads", e.reads)
	}
}

// A run the rows named that T3 no longer lists is reported in the log and
// left, never retried forever; the other runs still get their events.
func TestUnknownRunDoesNotStallTheThread(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.apply(row("t1", "running", "r2", "r2", ""))
	e.setRuns("t1", fakeRun{id: "r2", status: "running"})
	if n := e.lookups(); n != 0 {
		t.Fatalf("%d look-ups pending", n)
	}
	e.apply(row("t1", "completed", "", "r2", ""))
	e.want("completed r2")
}

// One thread whose reads fail: Apply goes on for every thread (no error, no
// read), the failing thread is retried and its events come once it recovers.
func TestFailingThreadIsRetriedAlone(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("bad", "", &t3rpc.ThreadShell{ID: "bad", Status: "idle"})
	e.watchThread("good", "", &t3rpc.ThreadShell{ID: "good", Status: "idle"})
	e.apply(row("bad", "running", "b1", "b1", ""), row("good", "running", "g1", "g1", ""))
	e.setFail("bad", errors.New("HTTP 500"))
	e.apply(row("bad", "running", "b2", "b2", ""), row("good", "completed", "", "g1", ""))
	if n := e.lookups(); n != 1 {
		t.Fatalf("%d look-ups pending, want the bad thread's", n)
	}
	if s := e.d.Lookups()["m"]; s.Pending != 1 || s.Failing != 1 {
		t.Fatalf("look-ups = %+v", s)
	}
	e.apply(row("good", "running", "g2", "g2", ""))
	e.apply(row("good", "completed", "", "g2", ""))
	e.apply(row("bad", "completed", "", "b2", "")) // held behind b1's look-up: order kept
	e.want("completed g1", "completed g2")
	e.setFail("bad", nil)
	e.setRuns("bad", fakeRun{id: "b1", status: "completed"}, fakeRun{id: "b2", status: "completed"})
	e.d.lookups.mu.Lock()
	for _, task := range e.d.lookups.tasks {
		task.next = time.Time{}
	}
	e.d.lookups.mu.Unlock()
	if n := e.lookups(); n != 0 {
		t.Fatalf("%d look-ups pending after recovery", n)
	}
	e.want("completed g1", "completed g2", "completed b1", "completed b2")
}

// A look-up note survives a restart: the next process reads the thread.
func TestLookupNoteSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	e.watchThread("t1", "o", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.apply(row("t1", "running", "r2", "r2", ""))
	e.st.Close()

	e2 := newEnv(t, dir)
	e2.setRuns("t1", fakeRun{id: "r1", status: "completed"}, fakeRun{id: "r2", status: "running"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e2.d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for len(e2.kinds()) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	e2.want("completed r1")
}

func TestUnwatchedAndBaselineProduceNothing(t *testing.T) {
	e := newEnv(t, "")
	// Watched from a thread that already completed long ago: no event for the past.
	old := row("t1", "completed", "", "r0", "")
	e.watchThread("t1", "", &old)
	e.apply(old)
	// Not tracked at all.
	e.apply(row("t2", "completed", "", "r9", ""))
	// Tracked but watch off.
	if err := e.st.PutThread(store.Thread{ID: "t3", Machine: "m", Watch: false}); err != nil {
		t.Fatal(err)
	}
	e.apply(row("t3", "failed", "", "r3", ""))
	e.want()
}

// A transition that happened while the connector was down is emitted once
// after restart, from the persisted last-seen state. The run's start was not
// committed (seen.sameDurable): the snapshot shows a latest run the store does
// not know, and its look-up reports it.
func TestTransitionWhileDownEmittedOnceAfterRestart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	e.watchThread("t1", "o", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	e.st.Close()

	e2 := newEnv(t, dir)
	e2.setRuns("t1", fakeRun{id: "r1", status: "completed"})
	done := row("t1", "completed", "", "r1", "")
	e2.snapshot(done)
	if n := e2.lookups(); n != 0 {
		t.Fatalf("%d look-ups still pending", n)
	}
	e2.apply(done)
	e2.want("completed r1")
}

// Track writes the tracked thread and its baseline together; tracking an
// already watched thread again (a follow-up dispatch) keeps the detector's
// state, so a run in progress still gets its event; turning the watch off
// drops the state with it.
func TestTrackBaselinesOnlyWhenWatchStarts(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "o", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(row("t1", "running", "r1", "r1", ""))
	done := row("t1", "completed", "", "r1", "")
	if err := e.d.Track("m", store.Thread{ID: "t1", Machine: "m", Watch: true, LastMessageID: "msg-2"}, &done); err != nil {
		t.Fatal(err)
	}
	if tr, ok, _ := e.st.GetThread("t1"); !ok || tr.LastMessageID != "msg-2" {
		t.Fatalf("thread record = %+v %v", tr, ok)
	}
	e.apply(done)
	e.want("completed r1")
	if err := e.d.Track("m", store.Thread{ID: "t1", Machine: "m", Watch: false}, &done); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := e.st.Detector(key("m", "t1")); ok {
		t.Fatal("detector state kept for an unwatched thread")
	}
	if err := e.d.Track("m", store.Thread{ID: "t1", Machine: "other", Watch: true}, &done); err == nil {
		t.Fatal("a thread recorded on another machine than the one named")
	}
}

// Unwatched threads past the retention are forgotten, with any detector state
// left behind; watched ones stay whatever their age.
func TestPrune(t *testing.T) {
	e := newEnv(t, "")
	now := time.Now()
	e.d.now = func() time.Time { return now }
	old := now.Add(-DefaultRetention - time.Hour)
	for _, tr := range []store.Thread{
		{ID: "old-unwatched", Machine: "m", UpdatedAt: old},
		{ID: "new-unwatched", Machine: "m", UpdatedAt: now},
		{ID: "old-watched", Machine: "m", Watch: true, UpdatedAt: old},
	} {
		if err := e.d.Track("m", tr, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Detector state whose thread is gone (a dispatch that failed).
	if err := e.st.Commit(store.Batch{Detector: map[string][]byte{key("m", "gone"): []byte(`{}`)}}); err != nil {
		t.Fatal(err)
	}
	n, err := e.d.Prune()
	if err != nil || n != 1 {
		t.Fatalf("pruned %d (%v), want 1", n, err)
	}
	left, _ := e.st.ListThreads()
	if len(left) != 2 {
		t.Fatalf("threads left: %+v", left)
	}
	if _, ok, _ := e.st.Detector(key("m", "gone")); ok {
		t.Fatal("orphan detector state kept")
	}
	if _, ok, _ := e.st.Detector(key("m", "old-watched")); !ok {
		t.Fatal("a watched thread lost its state")
	}
}

// countingTracked counts the reads of tracked threads.
type countingTracked struct {
	store.Store
	mu          sync.Mutex
	one, many   int
	failGetOne  error
	staleListed bool // ListThreads answers as if no thread were tracked
}

func (c *countingTracked) GetThread(id string) (store.Thread, bool, error) {
	c.mu.Lock()
	c.one++
	err := c.failGetOne
	c.mu.Unlock()
	if err != nil {
		return store.Thread{}, false, err
	}
	return c.Store.GetThread(id)
}

func (c *countingTracked) GetThreads(ids []string) (map[string]store.Thread, error) {
	c.mu.Lock()
	c.many++
	err := c.failGetOne
	c.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return c.Store.GetThreads(ids)
}

func (c *countingTracked) ListThreads() ([]store.Thread, error) {
	if c.staleListed {
		return nil, nil
	}
	return c.Store.ListThreads()
}

// A chunk costs one read of the tracked threads, whatever its size: the rows'
// records are looked up together, not one read transaction per row.
func TestApplyReadsTrackedThreadsOncePerChunk(t *testing.T) {
	e := newEnv(t, "")
	ct := &countingTracked{Store: e.st}
	e.d = New(Options{Store: store.NewGroup(e.st), Tracked: ct, Read: ReaderFunc(e.read), Logger: quiet()})
	var rows []t3rpc.ThreadShell
	for i := range 60 {
		id := fmt.Sprintf("t%02d", i)
		if i%3 == 0 {
			base := row(id, "running", "r1", "r1", "")
			e.watchThread(id, "o", &base)
		}
		rows = append(rows, row(id, "completed", "", "r1", ""))
	}
	ct.mu.Lock()
	ct.one, ct.many = 0, 0
	ct.mu.Unlock()
	// The chunk passes over some rows too (watch.Change.Passed).
	if err := e.d.Apply(context.Background(), watch.Change{Machine: "m", Passed: watch.RowsOf(rows[:10]), Threads: watch.RowsOf(rows)}); err != nil {
		t.Fatal(err)
	}
	if ct.one != 0 || ct.many != 1 {
		t.Fatalf("one chunk of %d rows read tracked threads %d times one by one and %d times together, want 0 and 1", len(rows)+10, ct.one, ct.many)
	}
	if got := len(e.records()); got != 20 {
		t.Fatalf("%d events, want one per watched thread (20)", got)
	}
}

// Run prunes every PruneEvery (T3CODE_MCP_PRUNE_INTERVAL), not only hourly: a
// thread that passes its retention while the detector runs is forgotten at
// the next prune.
func TestRunPrunesEveryInterval(t *testing.T) {
	e := newEnv(t, "")
	e.d = New(Options{Store: store.NewGroup(e.st), Tracked: e.st, Read: ReaderFunc(e.read), Logger: quiet(),
		Retention: time.Hour, PruneEvery: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Recorded after Run's first prune may have happened: only a later one removes it.
	if err := e.d.Track("m", store.Thread{ID: "stale", Machine: "m", UpdatedAt: time.Now().Add(-2 * time.Hour)}, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, ok, _ := e.st.GetThread("stale"); !ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the stale thread was never pruned while Run ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
