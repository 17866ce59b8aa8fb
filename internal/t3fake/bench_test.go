package t3fake

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// ackingSubscriber subscribes to the shell on its own socket and acks every chunk at once, as a
// fast connector would, then sends on acked (when not nil); done closes with the socket.
func ackingSubscriber(b *testing.B, s *Server, acked chan<- struct{}) (done <-chan struct{}) {
	b.Helper()
	ctx := context.Background()
	ws, _, err := websocket.Dial(ctx, s.WebSocketURL()+"?orchestrationProtocol=2", &websocket.DialOptions{
		HTTPClient: httpClient, HTTPHeader: map[string][]string{"Authorization": {"Bearer " + s.Token()}},
	})
	if err != nil {
		b.Fatal(err)
	}
	ws.SetReadLimit(-1)
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"_tag":"Request","id":"0","tag":"orchestration.subscribeShell","payload":{"requestCompletionMarker":true},"headers":[]}`)); err != nil {
		b.Fatal(err)
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			var m t3rpc.ServerMessage
			if m.Decode(jx.DecodeBytes(data)) == nil && m.IsChunk() {
				_ = ws.Write(ctx, websocket.MessageText, []byte(`{"_tag":"Ack","requestId":"0"}`))
				if acked != nil {
					acked <- struct{}{}
				}
			}
		}
	}()
	return ch
}

// BenchmarkTransitions measures scripted steps per second on 1,000 threads with one shell
// subscriber acking every chunk: each step is one transition (events, a shell row, fan-out).
func BenchmarkTransitions(b *testing.B) {
	s, err := New(Options{ManualSteps: true})
	if err != nil {
		b.Fatal(err)
	}
	pid := s.AddProject("load", "/srv/load")
	threads := make([]string, 1000)
	for i := range threads {
		threads[i] = s.AddThread(pid, fmt.Sprint("load ", i), "idle")
	}
	done := ackingSubscriber(b, s, nil)
	b.ReportAllocs()
	b.ResetTimer()
	steps := 0
	for steps < b.N {
		for _, tid := range threads {
			if _, err := s.StartRun(tid, "benchmark run"); err != nil {
				b.Fatal(err)
			}
		}
		steps += s.StepAll()
	}
	b.StopTimer()
	b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
	s.Close()
	<-done
}

// BenchmarkThreadGET5000 is the fake's side of GET /api/orchestration/threads/{id} on a thread
// with 1,000 default-script runs (5,000 turn items), body read and discarded: what a t3_thread
// call or an event's read costs the harness's T3.
func BenchmarkThreadGET5000(b *testing.B) {
	s, err := New(Options{ManualSteps: true, KeepRuns: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	pid := s.AddProject("load", "/srv/load")
	tid := s.AddThread(pid, "big", "idle")
	for i := range 1000 {
		if _, err := s.StartRun(tid, fmt.Sprint("benchmark run ", i)); err != nil {
			b.Fatal(err)
		}
		s.StepAll()
	}
	get := func() int64 {
		req, _ := http.NewRequest("GET", s.URL()+"/api/orchestration/threads/"+tid, nil)
		req.Header.Set("Authorization", "Bearer "+s.Token())
		req.Header.Set("x-t3-orchestration-protocol", "2")
		res, err := httpClient.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		defer res.Body.Close()
		n, err := io.Copy(io.Discard, res.Body)
		if err != nil || res.StatusCode != 200 {
			b.Fatalf("GET: %d %v", res.StatusCode, err)
		}
		return n
	}
	b.SetBytes(get())
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		get()
	}
}

// BenchmarkBoundedGET is the fake's side of GET /api/orchestration/threads/{id}/bounded, the read
// of a t3_thread call's first call on a thread, on threads of 1,000 and 10,000 default-script runs
// (5,000 and 50,000 turn items), body read and discarded; cpu-ns/op is the process's CPU (the
// client's read included) per GET.
func BenchmarkBoundedGET(b *testing.B) {
	for _, runs := range []int{1_000, 10_000} {
		s, err := New(Options{ManualSteps: true, KeepRuns: -1})
		if err != nil {
			b.Fatal(err)
		}
		tid := s.AddThread(s.AddProject("load", "/srv/load"), "big", "idle")
		for i := range runs {
			if _, err := s.StartRun(tid, fmt.Sprint(loadPrompt, " ", i)); err != nil {
				b.Fatal(err)
			}
			s.StepAll()
		}
		get := func() int64 {
			req, _ := http.NewRequest("GET", s.URL()+"/api/orchestration/threads/"+tid+"/bounded", nil)
			req.Header.Set("Authorization", "Bearer "+s.Token())
			req.Header.Set("x-t3-orchestration-protocol", "2")
			req.Header.Set("Accept-Encoding", "identity") // as the connector reads a machine on 127.0.0.1
			res, err := httpClient.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			defer res.Body.Close()
			n, err := io.Copy(io.Discard, res.Body)
			if err != nil || res.StatusCode != 200 {
				b.Fatalf("GET: %d %v", res.StatusCode, err)
			}
			return n
		}
		b.Run(fmt.Sprintf("items=%d", runs*5), func(b *testing.B) {
			b.SetBytes(get())
			b.ReportAllocs()
			runtime.GC()
			cpu0 := processCPU(b)
			for b.Loop() {
				get()
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
		})
		s.Close()
	}
}

// loadPrompt is the load harness's prompt (internal/loadtest.Prompt, which imports this package).
const loadPrompt = "Fix the flaky test in the payment service: the retry loop asserts before the ledger has settled, " +
	"so make it wait for the settlement event and run the whole suite afterwards."

// countingSubscriber subscribes to the shell and acks every Chunk without decoding it (a frame
// that starts with the Chunk tag), so that the benchmark measures the fake, not a decoder.
func countingSubscriber(b *testing.B, s *Server) (done <-chan struct{}) {
	b.Helper()
	ctx := context.Background()
	ws, _, err := websocket.Dial(ctx, s.WebSocketURL()+"?orchestrationProtocol=2", &websocket.DialOptions{
		HTTPClient: httpClient, HTTPHeader: map[string][]string{"Authorization": {"Bearer " + s.Token()}},
	})
	if err != nil {
		b.Fatal(err)
	}
	ws.SetReadLimit(-1)
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"_tag":"Request","id":"0","tag":"orchestration.subscribeShell","payload":{"requestCompletionMarker":true},"headers":[]}`)); err != nil {
		b.Fatal(err)
	}
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		chunk := []byte(`{"_tag":"Chunk"`)
		head := make([]byte, len(chunk))
		buf := make([]byte, 64<<10)
		for {
			_, r, err := ws.Reader(ctx)
			if err != nil {
				return
			}
			n, _ := io.ReadFull(r, head)
			if _, err := io.CopyBuffer(io.Discard, r, buf); err != nil {
				return
			}
			if n == len(chunk) && string(head) == string(chunk) {
				_ = ws.Write(ctx, websocket.MessageText, []byte(`{"_tag":"Ack","requestId":"0"}`))
			}
		}
	}()
	return ch
}

