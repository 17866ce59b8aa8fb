package watch_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/loadtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

var benchSnapshot struct {
	once sync.Once
	item []byte
	err  error
}

// BenchmarkDecodeShellSnapshot1000 is t3rpc.ShellStreamItem decoding of the first item of a
// shell subscription on a machine with 1,000 threads (each with a finished run), as read from a
// real t3fake socket.
func BenchmarkDecodeShellSnapshot1000(b *testing.B) {
	benchSnapshot.once.Do(func() {
		benchSnapshot.item, benchSnapshot.err = loadtest.ShellSnapshotItem(context.Background(), 1000)
	})
	if benchSnapshot.err != nil {
		b.Fatal(benchSnapshot.err)
	}
	raw := benchSnapshot.item
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var it t3rpc.ShellStreamItem
		if err := it.Decode(jx.DecodeBytes(raw)); err != nil {
			b.Fatal(err)
		}
		if s, ok := it.Snapshot.Get(); !ok || len(s.Threads) != 1000 {
			b.Fatal("not a 1,000-thread snapshot")
		}
	}
}

var benchQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// benchWatcher runs a watcher against fk until the benchmark ends.
func benchWatcher(b *testing.B, fk *t3fake.Server, sink watch.Sink) *watch.Watcher {
	b.Helper()
	c, err := t3.NewClient("load", fk.URL(), fk.Token(), t3.Options{Timeout: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	connect := func(ctx context.Context) (*effectrpc.Conn, error) {
		if _, err := c.Handshake(ctx); err != nil {
			return nil, err
		}
		return c.DialRPC(ctx)
	}
	w := watch.New("load", connect, watch.Options{Logger: benchQuiet, Sink: sink})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	benchUntil(b, "synced", func() bool { return w.Status().Synced })
	return w
}

func benchUntil(b *testing.B, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// shellItemsPerRun: a default-script run changes its thread's shell row once when it starts and
// once at each of its seven steps.
const shellItemsPerRun = 8

// benchApply drives default-script runs on 1,000 threads of a ManualSteps t3fake and measures the
// watcher applying the resulting shell items: the real socket, effectrpc framing, the shell item
// decode, applyChunk, the sink, and the Ack. ns/op is one shell item. The fake's own work is in
// the same process (BenchmarkTransitions in internal/t3fake measures it alone).
func benchApply(b *testing.B, watched bool) {
	fk := t3fake.StartT(b, t3fake.Options{Label: "load", ManualSteps: true, KeepRuns: 2})
	pid := fk.AddProject("payments", "/srv/payments")
	threads := make([]string, 1000)
	for i := range threads {
		threads[i] = fk.AddThread(pid, fmt.Sprintf("Load thread %d", i), "idle")
	}
	var sink watch.Sink
	var st store.Store
	var perThread struct {
		sync.Mutex
		n map[string]int // runs started per thread
	}
	perThread.n = map[string]int{}
	if watched {
		var err error
		st, err = store.Open(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		now := time.Now()
		var tracked []store.Thread
		for _, id := range threads {
			tracked = append(tracked, store.Thread{ID: id, Machine: "load", ProjectID: pid, ProjectTitle: "payments", Watch: true, CreatedAt: now, UpdatedAt: now})
		}
		if err := st.Commit(store.Batch{Threads: tracked}); err != nil {
			b.Fatal(err)
		}
		// Nothing here reads T3 on the Ack path: events are committed with the rows' facts and
		// enriched later by the outbox. Look-ups (runs the rows cannot settle) are not run.
		sink = events.New(events.Options{Store: store.NewGroup(st), Tracked: st, Logger: benchQuiet})
	}
	w := benchWatcher(b, fk, sink)
	runs := (b.N + shellItemsPerRun - 1) / shellItemsPerRun
	const batch = 50
	b.ReportAllocs()
	b.ResetTimer()
	next := 0
	for started := 0; started < runs; {
		for j := 0; j < batch && started < runs; j++ {
			if _, err := fk.StartRun(threads[next], loadtest.Prompt); err != nil {
				b.Fatal(err)
			}
			perThread.Lock()
			perThread.n[threads[next]]++
			perThread.Unlock()
			next = (next + 1) % len(threads)
			started++
		}
		fk.StepAll()
	}
	head := fk.Head()
	benchUntil(b, "the watcher to apply every item", func() bool { return w.Status().Cursor >= head })
	// The cursor moves before the sink runs; a chunk is acknowledged after it: wait for the open
	// shell stream to be settled (its last Chunk acknowledged), which, unlike
	// AcksReceived >= ChunksSent, still holds after a reconnect.
	benchUntil(b, "the shell stream to be settled", func() bool {
		st := fk.Stats()
		return st.ShellStreams > 0 && st.ShellUnsettled == 0
	})
	b.StopTimer()
	items := runs * shellItemsPerRun
	b.ReportMetric(float64(items)/b.Elapsed().Seconds(), "items/s")
	b.ReportMetric(float64(runs)/b.Elapsed().Seconds(), "runs/s")
	if watched {
		// Every run must have its event, including runs that came and went inside one chunk:
		// count any that have none.
		p, _, _, err := st.Counts()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(runs-p), "lost-events")
	}
}

// BenchmarkWatcherApply: no sink (events off).
func BenchmarkWatcherApply(b *testing.B) { benchApply(b, false) }

// BenchmarkWatcherApplyDetector: every thread watched, the event detector as the sink with a
// real store in b.TempDir(): each chunk is committed (fsync) before its Ack, with one event per
// finished run.
func BenchmarkWatcherApplyDetector(b *testing.B) { benchApply(b, true) }
