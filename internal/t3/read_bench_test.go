package t3

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"
)

// BenchmarkThreadRecentKeep is t3_thread's read of a thread through the
// client: GET …/bounded of the fake's body for 500 / 5,000 / 50,000 turn
// items (100 / 1,000 / 10,000 default runs) served chunked from memory over
// 127.0.0.1, read, trimmed to the newest 3 runs and decoded. cpu-ns/op is the
// whole process's CPU per read (the server's write included, the same for
// every version of the client); items=N/read-only is the floor, the same GET
// with the body only read.
func BenchmarkThreadRecentKeep(b *testing.B) {
	for _, runs := range []int{100, 1_000, 10_000} {
		body := fakeBounded(b, runs)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body) // no Content-Length: sent chunked, as the fake and T3 send it
		}))
		c, err := NewClient("bench", srv.URL, "tok", Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("items=%d", runs*5), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			runtime.GC()
			cpu0 := processCPU(b)
			for b.Loop() {
				rec, err := c.ThreadRecentKeep(context.Background(), "thread-1", Keep{Runs: 3})
				if err != nil {
					b.Fatal(err)
				}
				if len(rec.Projection.Runs) != 3 || rec.RunCount != runs {
					b.Fatalf("kept %d of %d runs", len(rec.Projection.Runs), rec.RunCount)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
		// The floor: the same GET with the body only read off the socket
		// (the server's write and the client's read, what every reader pays).
		b.Run(fmt.Sprintf("items=%d/read-only", runs*5), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			buf := make([]byte, 64<<10)
			runtime.GC()
			cpu0 := processCPU(b)
			for b.Loop() {
				res, err := http.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{res.Body}, buf)
				res.Body.Close()
				if err != nil || n != int64(len(body)) {
					b.Fatalf("read %d of %d: %v", n, len(body), err)
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
		srv.Close()
	}
}