// processCPU is the process's user+system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLoadRuns is the fake's cost per settled run as the load harness drives it: 1,000
// threads with uuid-length ids and one finished run each, the harness's prompt, KeepRuns 20, a
// new default-script run on every thread per round and every queued run stepped once per round
// until it settles (seven steps, eight shell rows, twelve events), one shell subscriber that
// acks every Chunk. One op is one settled run.
func BenchmarkLoadRuns(b *testing.B) {
	s, err := New(Options{ManualSteps: true, KeepRuns: 20})
	if err != nil {
		b.Fatal(err)
	}
	pid := s.AddProject("load", "/srv/load")
	threads := make([]string, 1000)
	for i := range threads {
		threads[i] = fmt.Sprintf("thread-%08x-1111-4222-8333-%012x", i, i)
		if err := s.AddThreadWithID(pid, threads[i], fmt.Sprint("Load thread ", i, " on m-0")); err != nil {
			b.Fatal(err)
		}
		if _, err := s.StartRun(threads[i], loadPrompt); err != nil {
			b.Fatal(err)
		}
	}
	s.StepAll()
	done := countingSubscriber(b, s)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	runs := 0
	for runs < b.N {
		for _, tid := range threads {
			if _, err := s.StartRun(tid, loadPrompt); err != nil {
				b.Fatal(err)
			}
		}
		s.StepAll()
		runs += len(threads)
	}
	b.StopTimer()
	b.ReportMetric(float64(runs)/b.Elapsed().Seconds(), "runs/s")
	// CPU per run of the whole process (the fake and the subscriber's reads): on a shared
	// machine wall time says more about the neighbours than about the fake.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(runs), "cpu-ns/run")
	s.Close()
	<-done
}

// BenchmarkShellRow is one thread.updated row of a thread with an active default-script run (the
// harness's prompt as its visible message, uuid-length ids) encoded into the log and fanned out to
// no subscriber: the fake's cost per shell row, eight of which make a run.
func BenchmarkShellRow(b *testing.B) {
	s, err := New(Options{ManualSteps: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	pid := s.AddProject("load", "/srv/load")
	tid := "thread-00000001-1111-4222-8333-000000000001"
	if err := s.AddThreadWithID(pid, tid, "Load thread 1 on m-0"); err != nil {
		b.Fatal(err)
	}
	if _, err := s.StartRun(tid, loadPrompt); err != nil {
		b.Fatal(err)
	}
	s.Step()
	s.mu.Lock()
	defer s.mu.Unlock()
	th := s.threadByID[tid]
	th.mu.Lock()
	defer th.mu.Unlock()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s.touch(th)
		s.publishShell(th)
	}
	b.SetBytes(int64(len(s.log[len(s.log)-1].shell)))
}

// BenchmarkPromptFacts is a run's look-up of its prompt's facts (script, excerpt), twice per
// default-script run: same, one prompt string every time (a driver's; remembered since 12-02);
// alternating, two prompts in turn, each a look-up in the map by the prompt's bytes (every
// look-up before 12-02).
func BenchmarkPromptFacts(b *testing.B) {
	s, err := New(Options{ManualSteps: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	hang := "Hang on: " + loadPrompt
	s.mu.Lock()
	defer s.mu.Unlock()
	b.Run("same", func(b *testing.B) {
		for b.Loop() {
			_ = s.facts(loadPrompt)
		}
	})
	b.Run("alternating", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if i++; i%2 == 0 {
				_ = s.facts(loadPrompt)
			} else {
				_ = s.facts(hang)
			}
		}
	})
}
