package t3fake

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// goid is the calling goroutine's id, from its stack's first line ("goroutine 7 [running]:").
func goid() int64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	f := bytes.Fields(buf[:n])
	if len(f) < 2 {
		return 0
	}
	id, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return id
}

// onlySocket is the server's one open socket.
func onlySocket(t *testing.T, s *Server) *conn {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) != 1 {
		t.Fatalf("%d sockets open, want 1", len(s.conns))
	}
	for c := range s.conns {
		return c
	}
	return nil
}

// A step's shell row, and the first row of a run StartRun starts, leave on the goroutine that
// called Step or StartRun, before it returns: the socket's writer goroutine is not woken for
// them. Before each call a Ping round trip shows the server has read the client's last Ack, and
// taking and releasing wmu waits out the writer goroutine's last write (the Pong; a wake-up asked
// for meanwhile is taken before it lets wmu go), so nothing else is writing during the call.
func TestStepWritesItsChunkOnTheCallersGoroutine(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	tid := s.AddThread(pid, "t", "idle")
	type sent struct {
		seq  int64
		goid int64
	}
	var (
		mu   sync.Mutex
		rows []sent
	)
	s.OnItemSent(func(kind string, seq int64, _ time.Time) {
		if kind == "shell:thread.updated" {
			mu.Lock()
			rows = append(rows, sent{seq, goid()})
			mu.Unlock()
		}
	})
	c := dial(t, s, s.Token(), nil)
	shell := c.subscribeReady("orchestration.subscribeShell", `{}`)
	sc := onlySocket(t, s)
	me := goid()
	// call runs f and checks that the rows it sent were reported by its return, by this
	// goroutine; it returns f's result and how many rows it sent.
	call := func(name string, f func() bool) (bool, int) {
		t.Helper()
		c.barrier()
		sc.wmu.Lock()
		//lint:ignore SA2001 an empty critical section: waits for the writer goroutine's write to end
		sc.wmu.Unlock()
		mu.Lock()
		before := len(rows)
		mu.Unlock()
		items := len(c.items[shell])
		ok := f()
		mu.Lock()
		got := append([]sent(nil), rows[before:]...)
		mu.Unlock()
		c.barrier() // what f sent has arrived (and is acknowledged)
		if n := len(c.items[shell]) - items; len(got) != n {
			t.Fatalf("%s: %d rows reported by its return, %d arrived", name, len(got), n)
		}
		for _, r := range got {
			if r.goid != me {
				t.Fatalf("%s: the row at %d was written by goroutine %d, not the caller %d", name, r.seq, r.goid, me)
			}
		}
		return ok, len(got)
	}
	if _, n := call("StartRun", func() bool {
		_, err := s.StartRun(tid, "plain run")
		return err == nil
	}); n != 1 {
		t.Fatalf("StartRun sent %d rows, want 1", n)
	}
	written := 0
	for step := 1; ; step++ {
		ok, n := call(fmt.Sprintf("step %d", step), s.Step)
		if !ok {
			break
		}
		written += n
	}
	if st, _ := s.ThreadStatus(tid); st != "completed" || written == 0 {
		t.Errorf("thread %q after every step, %d rows written; want completed, some", st, written)
	}
}

// What a stream queued while its Chunk was out leaves as one Chunk after the Ack, even when it
// is more than the reader writes itself (inlineWriteMax): the writer goroutine takes it.
func TestAckedQueueOverTheInlineBoundIsSent(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	shell := c.subscribe("orchestration.subscribeShell", `{}`, false)
	for len(c.chunks[shell]) == 0 {
		c.pump() // the snapshot, not acknowledged: what follows queues
	}
	for i := range 20 {
		tid := s.AddThread(pid, fmt.Sprintf("t%d", i), "idle")
		if _, err := s.StartRun(tid, "plain run"); err != nil {
			t.Fatal(err)
		}
	}
	s.StepAll()
	sc := onlySocket(t, s)
	sc.mu.Lock()
	queued, size := 0, 0
	for _, sb := range sc.order {
		queued += len(sb.queue)
		for _, q := range sb.queue {
			size += len(q.raw)
		}
	}
	sc.mu.Unlock()
	if size <= inlineWriteMax {
		t.Fatalf("%d bytes queued, want more than %d", size, inlineWriteMax)
	}
	c.ack(shell)
	for len(c.chunks[shell]) < 2 {
		c.pump()
	}
	if got := len(c.chunks[shell][1]); got != queued {
		t.Errorf("the Chunk after the Ack holds %d items, want the %d queued", got, queued)
	}
	c.barrier()
	if n := len(c.chunks[shell]); n != 2 {
		t.Errorf("%d Chunks, want 2 (one Ack)", n)
	}
}

// The reader reads every frame into one buffer it keeps: nothing decoded from a frame may point
// into it. A message's text, dispatched first, is still whole after later frames (the same
// length, other bytes; one larger than the kept buffer) were read over it.
func TestFramesReadIntoOneBufferKeepNothingOfIt(t *testing.T) {
	s := StartT(t, Options{})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	texts := map[string]string{
		"thread-a": strings.Repeat("a", 3000),
		"thread-b": strings.Repeat("b", 3000),
		"thread-c": strings.Repeat("c", maxReadBuffer+1000),
		"thread-d": strings.Repeat("d", 3000),
	}
	for i, tid := range []string{"thread-a", "thread-b", "thread-c", "thread-d"} {
		c.success(c.call("orchestration.dispatchCommand", createThreadPayload(fmt.Sprintf("c-create-%d", i), tid, pid)))
		c.success(c.call("orchestration.dispatchCommand", dispatchPayload(fmt.Sprintf("c-run-%d", i), tid, fmt.Sprintf("m-%d", i), texts[tid])))
	}
	for tid, text := range texts {
		var p t3rpc.ThreadProjection
		if err := p.Decode(jx.DecodeBytes(c.success(c.call("orchestration.getThreadProjection", fmt.Sprintf(`{"threadId":%q}`, tid))))); err != nil {
			t.Fatal(err)
		}
		found := false
		for _, m := range p.Messages {
			if m.Role == "user" {
				found = true
				if m.Text != text {
					t.Errorf("%s: user message of %d bytes starts %.20q, want %d bytes of %q", tid, len(m.Text), m.Text, len(text), text[:1])
				}
			}
		}
		if !found {
			t.Errorf("%s: no user message", tid)
		}
	}
}
