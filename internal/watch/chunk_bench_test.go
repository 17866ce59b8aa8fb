package watch

import (
	"context"
	"fmt"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
)

// BenchmarkApplyChunkLagging is one chunk of a machine the connector lags behind: 1,024 shell
// items over 128 threads (each run changes its row several times, so 896 rows are passed over by
// a later row of the same thread and go to Change.Passed). No sink: the watcher's own work.
// ns/op is one chunk.
func BenchmarkApplyChunkLagging(b *testing.B) {
	values := shellItems(1024, 128)
	w := New("mac", nil, Options{})
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		w.status.Cursor = 0 // the same items apply again
		if _, err := w.applyChunk(ctx, effectrpc.Chunk{Values: values}); err != nil {
			b.Fatal(err)
		}
	}
}

// shellItems is n thread.updated items over the given number of threads, item i a row of run i.
func shellItems(n, threads int) []jx.Raw {
	values := make([]jx.Raw, n)
	for i := range values {
		row := t3rpc.ThreadShell{
			ID: fmt.Sprintf("thread-%03d", i%threads), ProjectId: "project-1", Title: "Fix the flaky test", Status: "running",
			LatestRunId: t3rpc.NewOptNilString(fmt.Sprintf("run-%d", i)), ActiveRunId: t3rpc.NewOptNilString(fmt.Sprintf("run-%d", i)),
			CreatedAt: t3rpc.NewOptString("2026-12-01T10:00:00.000Z"), UpdatedAt: t3rpc.NewOptString("2026-12-01T10:00:01.000Z"),
		}
		var e jx.Encoder
		e.ObjStart()
		e.FieldStart("kind")
		e.Str("thread.updated")
		e.FieldStart("sequence")
		e.Int(i + 1)
		e.FieldStart("thread")
		e.Raw(encodeShell(&row))
		e.ObjEnd()
		values[i] = jx.Raw(e.Bytes())
	}
	return values
}

// BenchmarkApplyChunkSteady is one chunk of a machine the connector keeps up with: 4 shell items
// of 4 threads, after a lagging machine's chunk went through the item pool (as under load). No
// sink: the watcher's own work. ns/op is one chunk.
func BenchmarkApplyChunkSteady(b *testing.B) {
	values := shellItems(4, 4)
	w := New("mac", nil, Options{})
	ctx := context.Background()
	if _, err := w.applyChunk(ctx, effectrpc.Chunk{Values: shellItems(1024, 128)}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		w.status.Cursor = 0 // the same items apply again
		if _, err := w.applyChunk(ctx, effectrpc.Chunk{Values: values}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkApplyChunkRunSteps is a machine's chunks while the connector keeps up with its runs:
// one row per chunk, the eight rows of T3's default script per run (starting, running five times,
// waiting, completed), each with its own updatedAt, runs on four threads in turn, each run with
// its own ids. No sink: the watcher's own work, decoding most of it. ns/op is one chunk.
func BenchmarkApplyChunkRunSteps(b *testing.B) {
	statuses := []string{"starting", "running", "running", "running", "running", "running", "waiting", "completed"}
	var chunks [][]jx.Raw
	for r := range 64 {
		run := fmt.Sprintf("run-%04d", r)
		for s, status := range statuses {
			row := t3rpc.ThreadShell{
				ID: fmt.Sprintf("thread-%03d", r%4), ProjectId: "project-1", Title: "Fix the flaky test", Status: status,
				LatestRunId: t3rpc.NewOptNilString(run), ActiveRunId: t3rpc.NewOptNilString(run),
				RuntimeMode: t3rpc.NewOptString("full-access"), InteractionMode: t3rpc.NewOptString("default"),
				LatestRunRequestedAt: t3rpc.NewOptNilString("2026-12-01T10:00:00.000Z"), LatestRunStartedAt: t3rpc.NewOptNilString("2026-12-01T10:00:00.010Z"),
				CreatedAt: t3rpc.NewOptString("2026-12-01T09:00:00.000Z"), UpdatedAt: t3rpc.NewOptString(fmt.Sprintf("2026-12-01T10:%02d:%02d.%03dZ", r%60, s, r)),
			}
			if s >= 6 {
				row.ActiveRunId = t3rpc.OptNilString{Set: true, Null: true}
			}
			var e jx.Encoder
			e.ObjStart()
			e.FieldStart("kind")
			e.Str("thread.updated")
			e.FieldStart("sequence")
			e.Int(r*len(statuses) + s + 1)
			e.FieldStart("thread")
			e.Raw(encodeShell(&row))
			e.ObjEnd()
			chunks = append(chunks, []jx.Raw{jx.Raw(e.Bytes())})
		}
	}
	w := New("mac", nil, Options{})
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i%len(chunks) == 0 {
			w.status.Cursor = 0 // the same items apply again
		}
		if _, err := w.applyChunk(ctx, effectrpc.Chunk{Values: chunks[i%len(chunks)]}); err != nil {
			b.Fatal(err)
		}
		i++
	}
}
