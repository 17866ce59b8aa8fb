package tools

import (
	"context"
	"errors"
	"fmt"
	"runtime/trace"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/threadfeed"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/wait"
)

func waitTool(d *Deps) func(context.Context, *Call, *mcptools.WaitInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.WaitInput) (Result, error) {
		const tool = mcptools.ToolWait
		if len(in.ThreadIds) > 0 || !in.ThreadID.Set {
			return d.waitAny(ctx, c, *in) // waitany.go
		}
		// A thread archived before the call is found too: the wait then
		// answers archived at once (wait.Wait asks the watcher's Gone).
		f, err := d.Fleet.ThreadOrGone(in.ThreadID.Value)
		if err != nil {
			return Result{}, err
		}
		if err := f.Machine.Ready(); err != nil {
			return Result{}, err
		}
		ctx, timeout, end, err := d.beginWait(ctx, c, *in)
		if err != nil {
			return Result{}, err
		}
		defer end()

		target, wr := waitTarget(f, d.answered.snapshot())
		defer wr.close()
		m := f.Machine
		opts := wait.Options{Read: wr.read, ProgressEvery: d.Limits.ProgressEvery, Blocked: func() wait.Feed {
			// The run is not over: the answer's headers go now (callstream.go).
			sendHeadersEarly(c.Req)
			return wr.subscribe()
		}}
		if tok := progressToken(c.Req); tok != nil {
			opts.Progress = func(elapsed time.Duration, shell t3rpc.ThreadShell) {
				_ = c.Req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: tok,
					Progress:      elapsed.Seconds(),
					Total:         timeout.Seconds(),
					Message:       fmt.Sprintf("thread %s is %s after %s", f.Shell.ID, shell.Status, elapsed.Round(time.Second)),
				})
			}
		}
		wctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		began := time.Now()
		r, err := wait.Wait(wctx, m.Watcher(), target, opts)
		if err != nil {
			if cause := context.Cause(ctx); errors.Is(cause, ErrShuttingDown) {
				return Result{}, fmt.Errorf("%s: thread %q: %w", tool, f.Shell.ID, ErrShuttingDown)
			}
			if ctx.Err() != nil {
				// The client gave up (cancelled, closed its stream or its
				// session): nobody reads a result, and the slot is free now.
				return Result{}, fmt.Errorf("%s: the wait on thread %q was abandoned by the client: %w", tool, f.Shell.ID, context.Cause(ctx))
			}
			return Result{}, fmt.Errorf("%s: waiting on thread %q ended: %w", tool, f.Shell.ID, err)
		}
		over := time.Now()
		d.observeWoken(r.WokenBy, over.Sub(began))
		expectRow(m, f.Shell.ID, r)
		// Render with a context of its own: a timeout must still report state.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), d.Limits.CallTimeout)
		defer rcancel()
		st, err := wr.state(rctx, d, f, r)
		if err != nil {
			return Result{}, err
		}
		out := mcptools.WaitOutput{Reason: mcptools.WaitReason(r.Reason), State: st}
		setRun(&out, r)
		res := Result{Structured: &out, Text: reasonText(r) + ": " + stateText(st)}
		d.observeWait(WaitAnswered, time.Since(over))
		// Marks the result in a runtime trace (T3CODE_MCP_TRACE) with its thread, so a trace
		// joins each wake with the harness's own timestamps; a no-op when no trace runs.
		trace.Log(ctx, "t3_wait", f.Shell.ID)
		return res, nil
	}
}

// WaitStage names a stage of a t3_wait result, after its wait was over
// (Deps.OnWaitResult; the t3code_mcp_wait_result_seconds histogram's label).
type WaitStage string

