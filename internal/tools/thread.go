package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
	"github.com/t3code-mcp/t3code-mcp/internal/wait"
)

// state renders a found thread's current state from its projection and its
// (fresher) shell row. p is a projection already read for this call (nil:
// one bounded read now that decodes only the runs shown, t3.Keep).
func (d *Deps) state(ctx context.Context, f fleet.Found, shell t3rpc.ThreadShell, turns int, p *t3api.ThreadProjection) (mcptools.ThreadState, error) {
	meta := threadview.Meta{
		Machine: f.Machine.Name,
		Project: mcptools.ProjectRef{ID: f.Project.ID, Title: f.Project.Title},
		Status:  shell.Status,
	}
	answered := d.answered.snapshot()
	if pr, ok := threadstate.PendingRequest(&shell); ok && !answered[pr.ID] {
		meta.PendingRequestID, meta.PendingKind = pr.ID, pr.Kind
	}
	if turns <= 0 {
		turns = 3 // Render's default
	}
	runCount := -1
	if p == nil {
		keep := t3.Keep{Runs: turns}
		if meta.PendingRequestID != "" {
			keep.RequestIDs = []string{meta.PendingRequestID}
		}
		rec, err := f.Machine.RecentKeep(ctx, shell.ID, keep)
		if err != nil {
			return mcptools.ThreadState{}, fmt.Errorf("reading thread %q on machine %q: %w", shell.ID, f.Machine.Name, err)
		}
		p, runCount = rec.Projection, rec.RunCount
	}
	st := threadview.New(p).Render(meta, turns, threadview.DefaultLimits)
	if runCount >= 0 {
		st.RunCount.SetTo(runCount) // the thread's runs, not only those decoded
	}
	if st.Title == "" {
		st.Title = shell.Title
	}
	if v, ok := shell.Branch.Get(); ok && v != "" {
		st.Branch.SetTo(v)
	}
	if v, ok := shell.WorktreePath.Get(); ok && v != "" {
		st.Worktree.SetTo(v)
	}
	return st, nil
}

func stateText(st mcptools.ThreadState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "thread %s on %s (%s): %s", st.ThreadID, st.Machine, st.Project.Title, st.Status)
	if lr, ok := st.LatestRun.Get(); ok && lr.Error.Set {
		fmt.Fprintf(&b, "\nerror: %s", lr.Error.Value)
	}
	if br, ok := st.Branch.Get(); ok {
		fmt.Fprintf(&b, "\nbranch %s", br)
		if wt, ok := st.Worktree.Get(); ok {
			fmt.Fprintf(&b, " in worktree %s", wt)
		}
	}
	if n := len(st.Runs); n > 0 {
		if r := st.Runs[n-1].Reply.Or(""); r != "" {
			fmt.Fprintf(&b, "\nreply: %s", threadview.Cut(r, 500))
		}
	}
	if df, ok := st.Diff.Get(); ok {
		if u, ok := df.Unavailable.Get(); ok {
			fmt.Fprintf(&b, "\nno diff of run %s: %s", df.RunID, u)
		} else {
			fmt.Fprintf(&b, "\ndiff of run %s (%d files, %d bytes):\n%s", df.RunID, len(df.Files), df.TotalBytes, df.Diff)
		}
	}
	if q, ok := st.PendingQuestion.Get(); ok {
		switch {
		case !q.Answerable.Or(true):
			fmt.Fprintf(&b, "\nrequest %s can no longer be answered (%s): stop the run with t3_interrupt or dispatch again", q.RequestID, q.NotAnswerableReason.Or("not_resumable"))
			for _, qq := range q.Questions {
				fmt.Fprintf(&b, "\n- %s", qq.Text)
			}
		case q.Kind == mcptools.QuestionKindApproval:
			fmt.Fprintf(&b, "\nwaiting for a decision (t3_answer with decision %s, request %s):", strings.Join(threadview.ApprovalDecisions, " | "), q.RequestID)
			for _, qq := range q.Questions {
				fmt.Fprintf(&b, "\n- %s", qq.Text)
			}
		default:
			fmt.Fprintf(&b, "\nwaiting for an answer (t3_answer, request %s):", q.RequestID)
			for _, qq := range q.Questions {
				fmt.Fprintf(&b, "\n- %s: %s [%s]", qq.ID, qq.Text, strings.Join(qq.Options, " | "))
			}
		}
	}
	return b.String()
}

