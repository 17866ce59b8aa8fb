// Package wait blocks until a thread's run settles or asks a question. It is
// woken by the machine's watcher (no polling loop): each wake re-reads the
// thread's shell row and judges the run with threadstate.Judge, from the row's
// run pointers (activeRunId, latestRunId) first and its status only where the
// status is about that run.
//
// A wait reads nothing from T3 while the row can answer, which is every
// ordinary case: a dispatched run whose id the dispatch learned from the row,
// a queued follow-up, a run that completes, fails, is interrupted or asks. It
// reads the thread (Options.Read, one bounded read) only when the row cannot
// tell: the run is neither the active nor the latest one (a later run was
// queued behind it), the row says "idle" or a word this connector does not
// know after the run ended, or the run of a dispatched message is not known
// yet. Each such read happens once per distinct row state, never in a loop.
//
// Once the wait blocks it is also woken by the thread's own subscription
// (Options.Blocked returns it, a Feed): T3 sends the shell stream's next chunk
// only after the connector acknowledged the one before, which it does once
// that chunk is durable, so the row that says a run settled can queue behind
// other threads' commits, while the thread's stream has Acks of its own. The
// feed's projection is judged as the row is: threadstate.RowOf gives the row
// T3 shows for it, and the same judgement decides. Only what the row alone
// decides wakes the wait from the feed (the run settled and how, a question
// of that run); whatever would need a read is left to the row. Whichever
// stream shows it first wakes the wait, with the same result.
package wait

import (
	"context"
	"errors"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// Reason says why a wait returned: what became of the run (a threadstate.Outcome) or one of the
// wait's own reasons below.
type Reason = threadstate.Outcome

const (
	Completed          = threadstate.Completed
	Interrupted        = threadstate.Interrupted
	Failed             = threadstate.Failed
	Question           = threadstate.Question
	Timeout     Reason = "timeout"
	// Idle: the thread has no run to wait for.
	Idle Reason = "idle"
	// Archived: the thread was archived (it left the machine's active list);
	// its run, if one was going, does not settle in a way this wait can see.
	Archived Reason = "archived"
)

// ErrThreadRemoved is returned when the thread is deleted while waited on.
var ErrThreadRemoved = errors.New("the thread was deleted on its machine")

// Source is the machine's watcher.
type Source interface {
	// ThreadAndWait returns the thread's row and a channel closed at its next
	// change, atomically.
	ThreadAndWait(id string) (t3rpc.ThreadShell, bool, <-chan struct{})
	// Gone reports why a thread the watcher does not list left it: "archive"
	// (archived) or "removed" (deleted); ok is false for a thread it never saw
	// leave.
	Gone(id string) (where string, ok bool)
}

// Reader reads the thread from T3: the bounded read (every run, recent
// timeline rows). Called only when the row cannot tell (package comment).
type Reader func(ctx context.Context) (*t3api.ThreadProjection, error)

// Target says what to wait for.
type Target struct {
	ThreadID string
	// RunID is the run to wait for, when known (t3_dispatch learns it from the
	// row right after T3 accepted the message).
	RunID string
	// MessageID of the message t3_dispatch sent last, when its run is not
	// known: the wait is for the run T3 made from it, never an earlier run.
	// Empty with RunID empty: wait for the latest run.
	MessageID string
	// Answered lists request ids answered through this connector: T3 may still
	// show them pending for a moment, and they must not count as questions.
	Answered map[string]bool
}

// Result of a wait.
type Result struct {
	Reason Reason
	RunID  string
	// RunStatus is the run's own status in T3 when it settled (completed,
	// failed, interrupted, cancelled, rolled_back): Reason is derived from it
	// (threadstate.Settled: cancelled reads as interrupted), so a caller can
	// still tell a cancelled run from an interrupted one.
	RunStatus string
	// RequestID of the pending request when Reason is Question.
	RequestID string
	// Shell is the row the result was judged from: the watcher's, or for a
	// wait woken by its feed the row T3 shows for the feed's projection
	// (threadstate.RowOf).
	Shell t3rpc.ThreadShell
	// WokenBy says which stream showed the run settle or ask once the wait
	// had blocked ("" for a wait that ended at once, a timeout, an archived
	// thread or an idle one).
	WokenBy WokenBy
	// Projection is the thread as read while deciding (nil when the row was
	// enough): the caller renders from it instead of reading again.
	Projection *t3api.ThreadProjection
	// Reads counts the reads of the thread the wait made.
	Reads int
}

// WokenBy names the stream that woke a wait.
type WokenBy string

const (
	// ByShell: the machine's shell stream (the watcher's row).
	ByShell WokenBy = "shell"
	// ByFeed: the thread's own subscription (threadfeed).
	ByFeed WokenBy = "feed"
)

// Feed is the thread's own subscription (threadfeed.Feed).
type Feed interface {
	// Look calls see with the projection now (when there is one) and returns
	// the channel closed at its next change, or why the feed stopped.
	Look(see func(p *t3api.ThreadProjection)) (changed <-chan struct{}, err error)
}

// Options of one wait.
type Options struct {
	Read Reader
	// Progress, when set, is called about every ProgressEvery while waiting.
	Progress      func(elapsed time.Duration, shell t3rpc.ThreadShell)
	ProgressEvery time.Duration
	// Blocked, when set, is called once, the first time the row says the
	// run is not over yet and the wait blocks (t3_wait then subscribes to
	// the thread, so that its result needs no read; a wait that ends at once
	// does not). The feed it returns, when not nil, wakes the wait too.
	Blocked func() Feed
}

// Wait blocks until the target run settles, a question of that run is
// pending, the thread is archived, or ctx ends. A ctx that ends by deadline
// yields Reason Timeout; one cancelled (the client gave up) yields ctx.Err().
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
	w := &waiter{t: t, read: o.Read}
	var last t3rpc.ThreadShell
	blocked := false
	var feed Feed
	for {
		shell, ok, changed := src.ThreadAndWait(t.ThreadID)
		if ok {
			last = shell
			r, done, err := w.evaluate(ctx, shell)
			if err != nil {
				return Result{}, err
			}
			if done {
				if blocked && r.Reason != Idle {
					r.WokenBy = ByShell
				}
				r.Reads = w.reads
				return r, nil
			}
		} else if where, gone := src.Gone(t.ThreadID); gone {
			if where == "removed" {
				return Result{}, ErrThreadRemoved
			}
			return Result{Reason: Archived, RunID: w.t.RunID, Shell: last, Reads: w.reads}, nil
		}
		if !blocked && o.Blocked != nil {
			blocked = true
			feed = o.Blocked()
		}
		// Until the row changes: the feed's changes are judged alone.
	feedChanges:
		for {
			var feedChanged <-chan struct{}
			if feed != nil && last.ID != "" {
				r, done, ch := w.fromFeed(feed, last)
				if done {
					r.WokenBy, r.Reads = ByFeed, w.reads
					return r, nil
				}
				if feedChanged = ch; ch == nil {
					feed = nil // it stopped: the row alone wakes the wait
				}
			}
			select {
			case <-ctx.Done():
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return Result{Reason: Timeout, RunID: w.t.RunID, Shell: last, Reads: w.reads}, nil
				}
				return Result{}, ctx.Err()
			case <-changed:
				break feedChanges
			case <-feedChanged:
			case <-tick:
				o.Progress(time.Since(start), last)
			}
		}
	}
}

