package watch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder is a Sink that keeps every status a thread was seen in.
type recorder struct {
	mu       sync.Mutex
	statuses map[string][]string
	snaps    int
}

func (r *recorder) Apply(_ context.Context, c watch.Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.statuses == nil {
		r.statuses = map[string][]string{}
	}
	if c.Snapshot {
		r.snaps++
	}
	for _, t := range c.Threads {
		s := r.statuses[t.ID]
		if len(s) == 0 || s[len(s)-1] != t.Status {
			r.statuses[t.ID] = append(s, t.Status)
		}
	}
	return nil
}

func (r *recorder) seen(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.statuses[id]...)
}

type rig struct {
	fake    *t3fake.Server
	client  *t3.Client
	watcher *watch.Watcher
	cancel  context.CancelFunc
	done    chan struct{}
}

func start(t *testing.T, fk *t3fake.Server, sink watch.Sink) *rig {
	t.Helper()
	c, err := t3.NewClient("mac", fk.URL(), fk.Token(), t3.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	connect := func(ctx context.Context) (*effectrpc.Conn, error) {
		if _, err := c.Handshake(ctx); err != nil {
			return nil, err
		}
		return c.DialRPC(ctx)
	}
	w := watch.New("mac", connect, watch.Options{Logger: quiet, Sink: sink, MinBackoff: time.Millisecond, MaxBackoff: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	r := &rig{fake: fk, client: c, watcher: w, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(r.done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second) // generous: only a broken test waits it out
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func (r *rig) dispatch(t *testing.T, projectID, prompt string) string {
	t.Helper()
	tid := t3.NewID("thread")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := t3.Dispatch(ctx, r.watcher.Conn, t3.ThreadCreate(tid, projectID, prompt, t3fakeModel())); err != nil {
		t.Fatal(err)
	}
	if _, err := t3.Dispatch(ctx, r.watcher.Conn, t3.MessageDispatch(tid, t3.NewID("msg"), prompt, prompt)); err != nil {
		t.Fatal(err)
	}
	return tid
}

func TestRunObservedFromStartToEnd(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	rec := &recorder{}
	r := start(t, fk, rec)
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	tid := r.dispatch(t, pid, "do the thing")
	for fk.Pending() > 0 || fk.Step() {
		// Each step is applied before the next: every intermediate state is seen.
		head := fk.Head()
		eventually(t, "cursor to reach head", func() bool { return r.watcher.Status().Cursor >= head })
		fk.Step()
	}
	eventually(t, "completed", func() bool {
		s, ok := r.watcher.Thread(tid)
		return ok && s.Status == "completed"
	})
	got := fmt.Sprint(rec.seen(tid))
	for _, want := range []string{"running", "waiting", "completed"} {
		if !contains(rec.seen(tid), want) {
			t.Fatalf("statuses seen %s, missing %s", got, want)
		}
	}
	if p := r.watcher.Projects(); len(p) != 1 || p[0].Title != "api" {
		t.Fatalf("projects = %v", p)
	}
}

func contains(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// Forced disconnects in the middle of runs: the watcher resumes from its
// cursor, and the event detector (the real one, over a real store) reports
// every run's end exactly once.
func TestDisconnectsMissNoTransitionAndDoubleNone(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{StepDelay: 2 * time.Millisecond})
	pid := fk.AddProject("api", "/srv/api")
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var rr *rig
	read := func(ctx context.Context, _, threadID string) (*t3api.ThreadProjection, error) {
		s, err := rr.client.Thread(ctx, threadID)
		if err != nil {
			return nil, err
		}
		return &s.Projection, nil
	}
	det := events.New(events.Options{Store: st, Tracked: st, Read: events.ReaderFunc(read)})
	lctx, stopLookups := context.WithCancel(context.Background())
	lookupsDone := make(chan struct{})
	go func() { defer close(lookupsDone); det.Run(lctx) }()
	defer func() { stopLookups(); <-lookupsDone }()
	rr = start(t, fk, det)
	eventually(t, "synced", func() bool { return rr.watcher.Status().Synced })

	// Drops every 15 ms, but while commands are being dispatched at most one between two
	// commands answered: a dispatch resends a command whose reply was lost a bounded number of
	// times (t3.Dispatch), and on a loaded machine a round trip can take longer than 15 ms, so
	// drops by the clock alone could cut off every try (CI: "no reply ... after 4 attempts").
	stop := make(chan struct{})
	dropped := make(chan int)
	answered := make(chan struct{}, 1) // a command was answered since the last drop
	dispatching := make(chan struct{}) // closed when every command is answered
	go func() {
		n := 0
		tk := time.NewTicker(15 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				dropped <- n
				return
			case <-tk.C:
				fk.DropConnections()
				n++
			}
			select {
			case <-answered:
			case <-dispatching:
			case <-stop:
				dropped <- n
				return
			}
		}
	}()
	commandAnswered := func() {
		select {
		case answered <- struct{}{}:
		default:
		}
	}
	prompts := []string{"finish", "fail this", "finish again", "fail too", "done"}
	want := map[string]string{}
	for i := 0; i < 20; i++ {
		p := prompts[i%len(prompts)]
		tid := t3.NewID("thread")
		// As t3_dispatch does: the thread is watched from before it exists.
		if err := det.Track("mac", store.Thread{ID: tid, Machine: "mac", Watch: true}, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := t3.Dispatch(ctx, rr.watcher.Conn, t3.ThreadCreate(tid, pid, p, t3fakeModel())); err != nil {
			t.Fatal(err)
		}
		commandAnswered()
		if _, err := t3.Dispatch(ctx, rr.watcher.Conn, t3.MessageDispatch(tid, t3.NewID("msg"), p, p)); err != nil {
			t.Fatal(err)
		}
		commandAnswered()
		cancel()
		want[tid] = "thread.completed"
		if p == "fail this" || p == "fail too" {
			want[tid] = "thread.failed"
		}
	}
	close(dispatching)
	eventually(t, "every run settled on the fake", func() bool {
		for tid := range want {
			if s, _ := fk.ThreadStatus(tid); s != "completed" && s != "failed" {
				return false
			}
		}
		return true
	})
	close(stop)
	drops := <-dropped
	eventually(t, "every event recorded", func() bool {
		evs, _ := st.Pending(1000)
		return len(evs) >= len(want)
	})
	time.Sleep(50 * time.Millisecond) // let a late duplicate, if any, land
	evs, _ := st.Pending(1000)
	got := map[string][]string{}
	for _, e := range evs {
		var b struct {
			Type     string `json:"type"`
			ThreadID string `json:"thread_id"`
		}
		if err := json.Unmarshal(e.Body, &b); err != nil {
			t.Fatal(err)
		}
		got[b.ThreadID] = append(got[b.ThreadID], b.Type)
	}
	for tid, typ := range want {
		if len(got[tid]) != 1 || got[tid][0] != typ {
			t.Errorf("thread %s: events %v, want exactly [%s]", tid, got[tid], typ)
		}
	}
	if drops < 3 || rr.watcher.Status().Reconnects < 3 {
		t.Fatalf("only %d drops / %d reconnects: the test did not exercise reconnects", drops, rr.watcher.Status().Reconnects)
	}
}

// T3 restarted with a replaced database (a lower sequence): the watcher takes
// the snapshot T3 falls back to and its state follows the new head.
func TestSnapshotFallbackAfterReplacedDatabase(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{StepDelay: time.Millisecond})
	pid := fk.AddProject("api", "/srv/api")
	rec := &recorder{}
	r := start(t, fk, rec)
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	tid := r.dispatch(t, pid, "finish")
	eventually(t, "completed", func() bool { s, _ := r.watcher.Thread(tid); return s.Status == "completed" })
	before := r.watcher.Status().Cursor
	rec.mu.Lock()
	snaps := rec.snaps
	rec.mu.Unlock()
	fk.Restart(1)
	eventually(t, "a fresh snapshot", func() bool {
		rec.mu.Lock()
		defer rec.mu.Unlock()
		return rec.snaps > snaps
	})
	if c := r.watcher.Status().Cursor; c >= before {
		t.Fatalf("cursor %d after a replaced database, want below %d (the snapshot's sequence)", c, before)
	}
	// Live items after the fallback are applied, not dropped as "old".
	tid2 := r.dispatch(t, pid, "finish")
	eventually(t, "new run after fallback", func() bool { s, _ := r.watcher.Thread(tid2); return s.Status == "completed" })
}

func TestBadTokenIsReportedAndLiveMachineUnaffected(t *testing.T) {
	dead := t3fake.StartT(t, t3fake.Options{})
	dead.SetUnauthorized(true)
	live := t3fake.StartT(t, t3fake.Options{StepDelay: time.Millisecond})
	pid := live.AddProject("api", "/srv/api")
	bad := start(t, dead, nil)
	good := start(t, live, nil)
	eventually(t, "bad token reported", func() bool {
		err := bad.watcher.Status().LastError
		return err != nil && strings.Contains(err.Error(), "invalid or expired")
	})
	// A machine that never answers at all, beside them.
	unreachable, err := t3.NewClient("gone", "http://127.0.0.1:1", "tok", t3.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w := watch.New("gone", func(ctx context.Context) (*effectrpc.Conn, error) {
		if _, err := unreachable.Handshake(ctx); err != nil {
			return nil, err
		}
		return unreachable.DialRPC(ctx)
	}, watch.Options{Logger: quiet, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	eventually(t, "live synced", func() bool { return good.watcher.Status().Synced })
	tid := good.dispatch(t, pid, "finish")
	eventually(t, "live run completes while the others fail", func() bool { s, _ := good.watcher.Thread(tid); return s.Status == "completed" })
	if w.Status().Online || bad.watcher.Status().Online {
		t.Fatal("dead machines reported online")
	}
}

func t3fakeModel() t3rpc.ModelSelection {
	return t3rpc.ModelSelection{InstanceId: t3fake.ProviderInstance, Model: t3fake.ProviderModel}
}

var quiet = slog.New(slog.DiscardHandler)

// "link lost; reconnecting" is said of a link that was up; a machine that
// never connected says why it cannot, once at warn however often it retries.
func TestLogsSayLinkLostOnlyForALinkThatWasUp(t *testing.T) {
	// A file takes writes from the watchers' goroutines while the test reads it.
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	logs := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	log := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fk := t3fake.StartT(t, t3fake.Options{})
	c, err := t3.NewClient("mac", fk.URL(), fk.Token(), t3.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	up := watch.New("mac", func(ctx context.Context) (*effectrpc.Conn, error) {
		if _, err := c.Handshake(ctx); err != nil {
			return nil, err
		}
		return c.DialRPC(ctx)
	}, watch.Options{Logger: log, MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	var attempts atomic.Int32
	never := watch.New("gone", func(context.Context) (*effectrpc.Conn, error) {
		attempts.Add(1)
		return nil, errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	}, watch.Options{Logger: log, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range []*watch.Watcher{up, never} {
		wg.Add(1)
		go func() { defer wg.Done(); w.Run(ctx) }()
	}
	defer func() { cancel(); wg.Wait() }()

	eventually(t, "mac synced", func() bool { return up.Status().Synced })
	fk.DropConnections()
	eventually(t, "the lost link logged", func() bool {
		return strings.Contains(logs(), `msg="machine link lost; reconnecting" machine=mac`)
	})
	eventually(t, "gone retried", func() bool { return attempts.Load() >= 10 })

	out := logs()
	if n := strings.Count(out, `msg="machine cannot connect; retrying" machine=gone err="dial tcp 127.0.0.1:1: connect: connection refused"`); n != 1 {
		t.Errorf("%d warnings for the machine that never connected after %d attempts, want 1:\n%s", n, attempts.Load(), out)
	}
	if strings.Contains(out, `link lost; reconnecting" machine=gone`) {
		t.Errorf("a machine that was never up is said to have lost its link:\n%s", out)
	}
}

// After a reconnect the machine is not synced (so fleet does not call it
// online) until that session's replay or snapshot is in: with T3's streams
// stalled, the socket is up again but Synced stays false; once the stream
// flows, the replay arrives and Synced is set (issue 13.6).
func TestReconnectIsNotSyncedBeforeItsReplay(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	r := start(t, fk, &recorder{})
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	before := r.watcher.Status().Reconnects
	fk.StallStreams(true)
	fk.DropConnections()
	eventually(t, "the socket up again", func() bool {
		st := r.watcher.Status()
		return st.Online && st.Reconnects > before
	})
	if st := r.watcher.Status(); st.Synced {
		t.Fatalf("synced before the replay arrived: %+v", st)
	}
	fk.StallStreams(false)
	eventually(t, "synced after the replay", func() bool { return r.watcher.Status().Synced })
}

// An archived thread leaves the list, and Gone says why: a wait on it ends
// with archived instead of waiting for a row that does not come back.
func TestArchivedThreadIsGone(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	r := start(t, fk, &recorder{})
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	tid := fk.AddThread(pid, "t", "idle")
	eventually(t, "the row", func() bool { _, ok := r.watcher.Thread(tid); return ok })
	if _, gone := r.watcher.Gone(tid); gone {
		t.Fatal("a listed thread is gone")
	}
	fk.ArchiveThread(tid)
	eventually(t, "archived", func() bool { where, gone := r.watcher.Gone(tid); return gone && where == "archive" })
	if _, ok := r.watcher.Thread(tid); ok {
		t.Fatal("an archived thread is still listed")
	}
}

// A thread archived before the watcher ever connected is in the first
// snapshot's archived list only: the watcher remembers it as archived (with
// its project), so a wait on it says archived, not "not found".
func TestArchivedBeforeFirstSnapshotIsGone(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	tid := fk.AddThread(pid, "archived early", "completed")
	if !fk.ArchiveThread(tid) {
		t.Fatal("the fake did not archive the thread")
	}
	r := start(t, fk, &recorder{})
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	g, gone := r.watcher.GoneThread(tid)
	if !gone || g.Where != "archive" || g.ProjectID != pid || g.Title != "archived early" {
		t.Fatalf("GoneThread(%s) = %+v, %v; want archived in project %s", tid, g, gone, pid)
	}
	if _, ok := r.watcher.Thread(tid); ok {
		t.Fatal("an archived thread is listed")
	}
}

// A deleted thread (thread.removed from the active list) is gone as
// "removed", with the project its row had.
func TestRemovedThreadIsGone(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	rec := &changes{}
	r := start(t, fk, rec)
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	tid := fk.AddThread(pid, "doomed", "idle")
	eventually(t, "the row", func() bool { _, ok := r.watcher.Thread(tid); return ok })
	if !fk.RemoveThread(tid) {
		t.Fatal("the fake did not remove the thread")
	}
	eventually(t, "removed", func() bool { where, gone := r.watcher.Gone(tid); return gone && where == "removed" })
	if g, _ := r.watcher.GoneThread(tid); g.ProjectID != pid {
		t.Fatalf("gone %+v: want the row's project %s", g, pid)
	}
	// The watcher's own state changes before its sink is called: wait for the sink.
	eventually(t, "the sink told the thread left the list (Change.Removed)", func() bool { return rec.removed(tid) })
}

// changes is a Sink that keeps every Change.
type changes struct {
	mu  sync.Mutex
	all []watch.Change
}

func (c *changes) Apply(_ context.Context, ch watch.Change) error {
	// The rows are lent until Apply returns: keep copies.
	ch.Threads, ch.Passed = copyRows(ch.Threads), copyRows(ch.Passed)
	c.mu.Lock()
	c.all = append(c.all, ch)
	c.mu.Unlock()
	return nil
}

func copyRows(rows []*t3rpc.ThreadShell) []*t3rpc.ThreadShell {
	out := make([]*t3rpc.ThreadShell, len(rows))
	for i, r := range rows {
		cp := *r
		out[i] = &cp
	}
	return out
}

func (c *changes) removed(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.all {
		if contains(ch.Removed, id) {
			return true
		}
	}
	return false
}

// passedAndLast returns, over every change, the statuses a thread's rows were
// passed over with (Change.Passed) and the statuses it ended chunks with.
func (c *changes) passedAndLast(id string) (passed, last []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ch := range c.all {
		for _, t := range ch.Passed {
			if t.ID == id {
				passed = append(passed, t.Status)
			}
		}
		for _, t := range ch.Threads {
			if t.ID == id {
				last = append(last, t.Status)
			}
		}
	}
	return passed, last
}

// Rows of one thread folded inside one chunk are not lost: the chunk's Threads
// holds the thread's last row and Passed the earlier ones, in order, so the
// detector sees a run that started and ended within one chunk.
func TestChunkPassesFoldedRows(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	rec := &changes{}
	r := start(t, fk, rec)
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	tid := r.dispatch(t, pid, "do the thing")
	eventually(t, "the row", func() bool { _, ok := r.watcher.Thread(tid); return ok })
	// Hold the stream while the run goes from start to end: its rows then
	// arrive as one chunk.
	fk.StallStreams(true)
	fk.StepAll()
	fk.StallStreams(false)
	// The watcher's own state changes before its sink is called: wait for the sink, not the state.
	eventually(t, "the sink saw completed", func() bool {
		_, last := rec.passedAndLast(tid)
		return contains(last, "completed")
	})
	passed, last := rec.passedAndLast(tid)
	if len(passed) == 0 || !contains(passed, "running") {
		t.Fatalf("rows passed over %v (chunks ended with %v): want the run's earlier rows, running among them", passed, last)
	}
	if last[len(last)-1] != "completed" {
		t.Fatalf("the chunk ended with %v, want completed last", last)
	}
}
