package events_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// BenchmarkEnrichedEvent is the way of an event that needs its details from T3 (a failed run):
// the chunk with the settling row applied and committed (a real store, fsynced through the group
// committer), then the outbox's Enrich as it runs once the event is handed over. One op is one
// run's end; reported: ready-p50/p99-ms, from Apply's start until the complete body is in hand. The read
// of the thread takes readDelay (a machine's bounded read, served here without a network).
//
//	after-commit: no prefetch, the read starts when Enrich is called: commit + read;
//	prefetch:     Enricher.Prefetch starts the read beside the commit: the longer of the two.
func BenchmarkEnrichedEvent(b *testing.B) {
	const readDelay = 5 * time.Millisecond
	for _, prefetch := range []bool{false, true} {
		name := "after-commit"
		if prefetch {
			name = "prefetch"
		}
		b.Run(name, func(b *testing.B) {
			db := newDetectorBench(b)
			read := events.ReaderFunc(func(ctx context.Context, _, threadID string) (*t3api.ThreadProjection, error) {
				select {
				case <-time.After(readDelay):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
				return &t3api.ThreadProjection{
					Thread: t3api.AppThread{ID: threadID, ProjectId: "project-1", Title: "Fix the flaky payment test"},
					Runs:   []t3api.Run{{ID: "run", ThreadId: threadID, Ordinal: 1, Status: "failed"}},
				}, nil
			})
			en := events.NewEnricher(read)
			opts := events.Options{Store: store.NewGroup(db.st), Tracked: db.st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
			if prefetch {
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); en.RunPrefetch(ctx) }()
				defer func() { cancel(); <-done }()
				opts.Prefetch = en.Prefetch
			}
			db.d = events.New(opts)
			ready := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for i := range b.N {
				id := db.threads[i%len(db.threads)]
				run := fmt.Sprintf("run-%d", i)
				running := benchShell(id, "running", run)
				running.ActiveRunId = running.LatestRunId
				if err := db.d.Apply(context.Background(), watch.Change{Machine: "load", Threads: watch.RowsOf([]t3rpc.ThreadShell{running})}); err != nil {
					b.Fatal(err)
				}
				t0 := time.Now()
				if err := db.d.Apply(context.Background(), watch.Change{Machine: "load", Threads: watch.RowsOf([]t3rpc.ThreadShell{benchShell(id, "failed", run)})}); err != nil {
					b.Fatal(err)
				}
				evs, err := db.st.Pending(1)
				if err != nil || len(evs) != 1 || !evs[0].Enrich {
					b.Fatalf("pending %v, %v: want the failed run's event, to enrich", evs, err)
				}
				body, err := en.Enrich(context.Background(), evs[0])
				if err != nil || len(body) == 0 {
					b.Fatal(err)
				}
				ready = append(ready, time.Since(t0))
				// Delivered: the next op's Pending finds only its own event.
				if _, err := db.st.Record([]store.Op{{ID: evs[0].ID, Kind: store.OpDelivered, At: time.Now()}}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			slices.Sort(ready)
			b.ReportMetric(float64(ready[len(ready)/2])/1e6, "ready-p50-ms")
			b.ReportMetric(float64(ready[len(ready)*99/100])/1e6, "ready-p99-ms")
		})
	}
}
