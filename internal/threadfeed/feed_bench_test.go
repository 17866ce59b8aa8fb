package threadfeed

import (
	"bytes"
	"context"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// BenchmarkFeedSettleChunk is the connector's part of a feed-woken t3_wait that is the feed's:
// applying the thread stream's chunk that settles the run (the fake's settle step: checkpoint,
// its timeline row, the run completed) to the feed's projection, then taking the result's
// projection from it (Ready: a copy). The chunk is the fake's own, recorded off a real socket;
// each op starts from the projection the feed had just before it. The frame's read and decode
// (effectrpc), the wait's judgement and the render are not in it.
func BenchmarkFeedSettleChunk(b *testing.B) {
	r := newRig(b, t3fake.Options{ManualSteps: true})
	pid := r.fake.AddProject("api", "/srv/api")
	tid := r.fake.AddThread(pid, "bench", "idle")
	run, err := r.fake.StartRun(tid, "write the docs")
	if err != nil {
		b.Fatal(err)
	}
	const steps = 7 // the default script; its last step completes the run
	for range steps - 1 {
		r.fake.Step()
	}
	pool := NewPool(10)
	f, release, ok := pool.Acquire("mac", tid, r.dial)
	if !ok {
		b.Fatal("no feed")
	}
	defer func() { release(); pool.Wait() }()
	eventually(b, "the feed's snapshot", func() bool { _, ok := f.Ready(func(*t3api.ThreadProjection) bool { return true }); return ok })
	f.mu.Lock()
	base, runs, cursor, newest := copyProjection(f.p), f.runs, f.cursor, f.newestOrdinal
	f.mu.Unlock()

	// The settle step's chunk, as T3 sends it on a subscription that is past the snapshot.
	ctx, cancel := context.WithCancel(context.Background())
	chunks := make(chan []jx.Raw, 16)
	streamed := make(chan error, 1)
	in := t3rpc.SubscribeThreadInput{ThreadId: tid, AfterSequence: t3rpc.NewOptInt64(cursor)}
	go func() {
		streamed <- r.conn.Stream(ctx, "orchestration.subscribeThread", &in, func(v []jx.Raw) error {
			chunks <- v
			return nil
		})
	}()
	r.fake.Step()
	var settle []jx.Raw
	for settle == nil {
		v := <-chunks
		for _, raw := range v {
			if bytes.Contains(raw, []byte(`"run.updated"`)) && bytes.Contains(raw, []byte(`"completed"`)) {
				settle = v
			}
		}
	}
	cancel()
	<-streamed

	completed := func(p *t3api.ThreadProjection) bool {
		for i := range p.Runs {
			if p.Runs[i].ID == run && p.Runs[i].Status == "completed" {
				return true
			}
		}
		return false
	}
	fd := newFeed("mac", tid)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		fd.p, fd.runs, fd.cursor, fd.newestOrdinal = copyProjection(base), runs, cursor, newest
		b.StartTimer()
		if err := fd.applyChunk(settle); err != nil {
			b.Fatal(err)
		}
		if _, ok := fd.Ready(completed); !ok {
			b.Fatal("the settle chunk did not complete the run")
		}
	}
}
