package outbox

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// BenchmarkWebhookPost measures one signed webhook request to a local receiver that answers 204
// at once, 64 in flight: over fasthttp (the poster, post.go) and over net/http's client as the
// outbox used it before (a transport keeping one idle connection per request in flight).
// cpu-µs/op is the process's CPU per request, the receiver's (the same net/http server for
// both) included.
func BenchmarkWebhookPost(b *testing.B) {
	for _, path := range []string{"fasthttp", "net-http"} {
		b.Run(path, func(b *testing.B) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.WriteHeader(http.StatusNoContent)
			}))
			defer srv.Close()
			cfg := Config{URL: srv.URL + "/hook", Secret: testSecret, Concurrency: 256}
			if path == "net-http" {
				tr := http.DefaultTransport.(*http.Transport).Clone()
				tr.MaxIdleConnsPerHost = cfg.Concurrency
				cfg.HTTPClient = &http.Client{Transport: tr}
			}
			o, err := New(nil, cfg)
			if err != nil {
				b.Fatal(err)
			}
			if o.fast != nil {
				o.fast.start()
				defer o.fast.stop()
			}
			body := []byte(`{"id":"evt_0123456789abcdef","type":"thread.completed","occurred_at":"2026-12-02T01:00:00Z","machine":"load-007","project":{"id":"p1","title":"Project"},"thread_id":"thread-0001","run_id":"run-42","title":"Fix the flaky test","run_status":"completed","summary":"Done: the flaky test waited on a timer; it now waits on the condition."}`)
			e := store.Event{ID: "evt_0123456789abcdef", Stream: "load-007/thread-0001", Body: body}
			ctx := context.Background()
			b.SetParallelism(32) // 64 goroutines on 2 cores
			b.ReportAllocs()
			cpu0 := cpuNow(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if r := o.attempt(ctx, o.burst, e); !r.ok {
						b.Error(r.msg)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cpuNow(b)-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
			o.client.CloseIdleConnections()
			o.burst.CloseIdleConnections()
		})
	}
}

func cpuNow(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
