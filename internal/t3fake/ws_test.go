package t3fake

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

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

// onReader says whether the calling goroutine is a socket's reader (conn.readLoop).
func onReader() bool {
	buf := make([]byte, 8<<10)
	return bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("t3fake.(*conn).readLoop"))
}

// The rows a stream queued while its Chunk was out leave, once the Ack comes, on the socket's
// reader (reported there, right after the write): the writer goroutine is not woken for them,
// unless it was writing at that moment (then it takes them, counted in ackedToWriter). Five
// rounds of a Chunk held out, rows queued behind it, then its Ack.
func TestAckedChunkIsWrittenByTheReader(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	var (
		mu       sync.Mutex
		byReader = map[int64]bool{}
	)
	s.OnItemSent(func(kind string, seq int64, _ time.Time) {
		if strings.HasPrefix(kind, "shell:") && seq > 0 {
			r := onReader()
			mu.Lock()
			byReader[seq] = r
			mu.Unlock()
		}
	})
	c := dial(t, s, s.Token(), nil)
	shell := c.subscribe("orchestration.subscribeShell", `{}`, false)
	for len(c.chunks[shell]) == 0 {
		c.pump() // the snapshot, not acknowledged: what follows queues behind it
	}
	reader := 0
	for round := range 5 {
		tid := s.AddThread(pid, fmt.Sprintf("t%d", round), "idle")
		if _, err := s.StartRun(tid, "plain run"); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
		toWriter := s.ackedToWriter.Load()
		c.ack(shell)
		n := len(c.chunks[shell])
		for len(c.chunks[shell]) == n {
			c.pump()
		}
		// A Chunk is reported right after its write, which the client may see first; the Pong
		// of a barrier is written under wmu, after that report.
		c.barrier()
		wrote := s.ackedToWriter.Load() > toWriter
		mu.Lock()
		for _, v := range c.chunks[shell][n] {
			seq := int64(asMap(t, v)["sequence"].(float64))
			if r, ok := byReader[seq]; !ok || (!r && !wrote) {
				t.Errorf("round %d: row %d (reported %v) left on another goroutine than the reader, and the reader handed nothing to the writer", round, seq, ok)
			}
		}
		mu.Unlock()
		if !wrote {
			reader++
		}
	}
	if reader == 0 {
		t.Errorf("no Chunk of five written by the reader")
	}
}

// What a stream queued while its Chunk was out leaves as one Chunk after the Ack even when it
// is more than the reader writes itself (maxAckedWrite): the writer goroutine takes it.
func TestAckedQueueOverTheReadersBoundIsSent(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true})
	pid := s.AddProject("api", "/srv/api")
	c := dial(t, s, s.Token(), nil)
	shell := c.subscribe("orchestration.subscribeShell", `{}`, false)
	for len(c.chunks[shell]) == 0 {
		c.pump() // the snapshot, not acknowledged: what follows queues
	}
	for i := range 40 {
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
	if size <= maxAckedWrite {
		t.Fatalf("%d bytes queued, want more than %d", size, maxAckedWrite)
	}
	c.ack(shell)
	for len(c.chunks[shell]) < 2 {
		c.pump()
	}
	if got := len(c.chunks[shell][1]); got != queued {
		t.Errorf("the Chunk after the Ack holds %d items, want the %d queued", got, queued)
	}
	if n := s.ackedToWriter.Load(); n != 1 {
		t.Errorf("ackedToWriter %d, want 1", n)
	}
	c.barrier()
	if n := len(c.chunks[shell]); n != 2 {
		t.Errorf("%d Chunks, want 2 (one Ack)", n)
	}
}

// Acks that come in one frame (a JSON array, as effectrpc sends the Acks it owes together) count
// each in AcksReceived and once in AckFrames; a frame without an Ack (a Ping) counts in neither.
func TestAckFramesCountFramesNotAcks(t *testing.T) {
	s := StartT(t, Options{})
	c := dial(t, s, s.Token(), nil)
	a := c.subscribe("orchestration.subscribeShell", `{}`, false)
	b := c.subscribe("orchestration.subscribeShell", `{}`, false)
	for len(c.chunks[a]) == 0 || len(c.chunks[b]) == 0 {
		c.pump()
	}
	c.sendRaw(fmt.Sprintf(`[{"_tag":"Ack","requestId":%q},{"_tag":"Ack","requestId":%q}]`, a, b))
	c.barrier()
	if st := s.Stats(); st.AcksReceived != 2 || st.AckFrames != 1 {
		t.Fatalf("two Acks in one frame: AcksReceived %d, AckFrames %d; want 2, 1", st.AcksReceived, st.AckFrames)
	}
	c.ack(a)
	c.barrier()
	if st := s.Stats(); st.AcksReceived != 3 || st.AckFrames != 2 {
		t.Fatalf("then one Ack alone: AcksReceived %d, AckFrames %d; want 3, 2", st.AcksReceived, st.AckFrames)
	}
}
