package watch_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/wait"
	"github.com/t3code-mcp/t3code-mcp/internal/watch"
)

// heldSink blocks the change that shows thread `on` completed until release is closed, as a
// group commit stuck behind a slow disk or other machines' chunks would.
type heldSink struct {
	mu      sync.Mutex
	on      string
	entered chan struct{} // closed when the completing change reached the sink
	release chan struct{}
	once    sync.Once
}

func (h *heldSink) hold(thread string) {
	h.mu.Lock()
	h.on = thread
	h.mu.Unlock()
}

func (h *heldSink) Apply(ctx context.Context, c watch.Change) error {
	h.mu.Lock()
	on := h.on
	h.mu.Unlock()
	for _, row := range c.Threads {
		if row.ID == on && row.Status == "completed" {
			h.once.Do(func() { close(h.entered) })
			select {
			case <-h.release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

// TestWaiterWokenBeforeTheCommit: a t3_wait on a run is answered from the watcher's memory as
// soon as the chunk that settles the run is decoded, while the sink (the detector's group
// commit) still holds that very chunk and T3 has not had its Ack. Nothing a waiter reads comes
// from the store, so a slow commit cannot delay it.
func TestWaiterWokenBeforeTheCommit(t *testing.T) {
	fk := t3fake.StartT(t, t3fake.Options{ManualSteps: true})
	pid := fk.AddProject("api", "/srv/api")
	sink := &heldSink{entered: make(chan struct{}), release: make(chan struct{})}
	r := start(t, fk, sink)
	eventually(t, "synced", func() bool { return r.watcher.Status().Synced })
	tid := r.dispatch(t, pid, "do the thing")
	sink.hold(tid)
	fk.Step()
	eventually(t, "the run to be running", func() bool {
		s, ok := r.watcher.Thread(tid)
		return ok && s.Status == "running"
	})

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type res struct {
		r   wait.Result
		err error
	}
	done := make(chan res, 1)
	go func() {
		wr, err := wait.Wait(ctx, r.watcher, wait.Target{ThreadID: tid}, wait.Options{})
		done <- res{wr, err}
	}()
	fk.StepAll()
	got := <-done
	if got.err != nil || got.r.Reason != wait.Completed {
		t.Fatalf("wait = %+v %v", got.r, got.err)
	}
	// The completed row came in a chunk the sink is handed right after it is applied.
	<-sink.entered
	if st := fk.Stats(); st.ShellUnsettled == 0 {
		t.Fatalf("the completing chunk was acknowledged while its commit was held: %+v", st)
	}
	close(sink.release)
	eventually(t, "the held chunk to be acknowledged", func() bool { return fk.Stats().ShellUnsettled == 0 })
}
