package threadfeed

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// TestPoolSharesCapsAndCloses: waiters on one thread share one subscription,
// closed on T3 when the last releases it; a full pool gives none; a feed whose
// subscription failed says so, and the next waiter gets a new one.
func TestPoolSharesCapsAndCloses(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	a, b := r.fake.AddThread(pid, "a", "idle"), r.fake.AddThread(pid, "b", "idle")
	pool := NewPool(1)
	streams := func() int64 { return r.fake.Stats().ThreadStreams }

	f1, rel1, ok1 := pool.Acquire("mac", a, r.dial)
	f2, rel2, ok2 := pool.Acquire("mac", a, r.dial)
	if !ok1 || !ok2 || f1 != f2 {
		t.Fatalf("two waiters on one thread: %p %v, %p %v; want one shared feed", f1, ok1, f2, ok2)
	}
	now(t, f1) // subscribed, snapshot in
	if _, _, ok := pool.Acquire("mac", b, r.dial); ok {
		t.Fatal("a second thread's feed beyond the cap of 1")
	}
	if n := streams(); n != 1 {
		t.Fatalf("%d streams on T3, want 1", n)
	}
	rel1()
	rel1() // twice is once
	if pool.Open() != 1 || streams() != 1 {
		t.Fatalf("one waiter left: %d feeds, %d streams; want the feed kept", pool.Open(), streams())
	}
	rel2()
	pool.Wait()
	eventually(t, "the stream to close on T3", func() bool { return streams() == 0 })
	if pool.Open() != 0 {
		t.Fatalf("%d feeds open after the last release", pool.Open())
	}

	r.fake.FailThreadSubscriptions(true)
	f3, rel3, ok := pool.Acquire("mac", b, r.dial)
	if !ok {
		t.Fatal("no feed after the others were released")
	}
	eventually(t, "the failed subscription to fail the feed", func() bool { return f3.Err() != nil })
	if _, ok := f3.Await(t.Context(), func(*t3api.ThreadProjection) bool { return true }); ok {
		t.Fatal("a failed feed answered")
	}
	r.fake.FailThreadSubscriptions(false)
	f4, rel4, ok := pool.Acquire("mac", b, r.dial)
	if !ok || f4 == f3 {
		t.Fatal("the next waiter after a failure did not get a new feed")
	}
	now(t, f4)
	rel3()
	rel4()
	pool.Wait()
	eventually(t, "the stream to close on T3", func() bool { return streams() == 0 })
}

// FuzzApplyThreadItems: whatever a thread stream sends, a feed applies it or
// fails; it never panics. Seeded with T3's recorded thread stream items.
func FuzzApplyThreadItems(f *testing.F) {
	for _, rec := range recordings(f) {
		for _, streams := range threadStreams(rec) {
			for _, items := range streams {
				f.Add([]byte(items[0]), []byte(items[len(items)-1]))
			}
		}
	}
	f.Add([]byte(`{"kind":"snapshot","snapshotSequence":1,"projection":{"thread":{},"runs":[],"runtimeRequests":[],"messages":[],"turnItems":[],"checkpoints":[]}}`), []byte(`{"kind":"event","sequence":2,"event":{"type":"run.created","payload":{}}}`))
	f.Fuzz(func(t *testing.T, first, second []byte) {
		fd := newFeed("mac", "t")
		if err := fd.applyChunk([]jx.Raw{first, second}); err != nil {
			return
		}
		if fd.p != nil {
			_ = copyProjection(fd.p)
		}
	})
}

// TestFeedResubscribesAfterTheSocketDrops: when the machine's socket drops,
// a feed subscribes again on the next socket, from the newest sequence it
// applied, instead of failing: what happened while the socket was down (the
// run completed) reaches it by T3's replay (no new snapshot), and what happens
// later by the new stream.
func TestFeedResubscribesAfterTheSocketDrops(t *testing.T) {
	r := newRig(t, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	tid := r.fake.AddThread(pid, "drop", "idle")
	if _, err := r.fake.StartRun(tid, "write the docs"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conn := r.conn
	dials, back := make(chan struct{}, 10), make(chan struct{})
	redial := func(ctx context.Context) (*effectrpc.Conn, error) {
		dials <- struct{}{}
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-conn.Done():
			<-back                          // the machine is reachable again
			c, err := r.client.DialRPC(ctx) // the watcher's reconnect
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { _ = c.Close() })
			conn = c
		default:
		}
		return conn, nil
	}
	var sentMu sync.Mutex
	var sent []string // what both streams sent
	r.fake.OnItemSent(func(kind string, _ int64, _ time.Time) {
		sentMu.Lock()
		defer sentMu.Unlock()
		sent = append(sent, kind)
	})
	pool := NewPool(1)
	f, release, ok := pool.Acquire("mac", tid, redial)
	if !ok {
		t.Fatal("no feed")
	}
	defer func() { release(); pool.Wait() }()
	now(t, f)
	<-dials
	r.fake.DropConnections()
	select { // the stream ended with the socket; the feed asks for the next one
	case <-dials:
	case <-f.done:
		t.Fatalf("the feed ended with the socket: %v", f.Err())
	}
	r.fake.StepAll() // the run completes while the socket is down
	close(back)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	st, ok := f.Await(ctx, func(p *t3api.ThreadProjection) bool {
		return len(p.Runs) == 1 && p.Runs[0].Status == "completed"
	})
	if !ok {
		t.Fatalf("the feed did not see the run complete after the drop: %v", f.Err())
	}
	if st.Runs != 1 {
		t.Fatalf("runs %d", st.Runs)
	}
	// The fake forgets the dropped socket (and its stream) when that socket's handler has
	// wound down, which can come after the second socket's stream delivered the run: the
	// count of open streams settles at one (a third socket fails at once).
	eventually(t, "the feed's stream again on the second socket, the first one gone", func() bool {
		s := r.fake.Stats()
		if s.WSConnections > 2 {
			t.Fatalf("%d sockets: want 2, the dropped one and the redial", s.WSConnections)
		}
		return s.WSConnections == 2 && s.ThreadStreams == 1
	})
	// The hook runs once a frame is written, which can be after the feed
	// applied it. The first stream sent the one snapshot; the run's events
	// came only on the second.
	eventually(t, "the replay's send to be reported", func() bool {
		sentMu.Lock()
		defer sentMu.Unlock()
		return slices.Contains(sent, "thread:run.updated")
	})
	sentMu.Lock()
	snapshots := 0
	for _, k := range sent {
		if k == "thread:snapshot" {
			snapshots++
		}
	}
	if snapshots != 1 {
		t.Errorf("sent: %v; want one snapshot (the first stream's), then the replay of what came since", sent)
	}
	sentMu.Unlock()
	// Live again: a second run's start reaches it.
	if _, err := r.fake.StartRun(tid, "write the docs"); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Await(ctx, func(p *t3api.ThreadProjection) bool { return len(p.Runs) == 2 }); !ok {
		t.Fatalf("the new stream is not live: %v", f.Err())
	}
}