const (
	// WaitFeed is waiting for the thread's subscription (threadfeed) to show
	// what the row showed when the wait ended; observed for the results
	// rendered from it.
	WaitFeed WaitStage = "feed"
	// WaitRead is the result's read of the thread from T3, when neither the
	// wait's own read nor a subscription could answer.
	WaitRead WaitStage = "read"
	// WaitRender is rendering the thread's state from what was read.
	WaitRender WaitStage = "render"
	// WaitAnswered is the whole result: from the moment the waiter saw its
	// run settle (or ask, or time out) to the result handed to the MCP SDK.
	WaitAnswered WaitStage = "answered"
)

func (d *Deps) observeWait(stage WaitStage, dur time.Duration) {
	if d.OnWaitResult != nil {
		d.OnWaitResult(stage, dur)
	}
}

// expectRow tells the machine what a wait woken by its thread's own subscription saw (the row
// T3 shows for it may still be on its way to the watcher), so that the next lookup of the
// thread — t3_answer on the question just returned, t3_interrupt, a steer — waits for the
// watcher's row to show it too (fleet.Machine.ExpectRow) instead of acting on the older row.
func expectRow(m *fleet.Machine, threadID string, r wait.Result) {
	if r.WokenBy != wait.ByFeed || r.RunID == "" {
		return
	}
	run := r.RunID
	if r.Reason == wait.Question {
		req := r.RequestID
		m.ExpectRow(threadID, func(row *t3rpc.ThreadShell) bool {
			p, asks := threadstate.PendingRequest(row)
			return asks && p.ID == req || rowShowsOver(row, run)
		})
		return
	}
	m.ExpectRow(threadID, func(row *t3rpc.ThreadShell) bool { return rowShowsOver(row, run) })
}

// rowShowsOver reports whether the row knows run and shows it over. Not "the row's active run
// is not run": a row from before the run started (the shell stream behind, the run's start not
// seen yet) says that too, and a lookup took it as caught up — a continuation's approval then
// described the thread as it was before the run.
func rowShowsOver(row *t3rpc.ThreadShell, run string) bool {
	_, v := threadstate.Judge(row, run)
	return v == threadstate.RunSettled || v == threadstate.RunSettledUnreadable
}

// observeWoken notes which stream woke a wait that blocked for dur (none for
// a timeout or an archived or idle thread).
func (d *Deps) observeWoken(by wait.WokenBy, dur time.Duration) {
	if by != "" && d.OnWaitWoken != nil {
		d.OnWaitWoken(string(by), dur)
	}
}

// setRun names the run a wait ended on and its own status in T3 (a run
// cancelled through an approval's cancel has reason interrupted and
// run_status cancelled).
func setRun(out *mcptools.WaitOutput, r wait.Result) {
	if r.RunID != "" {
		out.RunID.SetTo(r.RunID)
	}
	if r.RunStatus != "" {
		out.RunStatus.SetTo(r.RunStatus)
	}
}

// reasonText is the reason, with the run's own status when it says more
// ("interrupted (run cancelled)").
func reasonText(r wait.Result) string {
	if r.RunStatus != "" && r.RunStatus != string(r.Reason) {
		return fmt.Sprintf("%s (run %s)", r.Reason, r.RunStatus)
	}
	return string(r.Reason)
}

func progressToken(req *mcp.CallToolRequest) any {
	if req == nil || req.Params == nil || req.Session == nil {
		return nil
	}
	return req.Params.GetProgressToken()
}

// beginWait checks a wait's timeout, takes a wait slot for the call's session
// and ties the wait to its client: a cancelled call, a dropped connection (the
// SDK cancels ctx) or an ended session (EndSession) cancel the returned ctx.
// Call end when the wait is over.
func (d *Deps) beginWait(ctx context.Context, c *Call, in mcptools.WaitInput) (_ context.Context, timeout time.Duration, end func(), _ error) {
	timeout = d.Limits.DefaultWait
	if s, ok := in.Timeout.Get(); ok {
		timeout = time.Duration(s) * time.Second
	}
	if timeout <= 0 || timeout > d.Limits.MaxWait {
		return nil, 0, nil, fmt.Errorf("%s: timeout must be between 1 and %d seconds", mcptools.ToolWait, int(d.Limits.MaxWait/time.Second))
	}
	session := ""
	if c.Req != nil && c.Req.Session != nil {
		session = c.Req.Session.ID()
	}
	release, err := d.waits.acquire(session, d.Limits)
	if err != nil {
		return nil, 0, nil, err
	}
	ctx, cancelWait := context.WithCancelCause(ctx)
	untrack := d.waits.track(session, cancelWait)
	return ctx, timeout, func() {
		untrack()
		cancelWait(nil)
		release()
	}, nil
}

