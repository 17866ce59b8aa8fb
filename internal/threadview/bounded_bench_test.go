package threadview_test

import (
	"fmt"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// boundedWindow is how many timeline rows the bounded body carries in these
// benchmarks (the fake's page; T3 sizes its window by a payload budget).
const boundedWindow = 50

// boundedBody is GET /threads/{id}/bounded of a thread with items turn items
// (five per run, as the fake's default script makes): every run, the newest
// boundedWindow items and the messages of the runs they belong to.
func boundedBody(b *testing.B, items int) []byte {
	b.Helper()
	runs := items / 5
	tid := "thread-bench"
	snap := t3api.BoundedThreadSnapshot{
		SnapshotSequence: int64(items),
		HistoryCursor:    t3api.NewOptNilString("cursor"),
		HasMoreHistory:   t3api.NewOptBool(items > boundedWindow),
	}
	p := &snap.Projection
	p.Thread = t3api.AppThread{ID: tid, ProjectId: "project-1", Title: "Fix the flaky payment test"}
	for r := 1; r <= runs; r++ {
		id := fmt.Sprintf("run:thread:%s:ordinal:%d", tid, r)
		p.Runs = append(p.Runs, t3api.Run{
			ID: id, ThreadId: tid, Ordinal: int64(r), Status: "completed",
			UserMessageId: t3api.NewOptNilString(fmt.Sprintf("msg-%d", r)),
			StartedAt:     t3api.NewOptNilString("2026-12-01T10:00:00.000Z"),
			CompletedAt:   t3api.NewOptNilString("2026-12-01T10:00:01.000Z"),
		})
	}
	first := max(1, runs-boundedWindow/5+1)
	for r := first; r <= runs; r++ {
		id := p.Runs[r-1].ID
		rid := t3api.NewOptNilString(id)
		p.Messages = append(p.Messages,
			t3api.Message{ID: fmt.Sprintf("msg-%d", r), RunId: rid, Role: "user", Text: fmt.Sprintf("Fix the flaky test (attempt %d)", r)},
			t3api.Message{ID: fmt.Sprintf("reply-%d", r), RunId: rid, Role: "assistant", Text: "Done: the test no longer depends on the clock."})
		base := int64(r) * 1_000_000
		p.TurnItems = append(p.TurnItems,
			t3api.TurnItem{ID: fmt.Sprintf("%s:u", id), Type: "user_message", RunId: rid, Ordinal: base + 1, Text: t3api.NewOptString("Fix the flaky test")},
			t3api.TurnItem{ID: fmt.Sprintf("%s:c", id), Type: "command_execution", RunId: rid, Ordinal: base + 2, Input: t3api.NewOptString("go test ./..."), ExitCode: t3api.NewOptNilInt64(0)},
			t3api.TurnItem{ID: fmt.Sprintf("%s:f", id), Type: "file_change", RunId: rid, Ordinal: base + 3, FileName: t3api.NewOptString("README.md"), Additions: t3api.NewOptNilInt64(3), Deletions: t3api.NewOptNilInt64(1)},
			t3api.TurnItem{ID: fmt.Sprintf("%s:a", id), Type: "assistant_message", RunId: rid, Ordinal: base + 4, Text: t3api.NewOptString("Done: the test no longer depends on the clock.")},
			t3api.TurnItem{ID: fmt.Sprintf("%s:k", id), Type: "checkpoint", RunId: rid, Ordinal: base + 5, Files: []t3api.ChangedFile{{Path: "README.md"}}})
	}
	body, err := snap.MarshalJSON()
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkBoundedThreadTool is t3_thread's work on the bounded read of a
// thread with 500, 5,000 and 50,000 turn items: decode the body, index,
// render the last three runs and encode the result. The timeline part is a
// fixed window; what still grows with the thread is T3's runs array, which
// the bounded route carries whole.
func BenchmarkBoundedThreadTool(b *testing.B) {
	for _, items := range []int{500, 5_000, 50_000} {
		b.Run(fmt.Sprintf("items=%d", items), func(b *testing.B) {
			body := boundedBody(b, items)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var s t3api.BoundedThreadSnapshot
				if err := s.UnmarshalJSON(body); err != nil {
					b.Fatal(err)
				}
				st := threadview.New(&s.Projection).Render(benchMeta, 3, threadview.DefaultLimits)
				if len(st.Runs) != 3 || st.Runs[2].Reply.Or("") == "" {
					b.Fatalf("rendered %+v", st.Runs)
				}
				if _, err := st.MarshalJSON(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
