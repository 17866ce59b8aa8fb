// Package wait blocks until a thread's run settles or asks a question. It is
// woken by the machine's watcher (no polling loop): each wake re-reads the
// thread's shell row and decides with the rules in package threadstate.
package wait

import (
	"context"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// Reason says why a wait returned.
type Reason string

const (
	Completed   Reason = "completed"
	Interrupted Reason = "interrupted"
	Failed      Reason = "failed"
	Question    Reason = "question"
	Timeout     Reason = "timeout"
	// Idle: the thread has no run to wait for.
	Idle Reason = "idle"
)

// Source is the machine's watcher.
type Source interface {
	// ThreadAndWait returns the thread's row and a channel closed at its next
	// change, atomically.
	ThreadAndWait(id string) (t3rpc.ThreadShell, bool, <-chan struct{})
}

// RunLookup finds the run T3 created for one of our messages (its
// userMessageId) and that run's status. found is false while T3 has not
// created it yet.
type RunLookup func(ctx context.Context, messageID string) (runID, status string, found bool, err error)

// Target says what to wait for.
type Target struct {
	ThreadID string
	// MessageID of the message t3_dispatch sent last; the wait is for the run
	// T3 made from it, never an earlier run. Empty: wait for the latest run.
	MessageID string
	// RunID, when already known for MessageID.
	RunID string
	// Answered lists request ids answered through this connector: T3 may still
	// show them pending for a moment, and they must not count as questions.
	Answered map[string]bool
}

// Result of a wait.
type Result struct {
	Reason Reason
	RunID  string
	// RequestID of the pending question when Reason is Question.
	RequestID string
	Shell     t3rpc.ThreadShell
}

// Options of one wait.
type Options struct {
	Lookup RunLookup
	// Progress, when set, is called about every ProgressEvery while waiting.
	Progress      func(elapsed time.Duration, shell t3rpc.ThreadShell)
	ProgressEvery time.Duration
}

// Wait blocks until the target run settles, a question is pending, or ctx
// ends. A ctx that ends by deadline yields Reason Timeout; one cancelled by the
// client yields ctx.Err().
func Wait(ctx context.Context, src Source, t Target, o Options) (Result, error) {
	start := time.Now()
	var tick <-chan time.Time
	if o.Progress != nil {
		every := o.ProgressEvery
		if every <= 0 {
			every = 15 * time.Second
		}
		tk := time.NewTicker(every)
		defer tk.Stop()
		tick = tk.C
	}
	var last t3rpc.ThreadShell
	for {
		shell, ok, changed := src.ThreadAndWait(t.ThreadID)
		if ok {
			last = shell
			r, done, err := evaluate(ctx, &t, shell, o.Lookup)
			if err != nil {
				return Result{}, err
			}
			if done {
				return r, nil
			}
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				return Result{Reason: Timeout, RunID: t.RunID, Shell: last}, nil
			}
			return Result{}, ctx.Err()
		case <-changed:
		case <-tick:
			o.Progress(time.Since(start), last)
		}
	}
}

// evaluate decides whether the wait is over, from the thread's row.
func evaluate(ctx context.Context, t *Target, shell t3rpc.ThreadShell, lookup RunLookup) (Result, bool, error) {
	if p, ok := threadstate.PendingRequest(&shell); ok && !t.Answered[p.ID] {
		return Result{Reason: Question, RunID: threadstate.LatestRun(&shell), RequestID: p.ID, Shell: shell}, true, nil
	}
	latest := threadstate.LatestRun(&shell)
	if t.MessageID == "" {
		if latest == "" {
			if threadstate.Busy(&shell) {
				return Result{}, false, nil
			}
			return Result{Reason: Idle, Shell: shell}, true, nil
		}
		t.RunID = latest
		if out, ok := threadstate.Settled(shell.Status); ok {
			return Result{Reason: Reason(out), RunID: latest, Shell: shell}, true, nil
		}
		return Result{}, false, nil
	}
	if t.RunID == "" {
		if latest == "" || lookup == nil {
			return Result{}, false, nil // T3 has not made our run yet
		}
		runID, status, found, err := lookup(ctx, t.MessageID)
		if err != nil {
			return Result{}, false, err
		}
		if !found {
			return Result{}, false, nil
		}
		t.RunID = runID
		if runID != latest {
			// A later run exists, so ours is over; its own status says how.
			if out, ok := threadstate.Settled(status); ok {
				return Result{Reason: Reason(out), RunID: runID, Shell: shell}, true, nil
			}
			return Result{}, false, nil
		}
	}
	if latest == t.RunID {
		if out, ok := threadstate.Settled(shell.Status); ok {
			return Result{Reason: Reason(out), RunID: t.RunID, Shell: shell}, true, nil
		}
		return Result{}, false, nil
	}
	if lookup == nil {
		return Result{}, false, nil
	}
	// The thread moved past our run (another run started): read ours.
	_, status, found, err := lookup(ctx, t.MessageID)
	if err != nil || !found {
		return Result{}, false, err
	}
	if out, ok := threadstate.Settled(status); ok {
		return Result{Reason: Reason(out), RunID: t.RunID, Shell: shell}, true, nil
	}
	return Result{}, false, nil
}
