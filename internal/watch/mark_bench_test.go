package watch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"runtime/metrics"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// fakeShellSnapshotItem is the first item of a shell subscription (kind snapshot) of a t3fake
// machine with the given number of threads, each with a finished run: the rows of a machine
// after the load run's start-up snapshot, read from t3fake's GET /api/orchestration/shell.
func fakeShellSnapshotItem(b *testing.B, threads int) jx.Raw {
	b.Helper()
	fk, err := t3fake.New(t3fake.Options{ManualSteps: true})
	if err != nil {
		b.Fatal(err)
	}
	defer fk.Close()
	pid := fk.AddProject("payments", "/srv/payments")
	for i := range threads {
		tid := fk.AddThread(pid, fmt.Sprintf("Load thread %d: fix the flaky payment test", i), "idle")
		if _, err := fk.StartRun(tid, "Fix the flaky test in the payment service: the retry loop asserts before the ledger has settled."); err != nil {
			b.Fatal(err)
		}
	}
	fk.StepAll()
	req, _ := http.NewRequest("GET", fk.URL()+"/api/orchestration/shell", nil)
	req.Header.Set("Authorization", "Bearer "+fk.Token())
	req.Header.Set("x-t3-orchestration-protocol", "2")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		b.Fatal(err)
	}
	return jx.Raw(`{"kind":"snapshot","snapshot":` + string(body) + `}`)
}

// BenchmarkMarkRows100x1000 measures what every garbage collection pays for the watchers' rows in
// the load run: 100 watchers, each holding the 1,000 rows of a t3fake machine's snapshot (decoded
// per watcher, as each machine's own stream is), kept alive while runtime.GC runs. ns/op is one
// forced collection (mark and sweep, on all Ps); gc-cpu-ms/op its CPU from runtime/metrics;
// scan-heap-MB the heap the mark has to scan; heap-objects and live-MB what stays after it.
func BenchmarkMarkRows100x1000(b *testing.B) {
	item := fakeShellSnapshotItem(b, 1000)
	ws := make([]*Watcher, 100)
	for i := range ws {
		ws[i] = New(fmt.Sprintf("m%d", i), nil, Options{})
		if _, err := ws[i].applyChunk(context.Background(), effectrpc.Chunk{Values: []jx.Raw{item}}); err != nil {
			b.Fatal(err)
		}
		if n := len(ws[i].Threads()); n != 1000 {
			b.Fatalf("%d threads", n)
		}
	}
	item = nil
	runtime.GC()
	samples := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/gc/scan/heap:bytes"}}
	var cpu, scan float64
	b.ResetTimer()
	for b.Loop() {
		metrics.Read(samples)
		before := samples[0].Value.Float64()
		runtime.GC()
		metrics.Read(samples)
		cpu += samples[0].Value.Float64() - before
		scan += float64(samples[1].Value.Uint64())
	}
	b.StopTimer()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	b.ReportMetric(cpu/float64(b.N)*1e3, "gc-cpu-ms/op")
	b.ReportMetric(scan/float64(b.N)/1e6, "scan-heap-MB")
	b.ReportMetric(float64(m.HeapObjects), "heap-objects")
	b.ReportMetric(float64(m.HeapAlloc)/1e6, "live-MB")
	runtime.KeepAlive(ws)
}