// waitTarget is what t3_wait waits for on a found thread — the run
// t3_dispatch saw T3 make, else the message it sent (the run is then found
// with one read) — and how it reads the thread: bounded, decoding only the
// runs the result shows and the ones the wait looks for (t3.Keep).
func waitTarget(f fleet.Found, answered map[string]bool) (wait.Target, *waitRead) {
	target := wait.Target{ThreadID: f.Shell.ID, Answered: answered}
	if f.IsTracked {
		target.RunID = f.Tracked.LastRunID
		if target.RunID == "" {
			target.MessageID = f.Tracked.LastMessageID
		}
	}
	keep := t3.Keep{Runs: 3} // the runs a wait result shows; the newest is the row's latest run
	if target.RunID != "" {
		keep.RunIDs = []string{target.RunID}
	}
	if target.MessageID != "" {
		keep.MessageIDs = []string{target.MessageID}
	}
	return target, &waitRead{m: f.Machine, id: f.Shell.ID, keep: keep, runCount: -1}
}

// waitRead is a wait's read of its thread; runCount is the thread's number
// of runs as of the last read (-1 before one), for the result's run_count.
// feed, once the wait blocked, keeps the thread current from its own T3
// subscription (shared with other waits on it), so that the result needs no
// read (state).
type waitRead struct {
	m        *fleet.Machine
	id       string
	keep     t3.Keep
	runCount int

	mu      sync.Mutex // subscribe runs on the wait's goroutine, close on the handler's
	feed    *threadfeed.Feed
	release func()
	closed  bool
}

// subscribe takes the thread's feed (wait.Options.Blocked), which then wakes
// the wait too; none when the fleet's cap is reached: the row alone wakes the
// wait and the result reads.
func (w *waitRead) subscribe() wait.Feed {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed && w.feed == nil {
		if f, release, ok := w.m.Feed(w.id); ok {
			w.feed, w.release = f, release
		}
	}
	if w.feed == nil {
		return nil // not a typed nil in the interface
	}
	return w.feed
}

// close gives the feed back (the last wait on a thread closes its
// subscription); the wait is over or abandoned.
func (w *waitRead) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed = true
	if w.release != nil {
		w.release()
		w.release = nil
	}
}

func (w *waitRead) currentFeed() *threadfeed.Feed {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.feed
}

// feedHeadStart is how long a result waits for the thread's subscription to
// show what the row showed when the wait ended before it also starts the
// read. Both come over the machine's one socket and T3 sends the run's own
// events with (mostly just before) the row that says it settled, so the
// subscription is there within a frame; one further behind (a busy machine:
// its next chunk waits for the Ack of the one before) still races the read,
// and whichever answers first is the result.
const feedHeadStart = 50 * time.Millisecond

