package threadfeed

import (
	"context"
	"fmt"
	"reflect"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// TestLingerSharesCapsExpiresAndCloses: a lingering feed is one subscription
// however often it is asked for, shared with the waits on its thread; at
// most lingerMax linger (the least recently used is let go, and closes once
// no wait holds it); a wait on a full pool takes the place of a feed that
// only lingers; an idle one is let go on its own; Close lets go of all and
// lets none linger after.
func TestLingerSharesCapsExpiresAndCloses(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	a, b, c, d := r.fake.AddThread(pid, "a", "idle"), r.fake.AddThread(pid, "b", "idle"), r.fake.AddThread(pid, "c", "idle"), r.fake.AddThread(pid, "d", "idle")
	streams := func() int64 { return r.fake.Stats().ThreadStreams }
	pool := NewPool(2)
	pool.SetLinger(1, time.Hour)

	fa, ok := pool.Linger("mac", a, r.dial, seedOf(t, r, a))
	if !ok {
		t.Fatal("no lingering feed")
	}
	now(t, fa)
	if again, ok := pool.Linger("mac", a, r.dial, seedOf(t, r, a)); !ok || again != fa {
		t.Fatal("a second t3_thread on the thread got another feed")
	}
	waitA, releaseA, ok := pool.Acquire("mac", a, r.dial)
	if !ok || waitA != fa {
		t.Fatal("a wait on a lingering thread did not share its feed")
	}
	eventually(t, "the feed's stream on T3", func() bool { return streams() == 1 })
	if pool.Lingering() != 1 {
		t.Fatalf("%d lingering, want 1", pool.Lingering())
	}

	// The cap of 1: b takes a's place; a stays open while its wait holds it.
	fb, ok := pool.Linger("mac", b, r.dial, seedOf(t, r, b))
	if !ok {
		t.Fatal("no lingering feed for b")
	}
	now(t, fb)
	eventually(t, "b's stream beside a's, which a's wait holds", func() bool { return streams() == 2 })
	if pool.Lingering() != 1 {
		t.Fatalf("%d lingering, want 1", pool.Lingering())
	}
	releaseA()
	eventually(t, "a's stream to close with its wait", func() bool { return streams() == 1 })

	// A full pool: a wait takes the place of b, which only lingers.
	_, releaseC, ok := pool.Acquire("mac", c, r.dial)
	if !ok {
		t.Fatal("no feed for a wait with room")
	}
	_, releaseD, ok := pool.Acquire("mac", d, r.dial)
	if !ok {
		t.Fatal("a wait on a full pool did not take a lingering feed's place")
	}
	if pool.Lingering() != 0 || pool.Open() != 2 {
		t.Fatalf("%d lingering, %d open; want 0, 2", pool.Lingering(), pool.Open())
	}
	if _, ok := pool.Linger("mac", b, r.dial, seedOf(t, r, b)); ok {
		t.Fatal("a feed lingers beyond the pool's cap, held by waits")
	}
	releaseC()
	releaseD()
	eventually(t, "the waits' streams to close", func() bool { return streams() == 0 })

	// Close lets go of what lingers; nothing lingers after.
	if _, ok := pool.Linger("mac", b, r.dial, seedOf(t, r, b)); !ok {
		t.Fatal("no lingering feed with room")
	}
	pool.Close()
	if _, ok := pool.Linger("mac", b, r.dial, seedOf(t, r, b)); ok {
		t.Fatal("a feed lingers after Close")
	}
	pool.Wait()
	eventually(t, "the lingering stream to close", func() bool { return streams() == 0 })

	// Idle: let go on its own.
	idle := NewPool(2)
	idle.SetLinger(1, time.Millisecond)
	if _, ok := idle.Linger("mac", a, r.dial, seedOf(t, r, a)); !ok {
		t.Fatal("no lingering feed")
	}
	eventually(t, "the idle feed to be let go", func() bool { return idle.Lingering() == 0 && idle.Open() == 0 })
	idle.Wait()
	eventually(t, "the idle stream to close", func() bool { return streams() == 0 })
}

// TestCurrentOnlyWhenLiveAndCaughtUp: a feed answers only with its snapshot
// in, at or past the sequence asked for, and while its stream runs; a failed
// subscription never answers, and the next Linger starts a new one.
func TestCurrentOnlyWhenLiveAndCaughtUp(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	tid := r.fake.AddThread(pid, "t", "idle")
	pool := NewPool(10)
	pool.SetLinger(10, time.Hour)
	defer func() { pool.Close(); pool.Wait() }()
	f, _ := pool.Linger("mac", tid, r.dial, seedOf(t, r, tid))
	st, ok := f.AwaitCurrent(t.Context(), 0, time.Minute, time.Minute) // live
	if !ok {
		t.Fatalf("no snapshot: %v", f.Err())
	}
	if _, ok := f.Current(st.Cursor); !ok {
		t.Fatal("a live feed at the sequence asked for did not answer")
	}
	if _, ok := f.Current(st.Cursor + 1); ok {
		t.Fatal("a feed behind the sequence asked for answered")
	}
	if _, ok := f.AwaitCurrent(t.Context(), st.Cursor+1, time.Minute, time.Millisecond); ok {
		t.Fatal("a feed that stayed behind answered after its wait")
	}
	if _, err := r.fake.StartRun(tid, "write the docs"); err != nil {
		t.Fatal(err)
	}
	r.fake.StepAll()
	head := r.fake.Head()
	eventually(t, "the feed to reach T3's head", func() bool {
		cur, ok := f.Current(head)
		return ok && cur.Runs == 1
	})

	r.fake.FailThreadSubscriptions(true)
	other := r.fake.AddThread(pid, "other", "idle")
	g, _ := pool.Linger("mac", other, r.dial, seedOf(t, r, other))
	eventually(t, "the failed subscription to fail the feed", func() bool { return g.Err() != nil })
	if _, ok := g.Current(0); ok {
		t.Fatal("a failed feed answered")
	}
	r.fake.FailThreadSubscriptions(false)
	h, _ := pool.Linger("mac", other, r.dial, seedOf(t, r, other))
	if h == g {
		t.Fatal("Linger kept a failed feed")
	}
	now(t, h)
}

// renderTurns is t3_thread's rendering of p with turns runs shown.
func renderTurns(p *t3api.ThreadProjection, runs, turns int) mcptools.ThreadState {
	st := threadview.New(p).Render(threadview.Meta{Machine: "mac"}, turns, threadview.DefaultLimits)
	st.RunCount.SetTo(runs)
	return st
}

// TestCompactedFeedRendersAsTheBoundedRead: a feed seeded with a read goes on
// from it (T3 sends it no snapshot), and through many runs holds no more than
// compactAt of them, and still renders, for every number of turns it can
// show, what t3_thread renders from its bounded read.
func TestCompactedFeedRendersAsTheBoundedRead(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true, KeepRuns: -1})
	var snapshots atomic.Int64
	r.fake.OnItemSent(func(kind string, _ int64, _ time.Time) {
		if kind == "thread:snapshot" {
			snapshots.Add(1)
		}
	})
	pid := r.fake.AddProject("api", "/srv/api")
	tid := r.fake.AddThread(pid, "busy", "idle")
	pool := NewPool(10)
	pool.SetLinger(10, time.Hour)
	defer func() { pool.Close(); pool.Wait() }()
	f, _ := pool.Linger("mac", tid, r.dial, seedOf(t, r, tid))
	now(t, f)
	// Runs that end (a reply, a failure), then one left asking a question.
	prompts := []string{"write the docs", "this will fail"}
	for i := range 3*compactAt + 1 {
		prompt := prompts[i%len(prompts)]
		if i == 3*compactAt {
			prompt = "ask a question first"
		}
		if _, err := r.fake.StartRun(tid, prompt); err != nil {
			t.Fatal(err)
		}
		r.fake.StepAll()
		head := r.fake.Head()
		for turns := 1; turns <= keepRuns; turns++ {
			rec, err := r.client.ThreadRecentKeep(context.Background(), tid, t3.Keep{Runs: turns})
			if err != nil {
				t.Fatal(err)
			}
			var cur State
			eventually(t, "the feed to reach T3's head", func() bool {
				var ok bool
				cur, ok = f.Current(head)
				return ok
			})
			if n := len(cur.Projection.Runs); n > compactAt {
				t.Fatalf("run %d: the feed holds %d runs, more than %d", i+1, n, compactAt)
			}
			got, want := renderTurns(cur.Projection, cur.Runs, turns), renderTurns(rec.Projection, rec.RunCount, turns)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("run %d, %d turns: from the feed\n%+v\nfrom the read\n%+v", i+1, turns, got, want)
			}
		}
	}
	if n := snapshots.Load(); n != 0 {
		t.Fatalf("T3 sent %d thread snapshots to a feed seeded with a read, want none", n)
	}
}