// fromFeed judges the run from the feed's projection: the row T3 shows for
// it (threadstate.RowOf), judged as the watcher's row is (judgeRow). Only
// what the row alone decides ends the wait here; changed is nil once the
// feed has stopped.
func (w *waiter) fromFeed(f Feed, last t3rpc.ThreadShell) (r Result, done bool, changed <-chan struct{}) {
	changed, err := f.Look(func(p *t3api.ThreadProjection) {
		if w.t.RunID == "" && w.t.MessageID != "" {
			// The run T3 made of our message: the same match the read makes.
			for i := range p.Runs {
				if m, ok := p.Runs[i].UserMessageId.Get(); ok && m == w.t.MessageID {
					w.t.RunID = p.Runs[i].ID
				}
			}
		}
		if w.t.RunID == "" {
			return // a run is judged only by its identity, never "the latest"
		}
		row, ok := threadstate.RowOf(p, last)
		if !ok {
			return
		}
		r, _, done = w.judgeRow(&row, w.t.RunID)
		if done && r.Reason == Question {
			// The result shows the question: its row must be in the feed
			// too (it is in a read's).
			done = hasRequestRow(p, r.RequestID)
		}
	})
	if err != nil {
		return Result{}, false, nil
	}
	return r, done, changed
}

// hasRequestRow reports whether p holds the timeline row of request id.
func hasRequestRow(p *t3api.ThreadProjection, id string) bool {
	for i := range p.TurnItems {
		if p.TurnItems[i].RequestId.Or("") == id {
			return true
		}
	}
	return false
}

