package t3fake

import (
	"net/http"
	"sync"
	"sync/atomic"
)

// threadFaults make the reads of single threads fail or hang, while every
// other thread reads normally: one unreadable thread among many busy ones.
type threadFaults struct {
	on     atomic.Bool // any fault set: the read path skips the lock otherwise
	mu     sync.Mutex
	status map[string]int           // thread id → HTTP status to answer
	hang   map[string]chan struct{} // thread id → closed to release
	idle   map[string]bool          // thread id → rows say "idle" after a run
}

// FailThreadReads makes the HTTP reads of one thread (/threads/{id},
// /bounded, /history) answer status with EnvironmentInternalError; 0 turns
// it off.
func (s *Server) FailThreadReads(threadID string, status int) {
	f := &s.threadFaults
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.status == nil {
		f.status = map[string]int{}
	}
	if status == 0 {
		delete(f.status, threadID)
		return
	}
	f.status[threadID] = status
	f.on.Store(true)
}

// HangThreadReads makes the HTTP reads of one thread block while on (a
// client's timeout ends them); off releases them.
func (s *Server) HangThreadReads(threadID string, on bool) {
	f := &s.threadFaults
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hang == nil {
		f.hang = map[string]chan struct{}{}
	}
	ch, hung := f.hang[threadID]
	switch {
	case on && !hung:
		f.hang[threadID] = make(chan struct{})
		f.on.Store(true)
	case !on && hung:
		close(ch)
		delete(f.hang, threadID)
	}
}

// apply answers (or holds) a read of a faulty thread; it reports whether it
// answered.
func (f *threadFaults) apply(w http.ResponseWriter, r *http.Request, stop <-chan struct{}, failReason string) bool {
	if !f.on.Load() {
		return false
	}
	id := r.PathValue("id")
	if id == "" {
		return false
	}
	f.mu.Lock()
	status, hang := f.status[id], f.hang[id]
	f.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			return true
		case <-stop:
			return true
		}
	}
	if status != 0 {
		writeError(w, status, "EnvironmentInternalError", "internal_error", failReason)
		return true
	}
	return false
}

// ReportIdleAfterRuns makes one thread's shell row say "idle" instead of the
// run's terminal status when a run ends (activeRunId null, latestRunId the
// run): a server whose row does not tell how the run ended.
func (s *Server) ReportIdleAfterRuns(threadID string, on bool) {
	f := &s.threadFaults
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.idle == nil {
		f.idle = map[string]bool{}
	}
	if on {
		f.idle[threadID] = true
		f.on.Store(true)
	} else {
		delete(f.idle, threadID)
	}
}

// settledStatus is the shell status for a run of the thread that ended.
func (f *threadFaults) settledStatus(threadID, status string) string {
	if !f.on.Load() {
		return status
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.idle[threadID] {
		return "idle"
	}
	return status
}

// StallThreadStreams holds back the chunks of every subscribeThread stream while on (the shell
// stream goes on): a thread subscription that lags behind the shell. Items keep queueing and
// flow again, batched, when it is turned off.
func (s *Server) StallThreadStreams(on bool) {
	s.stallThreads.Store(on)
	if !on {
		s.wakeAll()
	}
}

// StallShellStreams holds back the chunks of every subscribeShell stream while on (the thread
// streams go on): a shell stream behind its thread streams, as when its next chunk waits for the
// connector's Ack of a chunk it is still committing. Items keep queueing and flow again, batched,
// when it is turned off.
func (s *Server) StallShellStreams(on bool) {
	s.stallShell.Store(on)
	if !on {
		s.wakeAll()
	}
}

// FailThreadSubscriptions makes orchestration.subscribeThread fail while on (Exit Failure with
// T3's projection error, as for a thread T3 cannot load).
func (s *Server) FailThreadSubscriptions(on bool) { s.failThreadSubs.Store(on) }
