package wait

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rows is a Source whose thread row the test changes, waking waiters the way
// the watcher does.
type rows struct {
	mu    sync.Mutex
	row   t3rpc.ThreadShell
	ok    bool
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

func (r *rows) set(status, latest string, pending *t3rpc.PendingRuntimeRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.row = t3rpc.ThreadShell{ID: "t1", Status: status}
	if latest != "" {
		r.row.LatestRunId = t3rpc.NewOptNilString(latest)
	}
	if pending != nil {
		r.row.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(*pending)
	}
	r.ok = true
	close(r.wake)
	r.wake = make(chan struct{})
}

type runs struct {
	mu sync.Mutex
	m  map[string][2]string // message id → run id, status
}

func (rs *runs) lookup(_ context.Context, msg string) (string, string, bool, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	v, ok := rs.m[msg]
	return v[0], v[1], ok, nil
}

func (rs *runs) put(msg, run, status string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.m[msg] = [2]string{run, status}
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
	rs := &runs{m: map[string][2]string{"msg-0": {"run-1", "completed"}}}
	ch := start(context.Background(), src, Target{ThreadID: "t1", MessageID: "msg-2"}, Options{Lookup: rs.lookup})
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
	rs := &runs{m: map[string][2]string{"msg-2": {"run-2", "interrupted"}}}
	r := receive(t, start(context.Background(), src, Target{ThreadID: "t1", MessageID: "msg-2"}, Options{Lookup: rs.lookup}))
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