// waiter is one wait's memory between wakes.
type waiter struct {
	t     Target
	read  Reader
	reads int
	// readAt is the row state (rowKey) of the last read: a row that has not
	// changed since cannot make a new read say anything new.
	readAt string
	// lastRead is the projection of that read.
	lastRead *t3api.ThreadProjection
}

func rowKey(s *t3rpc.ThreadShell) string {
	return threadstate.ActiveRun(s) + "\x00" + threadstate.LatestRun(s) + "\x00" + s.Status
}

// readOnce reads the thread unless it was read at this very row state.
func (w *waiter) readOnce(ctx context.Context, row *t3rpc.ThreadShell) (*t3api.ThreadProjection, bool, error) {
	if w.read == nil {
		return nil, false, nil
	}
	key := rowKey(row)
	if key == w.readAt {
		return w.lastRead, false, nil
	}
	p, err := w.read(ctx)
	if err != nil {
		return nil, false, err
	}
	w.reads++
	w.readAt, w.lastRead = key, p
	return p, true, nil
}

// evaluate decides whether the wait is over, from the thread's row.
func (w *waiter) evaluate(ctx context.Context, row t3rpc.ThreadShell) (Result, bool, error) {
	if w.t.RunID == "" && w.t.MessageID != "" {
		// Which run did T3 make of our message? Not on the row: read.
		p, fresh, err := w.readOnce(ctx, &row)
		if err != nil {
			return Result{}, false, err
		}
		if p != nil {
			if r, ok := threadview.New(p).RunByMessage(w.t.MessageID); ok {
				w.t.RunID = r.ID
			} else if fresh && !threadstate.Busy(&row) {
				// T3 has no run for it and nothing is under way: the message
				// never made a run (refused, or dispatched by a connector
				// that did not say). Report what there is.
				return Result{Reason: Idle, RunID: threadstate.LatestRun(&row), Shell: row, Projection: p}, true, nil
			}
		}
		if w.t.RunID == "" {
			return Result{}, false, nil
		}
	}
	if w.t.RunID == "" {
		latest := threadstate.LatestRun(&row)
		if latest == "" {
			if threadstate.Busy(&row) {
				return Result{}, false, nil
			}
			return Result{Reason: Idle, Shell: row}, true, nil
		}
		// Waiting for "the latest run": the one the row shows now.
		w.t.RunID = latest
	}
	run := w.t.RunID
	r, verdict, done := w.judgeRow(&row, run)
	if done || verdict == threadstate.RunBusy {
		return r, done, nil
	}
	// RunUnknown (a later run is queued or running; ours may be over or still
	// queued) or RunSettledUnreadable (over, the row does not say how): the
	// run's own record tells.
	p, _, err := w.readOnce(ctx, &row)
	if err != nil || p == nil {
		return Result{}, false, err
	}
	rec, found := threadview.New(p).Run(run)
	if !found {
		if verdict == threadstate.RunSettledUnreadable {
			return Result{Reason: Idle, RunID: run, Shell: row, Projection: p}, true, nil
		}
		return Result{}, false, nil
	}
	if o, ok := threadstate.Settled(rec.Status); ok {
		return Result{Reason: o, RunID: run, RunStatus: rec.Status, Shell: row, Projection: p}, true, nil
	}
	return Result{}, false, nil
}

// judgeRow is what the row alone says of run: a question of it, or its end
// and how (done); else the verdict says what is not known. The wait judges
// the watcher's row and the feed's (threadstate.RowOf) with it.
func (w *waiter) judgeRow(row *t3rpc.ThreadShell, run string) (Result, threadstate.Verdict, bool) {
	if p, ok := threadstate.PendingRequest(row); ok && !w.t.Answered[p.ID] && asksFor(row, run) {
		return Result{Reason: Question, RunID: run, RequestID: p.ID, Shell: *row}, threadstate.RunBusy, true
	}
	out, verdict := threadstate.Judge(row, run)
	if verdict == threadstate.RunSettled {
		// The row's status is about this run (the latest).
		return Result{Reason: out, RunID: run, RunStatus: row.Status, Shell: *row}, verdict, true
	}
	return Result{}, verdict, false
}

// asksFor reports whether the row's pending request belongs to run: only the
// active run can ask, so a request while another run is active (ours queued
// behind it) is not ours.
func asksFor(row *t3rpc.ThreadShell, run string) bool {
	if active := threadstate.ActiveRun(row); active != "" {
		return active == run
	}
	// A row without an active pointer (an older server, or the pointer
	// cleared a moment early): the request is the latest run's.
	return threadstate.LatestRun(row) == run
}
