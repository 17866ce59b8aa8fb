package threadview_test

import (
	"context"
	"sync"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/loadtest"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// A 5,000-item thread (1,000 default-script runs made by t3fake, read back over its HTTP route):
// what t3_thread, t3_wait and every webhook event decode and render.
const benchRuns = 1000

var bigThread struct {
	once       sync.Once
	body       []byte // GET /api/orchestration/threads/{id}
	projection []byte // its projection object
	err        error
}

func bigThreadBody(b *testing.B) ([]byte, []byte) {
	b.Helper()
	bigThread.once.Do(func() {
		bigThread.body, _, bigThread.err = loadtest.ThreadBody(context.Background(), benchRuns)
		if bigThread.err == nil {
			bigThread.projection, bigThread.err = loadtest.ProjectionJSON(bigThread.body)
		}
	})
	if bigThread.err != nil {
		b.Fatal(bigThread.err)
	}
	return bigThread.body, bigThread.projection
}

func decodeBig(b *testing.B) *t3api.ThreadProjection {
	b.Helper()
	_, raw := bigThreadBody(b)
	var p t3api.ThreadProjection
	if err := p.UnmarshalJSON(raw); err != nil {
		b.Fatal(err)
	}
	if len(p.TurnItems) != 5*benchRuns {
		b.Fatalf("%d turn items, want %d", len(p.TurnItems), 5*benchRuns)
	}
	return &p
}

var benchMeta = threadview.Meta{Machine: "load-000", Project: mcptools.ProjectRef{ID: "project-1", Title: "payments"}, Status: "completed"}

// BenchmarkDecodeThreadProjection5000 is t3api.ThreadProjection decoding of a 5,000-item thread.
func BenchmarkDecodeThreadProjection5000(b *testing.B) {
	_, raw := bigThreadBody(b)
	b.SetBytes(int64(len(raw)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var p t3api.ThreadProjection
		if err := p.UnmarshalJSON(raw); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRender5000 is threadview.New(p).Render on a decoded 5,000-item thread (the last
// three runs, default limits), as t3_thread renders it.
func BenchmarkRender5000(b *testing.B) {
	p := decodeBig(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st := threadview.New(p).Render(benchMeta, 3, threadview.DefaultLimits)
		if len(st.Runs) != 3 {
			b.Fatal(len(st.Runs))
		}
	}
}

// BenchmarkThreadTool5000 is t3_thread's work after the HTTP read: decode the snapshot body,
// index, render and encode the structured result.
func BenchmarkThreadTool5000(b *testing.B) {
	body, _ := bigThreadBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var s t3api.ThreadSnapshot
		if err := s.UnmarshalJSON(body); err != nil {
			b.Fatal(err)
		}
		st := threadview.New(&s.Projection).Render(benchMeta, 3, threadview.DefaultLimits)
		if _, err := st.MarshalJSON(); err != nil {
			b.Fatal(err)
		}
	}
}