// BenchmarkCachedThreadRender is t3_thread's work on a thread whose feed
// lingers: the feed's projection copied out (Current) and rendered, on
// threads of 500, 5,000 and 50,000 turn items (five per run, the fake's
// script). It does not grow with the thread.
func BenchmarkCachedThreadRender(b *testing.B) {
	for _, items := range []int{500, 5_000, 50_000} {
		b.Run(fmt.Sprintf("items=%d", items), func(b *testing.B) {
			r := newRig(b, t3fake.Options{ManualSteps: true, KeepRuns: -1})
			pid := r.fake.AddProject("api", "/srv/api")
			tid := r.fake.AddThread(pid, "big", "idle")
			for i := 0; i < items/5; i++ {
				if _, err := r.fake.StartRun(tid, "write the docs"); err != nil {
					b.Fatal(err)
				}
				r.fake.StepAll()
			}
			pool := NewPool(1)
			pool.SetLinger(1, time.Hour)
			defer func() { pool.Close(); pool.Wait() }()
			f, _ := pool.Linger("mac", tid, r.dial, seedOf(b, r, tid))
			head := r.fake.Head()
			eventually(b, "the feed's snapshot", func() bool { _, ok := f.Current(head); return ok })
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				st, ok := f.Current(head)
				if !ok {
					b.Fatal("the feed stopped answering")
				}
				out := renderTurns(st.Projection, st.Runs, 3)
				if out.RunCount.Value != items/5 {
					b.Fatalf("run count %d, want %d", out.RunCount.Value, items/5)
				}
			}
			// What a lingering feed holds: its projection, measured as the
			// heap one more decoded copy of it takes (the feed's share of
			// T3CODE_MCP_THREAD_FEEDS; the heap of the whole process would
			// count the fake T3's side of the stream too).
			st, _ := f.Current(head)
			js, err := st.Projection.MarshalJSON()
			if err != nil {
				b.Fatal(err)
			}
			heap0 := liveHeap()
			held := new(t3api.ThreadProjection)
			if err := held.Decode(jx.DecodeBytes(js)); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(liveHeap()-heap0), "heap-B/feed")
			runtime.KeepAlive(held)
		})
	}
}

