package events_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// Detector.Apply with a real store in b.TempDir(): every commit is an fsynced bbolt
// transaction (through the group committer). Nothing is read from T3 on this path: the events
// are committed with the rows' facts and enriched by the outbox before delivery.

const benchThreads = 1000

type detectorBench struct {
	d       *events.Detector
	st      store.Store
	threads []string
}

func newDetectorBench(b *testing.B) *detectorBench {
	b.Helper()
	st := storetest.OpenBolt(b)
	now := time.Now()
	db := &detectorBench{st: st}
	var tracked []store.Thread
	for i := 0; i < benchThreads; i++ {
		id := fmt.Sprintf("thread-%04d", i)
		db.threads = append(db.threads, id)
		tracked = append(tracked, store.Thread{ID: id, Machine: "load", ProjectID: "project-1", ProjectTitle: "payments", Watch: true, CreatedAt: now, UpdatedAt: now})
	}
	if err := st.Commit(store.Batch{Threads: tracked}); err != nil {
		b.Fatal(err)
	}
	db.d = events.New(events.Options{Store: store.NewGroup(st), Tracked: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	// Every thread's baseline: idle, no run.
	var base []t3rpc.ThreadShell
	for _, id := range db.threads {
		base = append(base, benchShell(id, "idle", ""))
	}
	if err := db.d.Apply(context.Background(), watch.Change{Machine: "load", Snapshot: true, Threads: watch.RowsOf(base)}); err != nil {
		b.Fatal(err)
	}
	return db
}

func benchShell(id, status, run string) t3rpc.ThreadShell {
	s := t3rpc.ThreadShell{ID: id, ProjectId: "project-1", Title: "Fix the flaky payment test", Status: status}
	if run != "" {
		s.LatestRunId = t3rpc.NewOptNilString(run)
		if status == "completed" {
			s.LatestRunCompletedAt = t3rpc.NewOptNilString("2026-11-29T10:00:00.000Z")
		}
	}
	return s
}

// benchRuns applies, per op, perChunk threads starting a run and then the same threads
// finishing it, each as one chunk: two commits (the new run, then the events) per chunk. ns/op is
// one run (one event).
func benchRuns(b *testing.B, perChunk int) {
	db := newDetectorBench(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for n, round := 0, 0; n < b.N; round++ {
		var start, done []t3rpc.ThreadShell
		for j := 0; j < perChunk && n < b.N; j++ {
			id := db.threads[n%benchThreads]
			run := fmt.Sprintf("run:%s:%d", id, round)
			start = append(start, benchShell(id, "running", run))
			done = append(done, benchShell(id, "completed", run))
			n++
		}
		if err := db.d.Apply(ctx, watch.Change{Machine: "load", Threads: watch.RowsOf(start)}); err != nil {
			b.Fatal(err)
		}
		if err := db.d.Apply(ctx, watch.Change{Machine: "load", Threads: watch.RowsOf(done)}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if p, _, _, err := db.st.Counts(); err != nil || p != b.N {
		b.Fatalf("%d events for %d runs (%v)", p, b.N, err)
	}
}

// BenchmarkDetectorLaggingChunk64: the chunk of a machine the connector lags behind: 64 threads
// each with a whole run in it (starting, running, waiting, then completed: three passed rows and
// the final one), one commit with 64 events. ns/op is one run (one event).
func BenchmarkDetectorLaggingChunk64(b *testing.B) {
	db := newDetectorBench(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for n, round := 0, 0; n < b.N; round++ {
		var c watch.Change
		c.Machine = "load"
		for j := 0; j < 64 && n < b.N; j++ {
			id := db.threads[n%benchThreads]
			run := fmt.Sprintf("run:%s:%d", id, round)
			for _, st := range []string{"starting", "running", "waiting"} {
				r := benchShell(id, st, run)
				r.ActiveRunId = t3rpc.NewOptNilString(run)
				c.Passed = append(c.Passed, &r)
			}
			done := benchShell(id, "completed", run)
			c.Threads = append(c.Threads, &done)
			n++
		}
		if err := db.d.Apply(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
	if p, _, _, err := db.st.Counts(); err != nil || p != b.N {
		b.Fatalf("%d events for %d runs (%v)", p, b.N, err)
	}
}

// BenchmarkDetectorRun: one thread per chunk (a quiet machine).
func BenchmarkDetectorRun(b *testing.B) { benchRuns(b, 1) }

// BenchmarkDetectorRuns64: 64 threads per chunk (a busy machine: T3 batches while the previous
// chunk waits for its Ack), so one commit carries 64 events.
func BenchmarkDetectorRuns64(b *testing.B) { benchRuns(b, 64) }

// BenchmarkDetectorNoTransition is the commonest chunk: a watched thread's row changed within a
// run (a new turn item), nothing to record. ns/op is one chunk of one thread.
func BenchmarkDetectorNoTransition(b *testing.B) {
	db := newDetectorBench(b)
	ctx := context.Background()
	running := benchShell(db.threads[0], "running", "run-1")
	if err := db.d.Apply(ctx, watch.Change{Machine: "load", Threads: watch.RowsOf([]t3rpc.ThreadShell{running})}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := db.d.Apply(ctx, watch.Change{Machine: "load", Threads: watch.RowsOf([]t3rpc.ThreadShell{running})}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDetectorUnwatched64 is a chunk of 64 rows of threads nobody watches (most of a
// machine's threads): one tracked-thread lookup each, no commit.
func BenchmarkDetectorUnwatched64(b *testing.B) {
	db := newDetectorBench(b)
	ctx := context.Background()
	var rows []t3rpc.ThreadShell
	for i := 0; i < 64; i++ {
		rows = append(rows, benchShell(fmt.Sprintf("other-%d", i), "running", "run-1"))
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := db.d.Apply(ctx, watch.Change{Machine: "load", Threads: watch.RowsOf(rows)}); err != nil {
			b.Fatal(err)
		}
	}
}

// benchMachines runs 100 machines' watchers at once into one store: each goroutine is one
// machine applying chunks of one thread whose run starts, then settles (one event per two
// chunks, two commits). ns/op is one event. With grouped, the detector commits through
// store.Group (every waiting chunk of every machine in one transaction, one fsync); without, each
// chunk is its own fsynced transaction and the machines queue for the file.
func benchMachines(b *testing.B, grouped bool) {
	st := storetest.OpenBolt(b)
	const machines = 100
	var committer events.Committer = st
	var g *store.Group
	if grouped {
		g = store.NewGroup(st)
		committer = g
	}
	d := events.New(events.Options{Store: committer, Tracked: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	now := time.Now()
	for m := 0; m < machines; m++ {
		machine := fmt.Sprintf("m%03d", m)
		if err := d.Track(machine, store.Thread{ID: "thread-" + machine, Machine: machine, Watch: true, CreatedAt: now, UpdatedAt: now}, nil); err != nil {
			b.Fatal(err)
		}
	}
	per := (b.N + machines - 1) / machines
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	errs := make(chan error, machines)
	for m := 0; m < machines; m++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			machine := fmt.Sprintf("m%03d", m)
			id := "thread-" + machine
			for i := 0; i < per; i++ {
				run := fmt.Sprintf("run-%d", i)
				for _, row := range []t3rpc.ThreadShell{benchShell(id, "running", run), benchShell(id, "completed", run)} {
					if err := d.Apply(ctx, watch.Change{Machine: machine, Threads: watch.RowsOf([]t3rpc.ThreadShell{row})}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	events := per * machines
	b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
	if g != nil {
		txs, batches := g.Stats()
		b.ReportMetric(float64(batches)/float64(max(txs, 1)), "chunks/fsync")
	}
	if p, _, _, err := st.Counts(); err != nil || p != events {
		b.Fatalf("%d events for %d runs (%v)", p, events, err)
	}
}

// BenchmarkGroupCommit100Machines: 100 machines' chunks committed together (store.Group).
func BenchmarkGroupCommit100Machines(b *testing.B) { benchMachines(b, true) }

// BenchmarkCommitAlone100Machines: the same without grouping, one fsync per chunk.
func BenchmarkCommitAlone100Machines(b *testing.B) { benchMachines(b, false) }

// BenchmarkDetectorMixedChunk16: chunks of 16 rows of 16 threads, each thread's run going
// start → six steps → end, the threads out of step with each other: about two of a chunk's rows
// end a run (an event each), the others are steps of running runs, as a busy machine's chunks in
// the latency phase are. One op is one chunk. The detector's commits are dropped (the tracked rows
// are read from the store): cpu-µs/op is the detector's own work and its reads, not the group
// commit's (BenchmarkDetectorRun has those).
func BenchmarkDetectorMixedChunk16(b *testing.B) {
	db := newDetectorBench(b)
	d := events.New(events.Options{Store: dropCommits{db.st}, Tracked: db.st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var base []t3rpc.ThreadShell
	for _, id := range db.threads {
		base = append(base, benchShell(id, "idle", ""))
	}
	ctx := context.Background()
	if err := d.Apply(ctx, watch.Change{Machine: "load", Snapshot: true, Threads: watch.RowsOf(base)}); err != nil {
		b.Fatal(err)
	}
	events := 0
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		var c watch.Change
		c.Machine = "load"
		for j := 0; j < 16; j++ {
			k := n*16 + j
			t := k % benchThreads
			id := db.threads[t]
			step := k/benchThreads + t%8
			run := fmt.Sprintf("run:%s:%d", id, step/8)
			var r t3rpc.ThreadShell
			if step%8 == 7 {
				r = benchShell(id, "completed", run)
				events++
			} else {
				r = benchShell(id, "running", run)
				r.ActiveRunId = t3rpc.NewOptNilString(run)
			}
			r.UpdatedAt = t3rpc.NewOptString(fmt.Sprintf("2026-12-01T10:%02d:%02d.%03dZ", k/60000%60, k/1000%60, k%1000))
			c.Threads = append(c.Threads, &r)
		}
		if err := d.Apply(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
	b.ReportMetric(float64(events)/float64(b.N), "events/op")
}

// dropCommits reads detector states from the store and commits nothing.
type dropCommits struct{ store.Store }

func (dropCommits) Commit(store.Batch) error { return nil }

// BenchmarkQuickChunks100Machines is what 100 machines' read loops do most at 1,000
// transitions/s: each takes a run's step of one of its threads (only the row's updatedAt moved:
// nothing to commit) on its own goroutine, ApplyQuick, all at once; 100 goroutines on however
// many Ps the machine has, as the connector's read loops are. One op is one chunk.
// mutex-wait-ns/op is the runtime's count of time goroutines spent blocked on a sync.Mutex
// (/sync/mutex/wait/total:seconds) per chunk: a lock every machine takes shows there.
func BenchmarkQuickChunks100Machines(b *testing.B) {
	const machines, threads = 100, 10
	st := storetest.OpenBolt(b)
	d := events.New(events.Options{Store: store.NewGroup(st), Tracked: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	now := time.Now()
	at := func(n int64) t3rpc.OptString {
		return t3rpc.NewOptString(now.Add(time.Duration(n) * time.Microsecond).UTC().Format("2006-01-02T15:04:05.000000Z"))
	}
	step := func(id string, n int64) t3rpc.ThreadShell {
		s := benchShell(id, "running", "run-1")
		s.ActiveRunId = t3rpc.NewOptNilString("run-1")
		s.UpdatedAt = at(n)
		return s
	}
	for m := range machines {
		machine := fmt.Sprintf("m%03d", m)
		var tracked []store.Thread
		var base, running []t3rpc.ThreadShell
		for i := range threads {
			id := fmt.Sprintf("%s-t%02d", machine, i)
			tracked = append(tracked, store.Thread{ID: id, Machine: machine, ProjectID: "project-1", ProjectTitle: "payments", Watch: true, CreatedAt: now, UpdatedAt: now})
			base = append(base, benchShell(id, "idle", ""))
			running = append(running, step(id, 0))
		}
		if err := st.Commit(store.Batch{Threads: tracked}); err != nil {
			b.Fatal(err)
		}
		for _, c := range []watch.Change{{Machine: machine, Snapshot: true, Threads: watch.RowsOf(base)}, {Machine: machine, Threads: watch.RowsOf(running)}} {
			if err := d.Apply(ctx, c); err != nil {
				b.Fatal(err)
			}
		}
	}
	var next, slow atomic.Int64
	sample := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(sample)
	wait0 := sample[0].Value.Float64()
	b.ReportAllocs()
	b.SetParallelism((machines + 1) / 2) // with -cpu 2: as many goroutines as machines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		m := int(next.Add(1)-1) % machines
		machine := fmt.Sprintf("m%03d", m)
		var n int64
		for pb.Next() {
			n++
			row := step(fmt.Sprintf("%s-t%02d", machine, n%threads), n)
			c := watch.Change{Machine: machine, Threads: watch.RowsOf([]t3rpc.ThreadShell{row})}
			if !d.ApplyQuick(c) {
				// Two goroutines on one machine (more goroutines than machines): as the watcher
				// does, the chunk goes to Apply.
				slow.Add(1)
				if err := d.Apply(ctx, c); err != nil {
					b.Error(err)
					return
				}
			}
		}
	})
	b.StopTimer()
	metrics.Read(sample)
	b.ReportMetric((sample[0].Value.Float64()-wait0)*1e9/float64(b.N), "mutex-wait-ns/op")
	b.ReportMetric(float64(slow.Load())/float64(b.N), "applied/op")
}
