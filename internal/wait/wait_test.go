package wait

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rows is a Source whose thread row the test changes, waking waiters the way
// the watcher does.
type rows struct {
	mu    sync.Mutex
	row   t3rpc.ThreadShell
	ok    bool
	gone  string
	wake  chan struct{}
	reads int
}

func newRows() *rows { return &rows{wake: make(chan struct{})} }

func (r *rows) ThreadAndWait(string) (t3rpc.ThreadShell, bool, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	return r.row, r.ok, r.wake
}

func (r *rows) Gone(string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gone, r.gone != ""
}

// set puts a row without an activeRunId field (an older server's row).
func (r *rows) set(status, latest string, pending *t3rpc.PendingRuntimeRequest) {
	r.put(row{status: status, latest: latest, pending: pending, noActive: true})
}

// row is a shell row by its run pointers.
type row struct {
	status, active, latest string
	noActive               bool // leave activeRunId out (not even null)
	pending                *t3rpc.PendingRuntimeRequest
}

func (r *rows) put(x row) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.row = t3rpc.ThreadShell{ID: "t1", Status: x.status}
	if x.latest != "" {
		r.row.LatestRunId = t3rpc.NewOptNilString(x.latest)
	}
	switch {
	case x.active != "":
		r.row.ActiveRunId = t3rpc.NewOptNilString(x.active)
	case !x.noActive:
		r.row.ActiveRunId = t3rpc.OptNilString{Set: true, Null: true}
	}
	if x.pending != nil {
		r.row.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(*x.pending)
	}
	r.ok = true
	close(r.wake)
	r.wake = make(chan struct{})
}

// leave makes the thread leave the watcher's list (archive or removed).
func (r *rows) leave(where string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ok, r.gone = false, where
	close(r.wake)
	r.wake = make(chan struct{})
}

// runs is the thread as T3 would answer a read: runs by id, with the message
// that made each.
type runs struct {
	mu    sync.Mutex
	list  []t3api.Run
	reads int
}

func (rs *runs) read(context.Context) (*t3api.ThreadProjection, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.reads++
	return &t3api.ThreadProjection{Thread: t3api.AppThread{ID: "t1"}, Runs: append([]t3api.Run(nil), rs.list...)}, nil
}

func (rs *runs) put(msg, run, status string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for i := range rs.list {
		if rs.list[i].ID == run {
			rs.list[i].Status = status
			return
		}
	}
	rs.list = append(rs.list, t3api.Run{ID: run, Ordinal: int64(len(rs.list) + 1), Status: status, UserMessageId: t3api.NewOptNilString(msg)})
}

func (rs *runs) count() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.reads
}

type result struct {
	r   Result
	err error
}

func start(ctx context.Context, src Source, t Target, o Options) chan result {
	ch := make(chan result, 1)
	go func() {
		r, err := Wait(ctx, src, t, o)
		ch <- result{r, err}
	}()
	return ch
}

func expectPending(t *testing.T, ch chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("wait returned early: %+v %v", r.r, r.err)
	case <-time.After(20 * time.Millisecond):
	}
}

func receive(t *testing.T, ch chan result) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return")
	}
	return result{}
}

func TestSettledLatestRunReturnsAtOnce(t *testing.T) {
	for status, want := range map[string]Reason{"completed": Completed, "interrupted": Interrupted, "failed": Failed, "cancelled": Interrupted} {
		src := newRows()
		src.set(status, "run-1", nil)
		r := receive(t, start(context.Background(), src, Target{ThreadID: "t1"}, Options{}))
		if r.err != nil || r.r.Reason != want || r.r.RunID != "run-1" {
			t.Errorf("%s: got %+v %v, want %s", status, r.r, r.err, want)
		}
	}
}

func TestWaitingIsNotCompleted(t *testing.T) {
	src := newRows()
	src.set("waiting", "run-1", nil)
	ch := start(context.Background(), src, Target{ThreadID: "t1"}, Options{})
	expectPending(t, ch)
	src.set("completed", "run-1", nil)
	if r := receive(t, ch); r.r.Reason != Completed {
		t.Fatalf("got %+v", r.r)
	}
}

