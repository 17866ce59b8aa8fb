package events

import (
	"context"
	"encoding/json"
	"testing"

	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	t      *testing.T
	dir    string
	st     *store.Store
	d      *Detector
	runs   map[string]string // run id → status, for RunStatus
	reads  int
	notify int
}

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
	e := &env{t: t, dir: dir, st: st, runs: map[string]string{}}
	read := func(_ context.Context, _, threadID string) (*t3api.ThreadProjection, error) {
		e.reads++
		p := &t3api.ThreadProjection{Thread: t3api.AppThread{ID: threadID, Title: "T"}}
		for id, status := range e.runs {
			p.Runs = append(p.Runs, t3api.Run{ID: id, ThreadId: threadID, Status: status})
			p.TurnItems = append(p.TurnItems, t3api.TurnItem{ID: "i-" + id, Type: "assistant_message", Ordinal: 1, RunId: t3api.NewOptNilString(id), Text: t3api.NewOptString("reply of " + id)})
		}
		return p, nil
	}
	e.d = New(Options{
		Store: st, Tracked: st, Build: NewBuilder(read, nil),
		RunStatus: func(_ context.Context, _, _, runID string) (string, bool, error) {
			s, ok := e.runs[runID]
			return s, ok, nil
		},
		Notify: func() { e.notify++ },
	})
	return e
}

func shell(id, status, run string, pending string) t3rpc.ThreadShell {
	s := t3rpc.ThreadShell{ID: id, ProjectId: "p1", Title: "T", Status: status}
	if run != "" {
		s.LatestRunId = t3rpc.NewOptNilString(run)
	}
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
	if err := e.d.Apply(context.Background(), watch.Change{Machine: "m", Threads: threads}); err != nil {
		e.t.Fatal(err)
	}
}

type body struct {
	ID, Type, Machine, RunID, Origin, Summary string
	ThreadID                                  string `json:"thread_id"`
	Run                                       string `json:"run_id"`
	Project                                   struct{ ID, Title string }
	Question                                  *struct {
		RequestID string `json:"request_id"`
	}
}

func (e *env) events() []body {
	e.t.Helper()
	evs, err := e.st.Pending(1000)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []body
	for _, ev := range evs {
		var b body
		if err := json.Unmarshal(ev.Body, &b); err != nil {
			e.t.Fatal(err)
		}
		if b.ID != ev.ID || ev.Stream != "m/"+b.ThreadID {
			e.t.Fatalf("record %s/%s does not match body %+v", ev.ID, ev.Stream, b)
		}
		out = append(out, b)
	}
	return out
}

func TestRunCompletesOnceAcrossReplays(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "chat-42", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(shell("t1", "running", "r1", ""))
	e.apply(shell("t1", "waiting", "r1", ""))
	if n := len(e.events()); n != 0 {
		t.Fatalf("waiting produced %d events", n)
	}
	e.runs["r1"] = "completed"
	done := shell("t1", "completed", "r1", "")
	e.apply(done)
	e.apply(done) // replayed after a reconnect
	e.apply(done)
	evs := e.events()
	if len(evs) != 1 {
		t.Fatalf("got %d events, want 1: %+v", len(evs), evs)
	}
	ev := evs[0]
	if ev.Type != "thread.completed" || ev.Run != "r1" || ev.Origin != "chat-42" || ev.Summary != "reply of r1" || ev.Project.Title != "proj" {
		t.Fatalf("event = %+v", ev)
	}
	if e.notify != 1 {
		t.Errorf("outbox notified %d times, want 1", e.notify)
	}
}

// A run dispatched right after the previous one settled: the stream (after a
// reconnect, or coalesced) shows only the new run running. The earlier run's
// event must still be emitted, read from the machine.
func TestEarlierRunNotLostWhenNextRunStarts(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(shell("t1", "running", "r1", ""))
	e.runs["r1"] = "failed"
	e.runs["r2"] = "running"
	e.apply(shell("t1", "running", "r2", ""))
	evs := e.events()
	if len(evs) != 1 || evs[0].Type != "thread.failed" || evs[0].Run != "r1" {
		t.Fatalf("events = %+v", evs)
	}
	e.runs["r2"] = "interrupted"
	e.apply(shell("t1", "interrupted", "r2", ""))
	evs = e.events()
	if len(evs) != 2 || evs[1].Type != "thread.interrupted" || evs[1].Run != "r2" {
		t.Fatalf("events = %+v", evs)
	}
}

func TestQuestionOncePerRequest(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(shell("t1", "running", "r1", "q1"))
	e.apply(shell("t1", "running", "r1", "q1"))
	e.apply(shell("t1", "running", "r1", ""))
	e.apply(shell("t1", "running", "r1", "q2"))
	evs := e.events()
	if len(evs) != 2 || evs[0].Question == nil || evs[0].Question.RequestID != "q1" || evs[1].Question.RequestID != "q2" {
		t.Fatalf("events = %+v", evs)
	}
}

func TestUnwatchedAndBaselineProduceNothing(t *testing.T) {
	e := newEnv(t, "")
	// Watched from a thread that already completed long ago: no event for the past.
	old := shell("t1", "completed", "r0", "")
	e.watchThread("t1", "", &old)
	e.apply(old)
	// Not tracked at all.
	e.apply(shell("t2", "completed", "r9", ""))
	// Tracked but watch off.
	if err := e.st.PutThread(store.Thread{ID: "t3", Machine: "m", Watch: false}); err != nil {
		t.Fatal(err)
	}
	e.apply(shell("t3", "failed", "r3", ""))
	if evs := e.events(); len(evs) != 0 {
		t.Fatalf("events = %+v", evs)
	}
}