func threadTool(d *Deps) Handler {
	return func(ctx context.Context, c *Call) (Result, error) {
		var in mcptools.ThreadInput
		if err := decodeArgs(mcptools.ToolThread, c.Args, &in); err != nil {
			return Result{}, err
		}
		if in.RunID.Set && !in.Diff.Or(false) {
			return Result{}, fmt.Errorf("%s: run_id picks the run whose diff to show; pass diff: true with it, or leave run_id out", mcptools.ToolThread)
		}
		f, err := d.Fleet.Thread(in.ThreadID)
		if err != nil {
			return Result{}, err
		}
		var p *t3api.ThreadProjection // read once for the state and the diff
		if in.Diff.Or(false) {
			rec, err := f.Machine.Recent(ctx, f.Shell.ID)
			if err != nil {
				return Result{}, fmt.Errorf("reading thread %q on machine %q: %w", f.Shell.ID, f.Machine.Name, err)
			}
			p = rec.Projection
		}
		st, err := d.state(ctx, f, f.Shell, in.Turns.Or(3), p)
		if err != nil {
			return Result{}, err
		}
		if p != nil {
			diff, err := d.runDiff(ctx, f, p, in.RunID.Or(""))
			if err != nil {
				return Result{}, err
			}
			st.Diff.SetTo(diff)
		}
		return Result{Structured: &st, Text: stateText(st)}, nil
	}
}

func waitTool(d *Deps) Handler {
	return func(ctx context.Context, c *Call) (Result, error) {
		const tool = mcptools.ToolWait
		var in mcptools.WaitInput
		if err := decodeArgs(tool, c.Args, &in); err != nil {
			return Result{}, err
		}
		if len(in.ThreadIds) > 0 || !in.ThreadID.Set {
			return d.waitAny(ctx, c, in) // waitany.go
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
		ctx, timeout, end, err := d.beginWait(ctx, c, in)
		if err != nil {
			return Result{}, err
		}
		defer end()

		target, wr := waitTarget(f, d.answered.snapshot())
		m := f.Machine
		opts := wait.Options{Read: wr.read, ProgressEvery: d.Limits.ProgressEvery}
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
		// Render with a context of its own: a timeout must still report state.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), d.Limits.CallTimeout)
		defer rcancel()
		shell := r.Shell
		if shell.ID == "" {
			shell = f.Shell
		}
		st, err := wr.state(rctx, d, f, shell, r.Projection)
		if err != nil {
			return Result{}, err
		}
		out := mcptools.WaitOutput{Reason: mcptools.WaitReason(r.Reason), State: st}
		setRun(&out, r)
		return Result{Structured: &out, Text: reasonText(r) + ": " + stateText(st)}, nil
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
type waitRead struct {
	m        *fleet.Machine
	id       string
	keep     t3.Keep
	runCount int
}

func (w *waitRead) read(ctx context.Context) (*t3api.ThreadProjection, error) {
	rec, err := w.m.RecentKeep(ctx, w.id, w.keep)
	if err == nil {
		w.runCount = rec.RunCount
	}
	return rec.Projection, err
}

// state renders the wait's result; p is the wait's last read (nil: none).
func (w *waitRead) state(ctx context.Context, d *Deps, f fleet.Found, shell t3rpc.ThreadShell, p *t3api.ThreadProjection) (mcptools.ThreadState, error) {
	st, err := d.state(ctx, f, shell, 3, p)
	if err == nil && p != nil && w.runCount >= 0 {
		st.RunCount.SetTo(w.runCount) // the thread's runs, not only those decoded
	}
	return st, err
}
