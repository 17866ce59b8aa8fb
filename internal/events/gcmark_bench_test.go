package events_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/events"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// BenchmarkGCMarkDetectorState measures what a collection pays for the detector's long-lived
// state at the load run's scale: 100 machines × 1,000 watched threads, each seen with a latest
// run and an updatedAt, half of them settled and half with that run active (the load harness's
// ids: "thread-N", "run:thread:thread-N:ordinal:K"). One op is one runtime.GC() with the
// detector alive; the connector's collector walks the same objects and pointers at every cycle
// of the latency phase, on the Ack path's CPU.
//
//   - mark-cpu-µs/GC: the mark's CPU (assist + dedicated + idle workers) per collection;
//   - state-objects, state-B: the heap objects and live bytes the detector holds (live heap with
//     the detector minus the live heap once it is released);
//   - state-scan-B: of those bytes, what the collector must scan ("/gc/scan/heap:bytes").
func BenchmarkGCMarkDetectorState(b *testing.B) {
	const machines, threads = 100, 1000
	st := storetest.OpenBolt(b)
	now := time.Now()
	tracked := make([]store.Thread, 0, machines*threads)
	for m := 0; m < machines; m++ {
		for t := 0; t < threads; t++ {
			machine := fmt.Sprintf("m%03d", m)
			tracked = append(tracked, store.Thread{ID: fmt.Sprintf("thread-%d", m*threads+t), Machine: machine, Watch: true, CreatedAt: now, UpdatedAt: now})
		}
	}
	if err := st.Commit(store.Batch{Threads: tracked}); err != nil {
		b.Fatal(err)
	}
	tracked = nil
	// Commits are dropped (dropCommits): the state in memory is what is measured, not bbolt's.
	d := events.New(events.Options{Store: dropCommits{st}, Tracked: st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	for m := 0; m < machines; m++ {
		machine := fmt.Sprintf("m%03d", m)
		// Each row's strings are allocated on their own, as a frame's decode makes them.
		shell := func(t, ordinal int, status string, at int) t3rpc.ThreadShell {
			id := fmt.Sprintf("thread-%d", m*threads+t)
			run := fmt.Sprintf("run:thread:%s:ordinal:%d", id, ordinal)
			s := benchShell(id, status, run)
			if status == "running" {
				s.ActiveRunId = t3rpc.NewOptNilString(fmt.Sprintf("run:thread:%s:ordinal:%d", id, ordinal))
			}
			s.UpdatedAt = t3rpc.NewOptString(fmt.Sprintf("2026-12-03T01:%02d:%02d.%03dZ", at/60%60, at%60, t))
			return s
		}
		base := make([]t3rpc.ThreadShell, threads)
		for t := range base {
			base[t] = shell(t, 1, "completed", 0)
		}
		if err := d.Apply(ctx, watch.Change{Machine: machine, Snapshot: true, Threads: watch.RowsOf(base)}); err != nil {
			b.Fatal(err)
		}
		// Half the threads start their next run, in chunks of 50 as a machine sends them.
		for t0 := 0; t0 < threads; t0 += 100 {
			var chunk []t3rpc.ThreadShell
			for t := t0; t < t0+50; t++ {
				chunk = append(chunk, shell(t, 2, "running", 1))
			}
			if err := d.Apply(ctx, watch.Change{Machine: machine, Threads: watch.RowsOf(chunk)}); err != nil {
				b.Fatal(err)
			}
		}
	}
	samples := []metrics.Sample{
		{Name: "/cpu/classes/gc/mark/assist:cpu-seconds"},
		{Name: "/cpu/classes/gc/mark/dedicated:cpu-seconds"},
		{Name: "/cpu/classes/gc/mark/idle:cpu-seconds"},
		{Name: "/gc/scan/heap:bytes"},
	}
	markCPU := func() float64 {
		metrics.Read(samples)
		return samples[0].Value.Float64() + samples[1].Value.Float64() + samples[2].Value.Float64()
	}
	live := func() (objects, bytes, scan uint64) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		metrics.Read(samples)
		return ms.HeapObjects, ms.HeapAlloc, samples[3].Value.Uint64()
	}
	objWith, bytesWith, scanWith := live()
	b.ResetTimer()
	cpu0 := markCPU()
	for i := 0; i < b.N; i++ {
		runtime.GC()
	}
	cpu := markCPU() - cpu0
	b.StopTimer()
	runtime.KeepAlive(d)
	d = nil
	objWithout, bytesWithout, scanWithout := live()
	b.ReportMetric(cpu*1e6/float64(b.N), "mark-cpu-µs/GC")
	b.ReportMetric(float64(objWith)-float64(objWithout), "state-objects")
	b.ReportMetric(float64(bytesWith)-float64(bytesWithout), "state-B")
	b.ReportMetric(float64(scanWith)-float64(scanWithout), "state-scan-B")
}
