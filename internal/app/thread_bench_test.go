package app_test

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// BenchmarkThreadFirstCall is one t3_thread call end to end on a thread the connector has never
// shown (the load harness's "first calls"): the go-sdk client's call over MCP streamable HTTP on
// 127.0.0.1, the connector's one bounded read of the thread from the fake T3 (T3-sized bodies:
// an attempt and a node per run, t3fake.Options.ControlPlane), the trim, the render, the
// thread's feed opened from the read (subscribeThread with afterSequence on the machine's
// socket, T3's synchronized item applied), and the answer read by the client. Each iteration
// calls a new thread of items turn items (five per run), seeded untimed; repeat is the same
// call again on the last thread (answered from its feed), for comparison.
//
// cpu-ns/op is the process's CPU over the timed calls, every goroutine: connector, fake and
// client. The fake's goroutines run under the pprof label side=t3, the client's under
// side=client, the connector's under side=connector, so a CPU profile of this benchmark
// (-cpuprofile, then `go tool pprof -tagfocus side=connector`) splits it.
func BenchmarkThreadFirstCall(b *testing.B) {
	variants := []struct {
		name  string
		feeds int  // T3CODE_MCP_THREAD_FEEDS
		again bool // call the warm thread again (from its feed) instead of a new one
	}{
		{"first", 100, false},      // the first call: read, feed opened from it
		{"first-nofeed", 0, false}, // the read alone: no feed kept (every call reads)
		{"repeat", 100, true},      // a repeated call, from the thread's feed
	}
	for _, items := range []int{500, 5_000} {
		for _, v := range variants {
			b.Run(fmt.Sprintf("items=%d/%s", items, v.name), func(b *testing.B) {
				var fk *t3fake.Server
				n := b.N + 1
				if v.again {
					n = 1
				}
				threads := make([]string, n)
				pprof.Do(context.Background(), pprof.Labels("side", "t3"), func(context.Context) {
					fk = t3fake.StartT(b, t3fake.Options{Label: "mac-env", ManualSteps: true, KeepRuns: -1, ControlPlane: true})
					pid := fk.AddProject("api", "/srv/api")
					for i := range threads {
						threads[i] = fk.AddThread(pid, fmt.Sprintf("big %d", i), "idle")
						for r := range items / 5 {
							if _, err := fk.StartRun(threads[i], fmt.Sprintf("Fix the flaky test (attempt %d)", r+1)); err != nil {
								b.Fatal(err)
							}
							fk.StepAll()
						}
					}
				})
				var a *app.App
				var cs *mcp.ClientSession
				pprof.Do(context.Background(), pprof.Labels("side", "connector"), func(context.Context) {
					a, cs = benchApp(b, fk, func(s *app.Settings) { s.ThreadFeeds = v.feeds })
				})
				benchEventually(b, "every thread listed", func() bool {
					for _, tid := range threads {
						if _, err := a.Fleet.Thread(tid); err != nil {
							return false
						}
					}
					return true
				})
				call := func(tid string) {
					res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "t3_thread", Arguments: map[string]any{"thread_id": tid}})
					if err != nil || res.IsError {
						b.Fatalf("t3_thread(%s): %v %+v", tid, err, res)
					}
				}
				warm := threads[n-1]
				call(warm) // the connector's first read of the machine, its pools
				call(warm) // and its first answer from a feed
				// The start-up snapshot went through the watchers' gate, which returns memory to the OS
				// 500 ms after (watch.gate): not part of a call.
				time.Sleep(time.Second)
				stop := benchProfile(b)
				b.ReportAllocs()
				c0 := processCPU()
				b.ResetTimer()
				for i := range b.N {
					if v.again {
						call(warm)
					} else {
						call(threads[i])
					}
				}
				b.StopTimer()
				b.ReportMetric(float64((processCPU()-c0).Nanoseconds())/float64(b.N), "cpu-ns/op")
				stop()
			})
		}
	}
}

// benchProfile writes a CPU profile of the timed part alone (no seeding, no start-up) to the file
// T3CODE_BENCH_CPUPROFILE names, suffixed with the benchmark's name; the returned func stops it.
func benchProfile(b *testing.B) (stop func()) {
	path := os.Getenv("T3CODE_BENCH_CPUPROFILE")
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path + "." + strings.NewReplacer("/", "_", "=", "").Replace(b.Name()))
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}
}