// liveHeap is the heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	runtime.GC() // and what the pools kept for one more (sync.Pool's victims)
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// seedOf is a t3_thread's read of the thread, as it seeds a lingering feed:
// the newest keepRuns runs and the read's sequence.
func seedOf(t testing.TB, r *rig, tid string) *State {
	t.Helper()
	rec, err := r.client.ThreadRecentKeep(context.Background(), tid, t3.Keep{Runs: keepRuns})
	if err != nil {
		t.Fatal(err)
	}
	return &State{Projection: rec.Projection, Runs: rec.RunCount, Cursor: rec.Sequence}
}

// Current is AwaitCurrent without waiting: the feed's projection now, when it
// can answer.
func (f *Feed) Current(atLeast int64) (State, bool) {
	return f.AwaitCurrent(context.Background(), atLeast, 0, 0)
}

// TestFeedSharesItsProjectionUntilItChanges: a feed seeded from a read
// (t3_thread's first call) holds the reader's projection itself and hands
// that same projection to the next call while nothing changed (no copy per
// call); once an event changes the thread, the feed copies before it
// applies it, so the read's projection and a State handed out earlier stay
// exactly as they were while the feed shows the new run.
func TestFeedSharesItsProjectionUntilItChanges(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	tid := r.fake.AddThread(pid, "t", "idle")
	for i := range 2 {
		if _, err := r.fake.StartRun(tid, fmt.Sprintf("attempt %d", i+1)); err != nil {
			t.Fatal(err)
		}
		r.fake.StepAll()
	}
	pool := NewPool(10)
	pool.SetLinger(10, time.Hour)
	defer func() { pool.Close(); pool.Wait() }()
	seed := seedOf(t, r, tid)
	encode := func(p *t3api.ThreadProjection) string {
		var e jx.Encoder
		p.Encode(&e)
		return e.String()
	}
	seeded := encode(seed.Projection)
	f, ok := pool.Linger("mac", tid, r.dial, seed)
	if !ok {
		t.Fatal("no lingering feed")
	}
	st, ok := f.AwaitCurrent(t.Context(), seed.Cursor, time.Minute, time.Minute)
	if !ok {
		t.Fatalf("no state: %v", f.Err())
	}
	if st.Projection != seed.Projection {
		t.Fatal("the feed copied the read's projection though nothing changed")
	}
	again, ok := f.Current(seed.Cursor)
	if !ok || again.Projection != st.Projection {
		t.Fatal("the feed copied its projection for a second call though nothing changed")
	}

	run, err := r.fake.StartRun(tid, "attempt 3")
	if err != nil {
		t.Fatal(err)
	}
	r.fake.StepAll()
	head := r.fake.Head()
	var cur State
	eventually(t, "the feed to show the third run", func() bool {
		var ok bool
		cur, ok = f.Current(head)
		return ok && runCompleted(run)(cur.Projection)
	})
	if cur.Projection == seed.Projection || cur.Runs != 3 {
		t.Fatalf("the feed changed the shared projection in place (%d runs)", cur.Runs)
	}
	if got := encode(seed.Projection); got != seeded {
		t.Fatalf("the read's projection changed under the feed:\nwas %s\nnow %s", seeded, got)
	}
	if runCompleted(run)(st.Projection) || len(st.Projection.Runs) != 2 {
		t.Fatal("a State handed out before the run changed with the feed")
	}
}