// A transition that happened while the connector was down is emitted once
// after restart, from the persisted last-seen state.
func TestTransitionWhileDownEmittedOnceAfterRestart(t *testing.T) {
	dir := t.TempDir()
	e := newEnv(t, dir)
	e.watchThread("t1", "o", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(shell("t1", "running", "r1", ""))
	e.st.Close()

	e2 := newEnv(t, dir)
	e2.runs["r1"] = "completed"
	snap := shell("t1", "completed", "r1", "")
	if err := e2.d.Apply(context.Background(), watch.Change{Machine: "m", Snapshot: true, Threads: []t3rpc.ThreadShell{snap}}); err != nil {
		t.Fatal(err)
	}
	e2.apply(snap)
	evs := e2.events()
	if len(evs) != 1 || evs[0].Type != "thread.completed" {
		t.Fatalf("events = %+v", evs)
	}
}

// A run the thread moved past while it was still checkpointing (T3 started a
// queued run): its event comes when it settles, however many observations later.
func TestRunPassedOverBeforeSettlingIsReportedWhenItSettles(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(shell("t1", "running", "r1", ""))
	e.runs["r1"] = "waiting"
	e.runs["r2"] = "running"
	e.apply(shell("t1", "running", "r2", ""))
	if evs := e.events(); len(evs) != 0 {
		t.Fatalf("r1 is still checkpointing, got %+v", evs)
	}
	e.apply(shell("t1", "running", "r2", ""))
	e.runs["r1"] = "completed"
	e.apply(shell("t1", "running", "r2", ""))
	e.apply(shell("t1", "running", "r2", ""))
	evs := e.events()
	if len(evs) != 1 || evs[0].Type != "thread.completed" || evs[0].Run != "r1" {
		t.Fatalf("events = %+v", evs)
	}
	e.runs["r2"] = "completed"
	e.apply(shell("t1", "completed", "r2", ""))
	if evs := e.events(); len(evs) != 2 || evs[1].Run != "r2" {
		t.Fatalf("events = %+v", evs)
	}
}

// A chunk that needs a thread's projection several times (a run passed over
// plus the new run's end and a question) reads it from the machine once.
func TestOneReadPerThreadPerChunk(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	reads := 0
	read := CachedRead(func(_ context.Context, _, threadID string) (*t3api.ThreadProjection, error) {
		reads++
		return &t3api.ThreadProjection{
			Thread: t3api.AppThread{ID: threadID},
			Runs: []t3api.Run{
				{ID: "r1", ThreadId: threadID, Ordinal: 1, Status: "completed"},
				{ID: "r2", ThreadId: threadID, Ordinal: 2, Status: "completed"},
			},
		}, nil
	})
	d := New(Options{Store: st, Tracked: st, Build: NewBuilder(read, nil),
		RunStatus: func(ctx context.Context, m, tid, run string) (string, bool, error) {
			p, err := read(ctx, m, tid)
			if err != nil {
				return "", false, err
			}
			for _, r := range p.Runs {
				if r.ID == run {
					return r.Status, true, nil
				}
			}
			return "", false, nil
		}})
	if err := d.Track("m", store.Thread{ID: "t1", Machine: "m", Watch: true}, &t3rpc.ThreadShell{ID: "t1", Status: "idle"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(context.Background(), watch.Change{Machine: "m", Threads: []t3rpc.ThreadShell{shell("t1", "running", "r1", "")}}); err != nil {
		t.Fatal(err)
	}
	if err := d.Apply(context.Background(), watch.Change{Machine: "m", Threads: []t3rpc.ThreadShell{shell("t1", "completed", "r2", "q1")}}); err != nil {
		t.Fatal(err)
	}
	evs, _ := st.Pending(10)
	if len(evs) != 3 {
		t.Fatalf("%d events, want r1 completed, r2 completed, q1", len(evs))
	}
	if reads != 1 {
		t.Fatalf("thread read %d times in one chunk, want 1", reads)
	}
}

// Track writes the tracked thread and its baseline together; tracking an
// already watched thread again (a follow-up dispatch) keeps the detector's
// state, so a run in progress still gets its event; turning the watch off
// drops the state with it.
func TestTrackBaselinesOnlyWhenWatchStarts(t *testing.T) {
	e := newEnv(t, "")
	e.watchThread("t1", "o", &t3rpc.ThreadShell{ID: "t1", Status: "idle"})
	e.apply(shell("t1", "running", "r1", ""))
	// A follow-up dispatch records the thread again, with the row it saw (the
	// run finished meanwhile): no new baseline, so r1's end is still reported.
	done := shell("t1", "completed", "r1", "")
	if err := e.d.Track("m", store.Thread{ID: "t1", Machine: "m", Watch: true, LastMessageID: "msg-2"}, &done); err != nil {
		t.Fatal(err)
	}
	if tr, ok, _ := e.st.GetThread("t1"); !ok || tr.LastMessageID != "msg-2" {
		t.Fatalf("thread record = %+v %v", tr, ok)
	}
	e.apply(done)
	if evs := e.events(); len(evs) != 1 || evs[0].Run != "r1" {
		t.Fatalf("events = %+v", evs)
	}
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
