package tools

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/wait"
)

// maxWaitThreads bounds t3_wait's thread_ids.
const maxWaitThreads = 100

// waitAny is t3_wait with thread_ids: one wait per thread (each woken by its
// machine's watcher), the first that settles or asks ends them all; the
// result has the one-thread shape, its state naming the thread. It takes one
// wait slot, not one per thread.
func (d *Deps) waitAny(ctx context.Context, c *Call, in mcptools.WaitInput) (Result, error) {
	const tool = mcptools.ToolWait
	ids, found, err := d.waitThreads(tool, in)
	if err != nil {
		return Result{}, err
	}
	ctx, timeout, end, err := d.beginWait(ctx, c, in)
	if err != nil {
		return Result{}, err
	}
	defer end()

	reads := make([]*waitRead, len(found))
	defer func() {
		for _, wr := range reads {
			if wr != nil {
				wr.close()
			}
		}
	}()
	first := d.firstToMove(ctx, c, found, reads, timeout)
	if first.err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, ErrShuttingDown) {
			return Result{}, fmt.Errorf("%s: %w", tool, ErrShuttingDown)
		}
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("%s: the wait on threads %s was abandoned by the client: %w", tool, strings.Join(ids, ", "), context.Cause(ctx))
		}
		return Result{}, fmt.Errorf("%s: waiting on thread %q ended: %w", tool, first.f.Shell.ID, first.err)
	}
	over := time.Now()
	d.observeWoken(first.r.WokenBy, first.blocked)
	expectRow(first.f.Machine, first.f.Shell.ID, first.r)
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), d.Limits.CallTimeout)
	defer rcancel()
	st, err := first.wr.state(rctx, d, first.f, first.r)
	if err != nil {
		return Result{}, err
	}
	out := mcptools.WaitOutput{Reason: mcptools.WaitReason(first.r.Reason), State: st}
	setRun(&out, first.r)
	text := fmt.Sprintf("%s (thread %s, first of %d): %s", first.r.Reason, st.ThreadID, len(found), stateText(st))
	if first.r.Reason == wait.Timeout {
		text = fmt.Sprintf("timeout: none of the %d threads settled or asked; showing %s", len(found), stateText(st))
	}
	d.observeWait(WaitAnswered, time.Since(over))
	return Result{Structured: &out, Text: text}, nil
}

// waitThreads finds the threads a t3_wait with thread_ids waits on, each once,
// on a machine that is ready; ids is what the call named.
func (d *Deps) waitThreads(tool string, in mcptools.WaitInput) (ids []string, found []fleet.Found, err error) {
	ids = append([]string{}, in.ThreadIds...)
	if id, ok := in.ThreadID.Get(); ok {
		ids = append(ids, id)
	}
	switch {
	case len(ids) == 0:
		return nil, nil, fmt.Errorf("%s: pass thread_id, or thread_ids to wait for whichever of several threads moves first", tool)
	case len(ids) > maxWaitThreads:
		return nil, nil, fmt.Errorf("%s: thread_ids has %d threads; at most %d per call", tool, len(ids), maxWaitThreads)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		f, err := d.Fleet.ThreadOrGone(id) // an archived one answers archived at once
		if err != nil {
			return nil, nil, err
		}
		if err := f.Machine.Ready(); err != nil {
			return nil, nil, err
		}
		found = append(found, f)
	}
	return ids, found, nil
}

// waitOutcome is how one of waitAny's waits ended.
type waitOutcome struct {
	f       fleet.Found
	wr      *waitRead
	r       wait.Result
	err     error
	blocked time.Duration // from the wait's start to its end
}

// firstToMove waits on every thread at once, sending progress
// notifications meanwhile when the client asked for them. The first that
// settles or asks wins; a timeout counts only once every wait has timed out
// (they share one deadline), then the first reports. reads[i] is set to the
// i-th thread's read (and feed), for the caller to close.
func (d *Deps) firstToMove(ctx context.Context, c *Call, found []fleet.Found, reads []*waitRead, timeout time.Duration) *waitOutcome {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	results := make(chan waitOutcome, len(found))
	answered := d.answered.snapshot()
	for i, f := range found {
		target, wr := waitTarget(f, answered)
		reads[i] = wr
		go func() {
			began := time.Now()
			r, err := wait.Wait(wctx, f.Machine.Watcher(), target, wait.Options{Read: wr.read, Blocked: func() wait.Feed {
				sendHeadersEarly(c.Req) // a run is not over: the answer's headers go now
				return wr.subscribe()
			}})
			results <- waitOutcome{f, wr, r, err, time.Since(began)}
		}()
	}
	var tick <-chan time.Time
	tok := progressToken(c.Req)
	if tok != nil {
		tk := time.NewTicker(d.Limits.ProgressEvery)
		defer tk.Stop()
		tick = tk.C
	}
	start := time.Now()
	var first *waitOutcome
	for n := 0; n < len(found); {
		var o waitOutcome
		select {
		case o = <-results:
			n++
		case <-tick:
			elapsed := time.Since(start)
			_ = c.Req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: tok, Progress: elapsed.Seconds(), Total: timeout.Seconds(),
				Message: fmt.Sprintf("%d threads still going after %s", len(found)-n, elapsed.Round(time.Second)),
			})
			continue
		}
		if o.err == nil && o.r.Reason != wait.Timeout {
			return &o
		}
		if first == nil || (first.err != nil && o.err == nil) {
			first = &o
		}
	}
	return first
}
