package t3fake

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/coder/websocket"
	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// ackingSubscriber subscribes to the shell on its own socket and acks every chunk at once, as a
// fast connector would; it returns when the socket closes.
func ackingSubscriber(b *testing.B, s *Server) (done <-chan struct{}) {
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
	done := ackingSubscriber(b, s)
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
