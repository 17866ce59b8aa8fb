package tools

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/threadfeed"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// readState is state's one bounded read of the thread, decoding only what it
// shows (t3.Keep): the turns shown and the row's pending request (one this
// connector answered is not shown). It returns the thread's run count too.
func (d *Deps) readState(ctx context.Context, f fleet.Found, shell t3rpc.ThreadShell, turns int) (*t3api.ThreadProjection, int, error) {
	rec, err := d.readRecent(ctx, f, shell, turns)
	return rec.Projection, rec.RunCount, err
}

// readRecent is readState's read, as the client returns it.
func (d *Deps) readRecent(ctx context.Context, f fleet.Found, shell t3rpc.ThreadShell, turns int) (t3.Recent, error) {
	keep := t3.Keep{Runs: turns}
	if pr, ok := threadstate.PendingRequest(&shell); ok && !d.answered.snapshot()[pr.ID] {
		keep.RequestIDs = []string{pr.ID}
	}
	rec, err := f.Machine.RecentKeep(ctx, shell.ID, keep)
	if err != nil {
		return t3.Recent{}, fmt.Errorf("reading thread %q on machine %q: %w", shell.ID, f.Machine.Name, err)
	}
	return rec, nil
}

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
		var err error
		if p, runCount, err = d.readState(ctx, f, shell, turns); err != nil {
			return mcptools.ThreadState{}, err
		}
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

// ThreadSource says where a t3_thread result came from (Deps.OnThreadResult;
// the t3code_mcp_thread_results_total counter's label).
type ThreadSource string

const (
	// ThreadFromFeed: rendered from the thread's lingering subscription
	// (threadfeed), without reading the thread.
	ThreadFromFeed ThreadSource = "feed"
	// ThreadFromRead: rendered from a read of the thread (the first call on
	// it, a feed not live or behind the row, more turns than a feed holds,
	// a diff).
	ThreadFromRead ThreadSource = "read"
)

// feedTurns is how many runs a thread feed holds from its snapshot
// (threadfeed keeps the newest three): a t3_thread showing more reads.
const feedTurns = 3

// How long t3_thread waits for the thread's feed before it reads: for its
// snapshot (a feed started with a snapshot, after it failed say: T3 sends it
// about as fast as it answers a read), and for a feed behind the row to
// apply the events the row already shows.
const (
	feedSnapshotWait = 250 * time.Millisecond
	feedCatchUpWait  = 20 * time.Millisecond
)

// viaFeed is t3_thread's projection of its default view (turns ≤
// feedTurns) and the thread's run count: from the thread's lingering feed
// (fleet.Machine.ThreadFeed) when it answers, else from one bounded read
// (of feedTurns runs, so that it can seed the feed: the feed holds that many)
// that starts the feed from it when none is open. A feed answers when it is
// live and has reached the row the state is rendered with (f.Seq), within
// feedCatchUpWait. Either way the thread's feed is kept for the next call.
func (d *Deps) viaFeed(ctx context.Context, f fleet.Found, turns int) (*t3api.ThreadProjection, int, error) {
	if feed, ok := f.Machine.ThreadFeed(f.Shell.ID, nil); ok {
		if st, ok := feed.AwaitCurrent(ctx, f.Seq, feedSnapshotWait, feedCatchUpWait); ok {
			d.observeThread(ThreadFromFeed)
			return st.Projection, st.Runs, nil
		}
	}
	d.observeThread(ThreadFromRead)
	rec, err := d.readRecent(ctx, f, f.Shell, max(turns, feedTurns))
	if err != nil {
		return nil, -1, err
	}
	if rec.Bounded { // a whole-thread read (an older T3) is no feed's window
		f.Machine.ThreadFeed(f.Shell.ID, &threadfeed.State{Projection: rec.Projection, Runs: rec.RunCount, Cursor: rec.Sequence})
	}
	return rec.Projection, rec.RunCount, nil
}

func (d *Deps) observeThread(src ThreadSource) {
	if d.OnThreadResult != nil {
		d.OnThreadResult(src)
	}
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

func threadTool(d *Deps) func(context.Context, *Call, *mcptools.ThreadInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.ThreadInput) (Result, error) {
		if in.RunID.Set && !in.Diff.Or(false) {
			return Result{}, fmt.Errorf("%s: run_id picks the run whose diff to show; pass diff: true with it, or leave run_id out", mcptools.ToolThread)
		}
		f, err := d.Fleet.Thread(in.ThreadID)
		if err != nil {
			return Result{}, err
		}
		var p *t3api.ThreadProjection // read once for the state and the diff
		turns, runCount := in.Turns.Or(3), -1
		if in.Diff.Or(false) {
			rec, err := f.Machine.Recent(ctx, f.Shell.ID)
			if err != nil {
				return Result{}, fmt.Errorf("reading thread %q on machine %q: %w", f.Shell.ID, f.Machine.Name, err)
			}
			p = rec.Projection
			d.observeThread(ThreadFromRead)
		} else if turns <= feedTurns {
			var err error
			if p, runCount, err = d.viaFeed(ctx, f, turns); err != nil {
				return Result{}, err
			}
		} else {
			d.observeThread(ThreadFromRead) // more turns than a feed holds: state reads
		}
		st, err := d.state(ctx, f, f.Shell, turns, p)
		if err != nil {
			return Result{}, err
		}
		if runCount >= 0 {
			st.RunCount.SetTo(runCount) // the thread's runs, not only those the feed holds
		}
		if in.Diff.Or(false) {
			diff, err := d.runDiff(ctx, f, p, in.RunID.Or(""))
			if err != nil {
				return Result{}, err
			}
			st.Diff.SetTo(diff)
		}
		return Result{Structured: &st, Text: stateText(st)}, nil
	}
}
