package watch_test

import (
	"context"
	"sync"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// quickSink takes every change at once (ApplyQuick) but one with a row of status hold, which goes
// to Apply, and there waits for release.
type quickSink struct {
	hold    string
	entered chan struct{}
	release chan struct{}

	mu             sync.Mutex
	quick, applied int
}

func (s *quickSink) holds(c watch.Change) bool {
	for _, t := range c.Threads {
		if t.Status == s.hold {
			return true
		}
	}
	return false
}

func (s *quickSink) ApplyQuick(c watch.Change) bool {
	if s.holds(c) {
		return false
	}
	s.mu.Lock()
	s.quick++
	s.mu.Unlock()
	return true
}

func (s *quickSink) Apply(_ context.Context, c watch.Change) error {
	s.mu.Lock()
	s.applied++
	s.mu.Unlock()
	if s.holds(c) {
		s.entered <- struct{}{}
		<-s.release
	}
	return nil
}

func (s *quickSink) counts() (quick, applied int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quick, s.applied
}

// Against the fake T3 and its Ack flow control: a chunk the sink takes at once (QuickSink) is
// acknowledged without Apply; a chunk it does not take goes to Apply and is acknowledged only
// once Apply has returned (a detector's commit is durable), while the socket still serves other
// requests meanwhile (a dispatch on the same socket).
func TestQuickChunksAckedAtOnceOthersAfterTheSink(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	sink := &quickSink{hold: "completed", entered: make(chan struct{}), release: make(chan struct{})}
	r := start(t, fk, sink)
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	settled := func() bool {
		st := fk.Stats()
		return st.ShellStreams == 1 && st.ShellUnsettled == 0 && st.AcksReceived == st.ChunksSent
	}
	eventually(t, "the snapshot acknowledged", settled)
	tid := r.dispatch(t, pid, "do the thing")
	held := false
	for !held {
		if !fk.Step() {
			t.Fatalf("the run of %s ended without a %q row reaching the sink", tid, sink.hold)
		}
		eventually(t, "the step's chunk acknowledged or held", func() bool {
			select {
			case <-sink.entered:
				held = true
				return true
			default:
				return settled()
			}
		})
		if _, applied := sink.counts(); !held && applied != 0 {
			t.Fatalf("Apply called %d times for changes ApplyQuick took", applied)
		}
	}
	quick, applied := sink.counts()
	if quick == 0 || applied != 1 {
		t.Fatalf("ApplyQuick took %d changes and Apply got %d; want some and 1", quick, applied)
	}
	// Apply holds the chunk: T3 has not had its Ack.
	if st := fk.Stats(); st.ShellUnsettled != 1 || st.AcksReceived != st.ChunksSent-1 {
		t.Fatalf("while Apply holds a chunk: %d shell streams unsettled, %d Acks for %d chunks; want 1 and one Ack owed", st.ShellUnsettled, st.AcksReceived, st.ChunksSent)
	}
	// The socket's read loop is not held by it: a command on the same socket is answered.
	r.dispatch(t, pid, "another thing")
	close(sink.release)
	eventually(t, "every chunk acknowledged once Apply returned", settled)
	if s, ok := r.watcher.Thread(tid); !ok || s.Status != sink.hold {
		t.Fatalf("thread %s reads %+v, %v", tid, s, ok)
	}
}