// Right after a dispatch the thread still shows the previous, settled run: the
// wait must hold until T3 makes the run for our message and that run settles.
func TestWaitsForDispatchedRunNotThePreviousOne(t *testing.T) {
	src := newRows()
	src.set("completed", "run-1", nil)
	rs := &runs{}
	rs.put("msg-0", "run-1", "completed")
	src.put(row{status: "running", active: "run-0", latest: "run-0"}) // an unrelated run is busy: T3 has not made ours yet
	ch := start(context.Background(), src, Target{ThreadID: "t1", MessageID: "msg-2"}, Options{Read: rs.read})
	expectPending(t, ch)
	rs.put("msg-2", "run-2", "running")
	src.set("running", "run-2", nil)
	expectPending(t, ch)
	rs.put("msg-2", "run-2", "failed")
	src.set("failed", "run-2", nil)
	r := receive(t, ch)
	if r.r.Reason != Failed || r.r.RunID != "run-2" {
		t.Fatalf("got %+v", r.r)
	}
}

// Our run settled and another run started before the wait looked: the wait
// reports our run's outcome, read through the lookup.
func TestOurRunSettledBehindALaterRun(t *testing.T) {
	src := newRows()
	src.set("running", "run-3", nil)
	rs := &runs{}
	rs.put("msg-2", "run-2", "interrupted")
	r := receive(t, start(context.Background(), src, Target{ThreadID: "t1", MessageID: "msg-2"}, Options{Read: rs.read}))
	if r.r.Reason != Interrupted || r.r.RunID != "run-2" {
		t.Fatalf("got %+v", r.r)
	}
}

func TestQuestionWakesAndAnsweredQuestionDoesNot(t *testing.T) {
	src := newRows()
	src.set("running", "run-1", &t3rpc.PendingRuntimeRequest{ID: "req-old", Kind: "user_input"})
	ch := start(context.Background(), src, Target{ThreadID: "t1", Answered: map[string]bool{"req-old": true}}, Options{})
	expectPending(t, ch)
	src.set("running", "run-1", &t3rpc.PendingRuntimeRequest{ID: "req-new", Kind: "user_input"})
	r := receive(t, ch)
	if r.r.Reason != Question || r.r.RequestID != "req-new" {
		t.Fatalf("got %+v", r.r)
	}
}

