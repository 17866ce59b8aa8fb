package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime/pprof"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// BenchmarkWakeFromFeedFrame is one t3_wait wake-up end to end, as the load harness's latency
// phase has ~70 % of them: a wait blocked on a running run, woken by its thread's own
// subscription (the shell stream held back, so the row cannot wake it first). The timed part
// is the fake stepping the run to completed (which writes the thread stream's frame), the
// connector reading and applying that frame, the wait's result rendered and answered over MCP
// streamable HTTP, and the go-sdk client reading it — everything between "T3 sends the frame
// that shows the settle" and "the caller has the result". Dispatching the run and blocking the
// wait are not timed. cpu-ns/op is the process's CPU (user+system, every goroutine: fake,
// connector, client) over the timed parts; allocs/op counts every goroutine's allocations too.
func BenchmarkWakeFromFeedFrame(b *testing.B) {
	fk := t3fake.StartT(b, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	cs := benchConnector(b, fk)
	call := func(name string, args map[string]any) map[string]any {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil || res.IsError {
			b.Fatalf("%s(%v): %v %+v", name, args, err, res)
		}
		raw, _ := json.Marshal(res.StructuredContent)
		var out map[string]any
		_ = json.Unmarshal(raw, &out)
		return out
	}
	// The default script's last step completes the run: every step before it runs untimed.
	const steps = 7
	var cpu time.Duration
	b.ReportAllocs()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		d := call("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "write the docs"})
		tid, _ := d["thread_id"].(string)
		for range steps - 1 {
			fk.Step()
		}
		done := make(chan map[string]any, 1)
		go func() { done <- call("t3_wait", map[string]any{"thread_id": tid, "timeout": 60}) }()
		benchEventually(b, "the wait to block on its thread's subscription", func() bool { return fk.Stats().ThreadStreams == 1 })
		fk.StallShellStreams(true)
		c0 := processCPU()
		b.StartTimer()
		if !fk.Step() {
			b.Fatal("no step left to settle the run")
		}
		res := <-done
		b.StopTimer()
		cpu += processCPU() - c0
		fk.StallShellStreams(false)
		if res["reason"] != "completed" {
			b.Fatalf("wait result %v", res)
		}
		benchEventually(b, "the wait's subscription to close", func() bool { return fk.Stats().ThreadStreams == 0 })
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// benchConnector runs the connector in-process on fk (machine "mac") behind a 127.0.0.1
// listener and returns a go-sdk client session to it.
func benchConnector(b *testing.B, fk *t3fake.Server) *mcp.ClientSession {
	b.Helper()
	_, cs := benchApp(b, fk, nil)
	return cs
}

// benchApp is benchConnector with the connector itself (its fleet, to wait for what it has seen).
func benchApp(b *testing.B, fk *t3fake.Server, settings func(*app.Settings)) (*app.App, *mcp.ClientSession) {
	b.Helper()
	const tokenEnv = "T3CODE_MCP_BENCH_MAC_TOKEN"
	b.Setenv(tokenEnv, fk.Token())
	cfgPath := filepath.Join(b.TempDir(), "t3code.toml")
	cfg := fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = %q\nprojects = [\"api\"]\n", fk.URL(), tokenEnv)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		b.Fatal(err)
	}
	s, err := app.SettingsFromEnv(func(string) string { return "" })
	if err != nil {
		b.Fatal(err)
	}
	s.ConfigPath, s.StateDir = cfgPath, b.TempDir()
	if settings != nil {
		settings(&s)
	}
	a, err := app.New(s, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); a.Run(ctx) }()
	srv := httptest.NewServer(a.Handler)
	b.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		cancel()
		<-ran
		a.Close()
	})
	var cs *mcp.ClientSession
	// The client's goroutines are labelled side=client in CPU profiles (BenchmarkThreadFirstCall).
	pprof.Do(context.Background(), pprof.Labels("side", "client"), func(ctx context.Context) {
		cs, err = mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.StreamableClientTransport{Endpoint: srv.URL + "/mcp"}, nil)
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cs.Close() })
	benchEventually(b, "machine mac online", func() bool {
		for _, m := range a.Fleet.Machines() {
			if m.Info().Online {
				return true
			}
		}
		return false
	})
	return a, cs
}

func benchEventually(b *testing.B, what string, cond func() bool) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// processCPU is the process's CPU time so far (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