// projection is what the wait's result r is rendered from: the wait's own
// read when it made one; else its feed, once the feed shows the settle
// (caughtUp); else one bounded read, started after feedHeadStart while the
// feed may still answer first (at most one read either way). runCount is the
// thread's number of runs (-1: count the projection's).
func (w *waitRead) projection(ctx context.Context, d *Deps, f fleet.Found, shell t3rpc.ThreadShell, r wait.Result) (p *t3api.ThreadProjection, runCount int, err error) {
	if r.Projection != nil {
		return r.Projection, w.runCount, nil
	}
	start := time.Now()
	feed, ready := w.currentFeed(), caughtUp(r)
	if feed == nil || ready == nil {
		return w.readNow(ctx, d, f, shell, start)
	}
	// A wait woken by the feed (most of them) finds the settle there now: its
	// result is taken on this goroutine, with no goroutine, timer or hand-off
	// on the way to the answer (a hand-off is a wait for a core under load).
	if st, ok := feed.Ready(ready); ok {
		d.observeWait(WaitFeed, time.Since(start))
		return st.Projection, st.Runs, nil
	}
	// The feed is awaited until it answers or the read does; the read starts
	// feedHeadStart after the settle unless the feed answered by then, and is
	// cancelled when the feed answers first.
	actx, cancelAwait := context.WithCancel(ctx)
	defer cancelAwait()
	feeds := make(chan threadfeed.State, 1)
	go func() {
		st, ok := feed.Await(actx, ready)
		if !ok {
			st = threadfeed.State{}
		}
		feeds <- st
	}()
	headStart := time.NewTimer(feedHeadStart)
	defer headStart.Stop()
	select {
	case st := <-feeds:
		if st.Projection != nil {
			d.observeWait(WaitFeed, time.Since(start))
			return st.Projection, st.Runs, nil
		}
		return w.readNow(ctx, d, f, shell, start) // the feed failed (or ctx ended)
	case <-headStart.C:
	}
	type read struct {
		p   *t3api.ThreadProjection
		n   int
		err error
	}
	rctx, cancelRead := context.WithCancel(ctx)
	reads := make(chan read, 1)
	go func() {
		p, n, err := d.readState(rctx, f, shell, 3)
		reads <- read{p, n, err}
	}()
	select {
	case st := <-feeds:
		if st.Projection != nil {
			cancelRead()
			<-reads
			d.observeWait(WaitFeed, time.Since(start))
			return st.Projection, st.Runs, nil
		}
		rd := <-reads // the feed failed: the read is the answer
		cancelRead()
		if rd.err == nil {
			d.observeWait(WaitRead, time.Since(start))
		}
		return rd.p, rd.n, rd.err
	case rd := <-reads:
		cancelRead()
		if rd.err == nil {
			cancelAwait()
			<-feeds
			d.observeWait(WaitRead, time.Since(start))
			return rd.p, rd.n, nil
		}
		// The read failed: the feed may still answer.
		if st := <-feeds; st.Projection != nil {
			d.observeWait(WaitFeed, time.Since(start))
			return st.Projection, st.Runs, nil
		}
		return nil, -1, rd.err
	}
}

// readNow is the result's one bounded read, timed from start.
func (w *waitRead) readNow(ctx context.Context, d *Deps, f fleet.Found, shell t3rpc.ThreadShell, start time.Time) (*t3api.ThreadProjection, int, error) {
	p, n, err := d.readState(ctx, f, shell, 3)
	if err == nil {
		d.observeWait(WaitRead, time.Since(start))
	}
	return p, n, err
}

// caughtUp says when a feed's projection shows what the row showed when the
// wait ended: the run in the status it settled in, the pending request with
// its question's row. nil for the reasons the result reads for (idle,
// archived: the row said something the run's record may not).
func caughtUp(r wait.Result) func(*t3api.ThreadProjection) bool {
	switch r.Reason {
	case wait.Completed, wait.Interrupted, wait.Failed:
		return func(p *t3api.ThreadProjection) bool {
			for i := range p.Runs {
				if run := &p.Runs[i]; run.ID == r.RunID {
					if r.RunStatus != "" {
						return run.Status == r.RunStatus
					}
					o, ok := threadstate.Settled(run.Status)
					return ok && o == r.Reason
				}
			}
			return false
		}
	case wait.Question:
		return func(p *t3api.ThreadProjection) bool {
			req := slices.ContainsFunc(p.RuntimeRequests, func(q t3api.RuntimeRequest) bool { return q.ID == r.RequestID })
			row := slices.ContainsFunc(p.TurnItems, func(it t3api.TurnItem) bool { return it.RequestId.Or("") == r.RequestID })
			return req && row
		}
	case wait.Timeout:
		return func(*t3api.ThreadProjection) bool { return true }
	}
	return nil
}