func TestTimeoutAndCancel(t *testing.T) {
	src := newRows()
	src.set("running", "run-1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	r := receive(t, start(ctx, src, Target{ThreadID: "t1"}, Options{}))
	if r.err != nil || r.r.Reason != Timeout {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	ch := start(ctx2, src, Target{ThreadID: "t1"}, Options{})
	expectPending(t, ch)
	cancel2()
	if r := receive(t, ch); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
}

// The wait is woken by changes, not a polling loop: with nothing changing it
// reads the row once, however long it waits.
func TestNoPolling(t *testing.T) {
	src := newRows()
	src.set("running", "run-1", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	receive(t, start(ctx, src, Target{ThreadID: "t1"}, Options{}))
	src.mu.Lock()
	defer src.mu.Unlock()
	if src.reads != 1 {
		t.Fatalf("row read %d times while nothing changed, want 1", src.reads)
	}
}

func TestProgress(t *testing.T) {
	src := newRows()
	src.set("running", "run-1", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan time.Duration, 10)
	ch := start(ctx, src, Target{ThreadID: "t1"}, Options{ProgressEvery: 5 * time.Millisecond, Progress: func(d time.Duration, _ t3rpc.ThreadShell) {
		select {
		case got <- d:
		default:
		}
	}})
	<-got
	<-got
	src.set("completed", "run-1", nil)
	if r := receive(t, ch); r.r.Reason != Completed {
		t.Fatalf("got %+v", r.r)
	}
}

// waitOn starts a wait for run on the rows, reading through rs.
func waitOn(src *rows, rs *runs, tg Target) chan result {
	tg.ThreadID = "t1"
	return start(context.Background(), src, tg, Options{Read: rs.read})
}

// A follow-up sent to a busy thread is queued (fixture 21): the row's status
// says "queued" (it follows the newest run) while run 1 still runs. The wait
// for the queued run holds through run 1's end and its own start, ends when it
// completes, and reads nothing: the row says it all.
func TestQueuedFollowUpNeedsNoRead(t *testing.T) {
	src, rs := newRows(), &runs{}
	src.put(row{status: "queued", active: "run-1", latest: "run-2"})
	ch := waitOn(src, rs, Target{RunID: "run-2"})
	expectPending(t, ch)
	src.put(row{status: "queued", latest: "run-2"}) // run 1 over, run 2 not started yet
	expectPending(t, ch)
	src.put(row{status: "running", active: "run-2", latest: "run-2"})
	expectPending(t, ch)
	src.put(row{status: "completed", latest: "run-2"})
	r := receive(t, ch)
	if r.err != nil || r.r.Reason != Completed || r.r.RunID != "run-2" {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
	if n := rs.count(); n != 0 || r.r.Reads != 0 {
		t.Errorf("%d reads (result says %d), want 0", n, r.r.Reads)
	}
}

// The wait for run 1 while run 2 is queued behind it: the row's status is
// about run 2, so run 1's end is read from its own record, once.
func TestActiveRunEndsBehindAQueuedOne(t *testing.T) {
	src, rs := newRows(), &runs{}
	rs.put("m1", "run-1", "running")
	rs.put("m2", "run-2", "queued")
	src.put(row{status: "queued", active: "run-1", latest: "run-2"})
	ch := waitOn(src, rs, Target{RunID: "run-1"})
	expectPending(t, ch)
	if n := rs.count(); n != 0 {
		t.Fatalf("%d reads while run 1 is the active run", n)
	}
	rs.put("m1", "run-1", "interrupted")
	rs.put("m2", "run-2", "starting")
	src.put(row{status: "starting", active: "run-2", latest: "run-2"})
	r := receive(t, ch)
	if r.err != nil || r.r.Reason != Interrupted || r.r.RunID != "run-1" || r.r.Projection == nil {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
	if n := rs.count(); n != 1 {
		t.Errorf("%d reads, want 1", n)
	}
}

// The newest queued run cancelled while run 1 runs on: the row says
// "cancelled" with run 1 still active. The wait for run 2 ends (cancelled
// reads as interrupted); the wait for run 1 does not.
func TestCancelledNewestQueuedRun(t *testing.T) {
	src, rs := newRows(), &runs{}
	src.put(row{status: "cancelled", active: "run-1", latest: "run-2"})
	r := receive(t, waitOn(src, rs, Target{RunID: "run-2"}))
	if r.err != nil || r.r.Reason != Interrupted || r.r.RunID != "run-2" {
		t.Fatalf("run 2: got %+v %v", r.r, r.err)
	}
	ch := waitOn(src, rs, Target{RunID: "run-1"})
	expectPending(t, ch)
	src.put(row{status: "completed", latest: "run-1"}) // (a server that drops the cancelled run's pointer)
	if r := receive(t, ch); r.r.Reason != Completed || r.r.RunID != "run-1" {
		t.Fatalf("run 1: got %+v %v", r.r, r.err)
	}
}

// A server that reports "idle" after a run: the row cannot say how the run
// ended, so the run is read once and the read is handed back for rendering.
func TestIdleAfterAFinishedRun(t *testing.T) {
	src, rs := newRows(), &runs{}
	rs.put("m1", "run-1", "running")
	src.put(row{status: "running", active: "run-1", latest: "run-1"})
	ch := waitOn(src, rs, Target{RunID: "run-1"})
	expectPending(t, ch)
	rs.put("m1", "run-1", "failed")
	src.put(row{status: "idle", latest: "run-1"})
	r := receive(t, ch)
	if r.err != nil || r.r.Reason != Failed || r.r.Projection == nil || r.r.Reads != 1 {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
}

// Status and active run disagree: the row says "completed" (about the newest
// run) while our run is still active; the wait holds until the pointer moves.
func TestStatusAndActiveRunDisagree(t *testing.T) {
	src, rs := newRows(), &runs{}
	rs.put("m1", "run-1", "running")
	src.put(row{status: "completed", active: "run-1", latest: "run-2"})
	ch := waitOn(src, rs, Target{RunID: "run-1"})
	expectPending(t, ch)
	rs.put("m1", "run-1", "completed")
	src.put(row{status: "completed", latest: "run-2"})
	if r := receive(t, ch); r.r.Reason != Completed || r.r.RunID != "run-1" {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
}

// A question of the active run is not the queued run's: the wait for the
// queued run holds, and returns question only once its own run asks.
func TestQuestionOfAnotherRunIsNotOurs(t *testing.T) {
	src, rs := newRows(), &runs{}
	other := &t3rpc.PendingRuntimeRequest{ID: "req-run-1", Kind: "user_input"}
	src.put(row{status: "queued", active: "run-1", latest: "run-2", pending: other})
	ch := waitOn(src, rs, Target{RunID: "run-2"})
	expectPending(t, ch)
	// The same request seen by a wait on run 1 is a question.
	if r := receive(t, waitOn(src, rs, Target{RunID: "run-1"})); r.r.Reason != Question || r.r.RequestID != "req-run-1" {
		t.Fatalf("run 1: got %+v %v", r.r, r.err)
	}
	mine := &t3rpc.PendingRuntimeRequest{ID: "req-run-2", Kind: "command"}
	src.put(row{status: "running", active: "run-2", latest: "run-2", pending: mine})
	r := receive(t, ch)
	if r.r.Reason != Question || r.r.RequestID != "req-run-2" || r.r.RunID != "run-2" {
		t.Fatalf("run 2: got %+v %v", r.r, r.err)
	}
}

// A thread archived while waited on ends the wait with archived, not a
// timeout; a deleted one ends it with an error.
func TestArchivedAndRemoved(t *testing.T) {
	src, rs := newRows(), &runs{}
	src.put(row{status: "running", active: "run-1", latest: "run-1"})
	ch := waitOn(src, rs, Target{RunID: "run-1"})
	expectPending(t, ch)
	src.leave("archive")
	if r := receive(t, ch); r.err != nil || r.r.Reason != Archived || r.r.RunID != "run-1" || r.r.Shell.ID != "t1" {
		t.Fatalf("archived: got %+v %v", r.r, r.err)
	}
	src2 := newRows()
	src2.put(row{status: "running", active: "run-1", latest: "run-1"})
	ch = waitOn(src2, rs, Target{RunID: "run-1"})
	expectPending(t, ch)
	src2.leave("removed")
	if r := receive(t, ch); !errors.Is(r.err, ErrThreadRemoved) {
		t.Fatalf("removed: got %+v %v", r.r, r.err)
	}
}

// A message T3 made no run of (a dispatch refused by an older connector that
// kept its message id) on an idle thread: the wait returns at once with what
// there is instead of waiting for a run that will never exist.
func TestMessageWithoutARunOnAnIdleThread(t *testing.T) {
	src, rs := newRows(), &runs{}
	rs.put("m1", "run-1", "completed")
	src.put(row{status: "completed", latest: "run-1"})
	r := receive(t, waitOn(src, rs, Target{MessageID: "never-made-a-run"}))
	if r.err != nil || r.r.Reason != Idle || r.r.RunID != "run-1" || r.r.Reads != 1 {
		t.Fatalf("got %+v %v", r.r, r.err)
	}
}

// TestBlockedOnceWhenTheWaitBlocks: Options.Blocked (t3_wait subscribes to
// the thread there) is called once when the wait first blocks, not again at
// later wakes, and never for a wait that ends at once.
func TestBlockedOnceWhenTheWaitBlocks(t *testing.T) {
	r := newRows()
	r.put(row{status: "completed", latest: "run-1"})
	blocked := 0
	res, err := Wait(context.Background(), r, Target{ThreadID: "t1", RunID: "run-1"}, Options{Blocked: func() Feed { blocked++; return nil }})
	if err != nil || res.Reason != Completed || blocked != 0 {
		t.Fatalf("a settled run: %+v %v, Blocked called %d times; want none", res, err, blocked)
	}

	r.put(row{status: "running", active: "run-2", latest: "run-2"})
	calls := make(chan struct{}, 10)
	done := make(chan Result, 1)
	go func() {
		res, _ := Wait(context.Background(), r, Target{ThreadID: "t1", RunID: "run-2"}, Options{Blocked: func() Feed { calls <- struct{}{}; return nil }})
		done <- res
	}()
	<-calls
	r.put(row{status: "running", active: "run-2", latest: "run-2"}) // a wake that does not end it
	r.put(row{status: "completed", latest: "run-2"})
	if res := <-done; res.Reason != Completed {
		t.Fatalf("result %+v", res)
	}
	if n := len(calls); n != 0 {
		t.Fatalf("Blocked called %d more times after the first", n)
	}
}