func (w *waitRead) read(ctx context.Context) (*t3api.ThreadProjection, error) {
	rec, err := w.m.RecentKeep(ctx, w.id, w.keep)
	if err == nil {
		w.runCount = rec.RunCount
	}
	return rec.Projection, err
}

// state renders the wait's result r from its projection (the wait's own
// read, the thread's feed, or the result's one bounded read: projection).
func (w *waitRead) state(ctx context.Context, d *Deps, f fleet.Found, r wait.Result) (mcptools.ThreadState, error) {
	shell := r.Shell
	if shell.ID == "" {
		shell = f.Shell
	}
	p, runCount, err := w.projection(ctx, d, f, shell, r)
	if err != nil {
		return mcptools.ThreadState{}, err
	}
	start := time.Now()
	st, err := d.state(ctx, f, shell, 3, p)
	if err == nil && runCount >= 0 {
		st.RunCount.SetTo(runCount) // the thread's runs, not only those decoded
	}
	d.observeWait(WaitRender, time.Since(start))
	return st, err
}

// waitCounter bounds concurrent waits overall and per MCP session, and ends
// a session's waits when the session ends (EndSession).
type waitCounter struct {
	mu        sync.Mutex
	total     int
	bySession map[string]int
	// cancels holds each running wait's cancel, by session.
	cancels map[string]map[*context.CancelCauseFunc]struct{}
}

// errSessionEnded is the cause of a wait ended because its MCP session ended.
var errSessionEnded = errors.New("the MCP session ended")

// track registers a running wait's cancel under its session until the
// returned func is called.
func (w *waitCounter) track(session string, cancel context.CancelCauseFunc) func() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cancels == nil {
		w.cancels = map[string]map[*context.CancelCauseFunc]struct{}{}
	}
	if w.cancels[session] == nil {
		w.cancels[session] = map[*context.CancelCauseFunc]struct{}{}
	}
	key := &cancel
	w.cancels[session][key] = struct{}{}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.cancels[session], key)
		if len(w.cancels[session]) == 0 {
			delete(w.cancels, session)
		}
	}
}

// EndSession ends every wait of an MCP session at once (its client closed
// it): the SDK closes a session only after its calls return, so without this
// a closing client's waits would hold their slots until their own timeouts.
func (d *Deps) EndSession(session string) {
	d.waits.mu.Lock()
	var cancels []context.CancelCauseFunc
	for key := range d.waits.cancels[session] {
		cancels = append(cancels, *key)
	}
	d.waits.mu.Unlock()
	for _, cancel := range cancels {
		cancel(errSessionEnded)
	}
}

func (w *waitCounter) acquire(session string, l Limits) (func(), error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.bySession == nil {
		w.bySession = map[string]int{}
	}
	if w.total >= l.MaxWaits {
		return nil, fmt.Errorf("t3_wait: %d waits are already running on this connector (T3CODE_MCP_MAX_WAITS); retry later or use t3_thread", w.total)
	}
	if w.bySession[session] >= l.MaxWaitsPerSession {
		return nil, fmt.Errorf("t3_wait: this session already has %d waits running (T3CODE_MCP_MAX_WAITS_PER_SESSION); end one first or use t3_thread", w.bySession[session])
	}
	w.total++
	w.bySession[session]++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.total--
		if w.bySession[session]--; w.bySession[session] <= 0 {
			delete(w.bySession, session)
		}
	}, nil
}

// Active reports the number of running waits.
func (d *Deps) ActiveWaits() int {
	d.waits.mu.Lock()
	defer d.waits.mu.Unlock()
	return d.waits.total
}
