package threadfeed

import (
	"cmp"
	"slices"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

// This file: what t3_thread reads of a lingering feed (Pool.Linger), and the
// bound on what a feed holds.

// Current is the feed's projection now, when the feed can answer for the
// thread: its stream runs, its snapshot is in, and it has applied the
// thread's events up to sequence atLeast (the sequence of the shell row the
// caller renders with, watch.ThreadAt): a feed that is behind the row it is
// shown with, or whose stream ended (a dropped socket), is never served. It
// does not wait.
func (f *Feed) Current(atLeast int64) (State, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil || f.p == nil || f.cursor < atLeast {
		return State{}, false
	}
	return State{Projection: copyProjection(f.p), Runs: f.runs, Cursor: f.cursor}, true
}

// compactAt is how many runs a feed holds before it drops the older ones:
// a feed that lingers on a busy thread otherwise grows with every run.
const compactAt = 2 * keepRuns

// compactLocked drops what the newest keepRuns runs do not need once the
// feed holds compactAt runs, as the snapshot's trim (t3.Keep) leaves it
// out: the older runs, and the messages, checkpoints and timeline rows of no
// kept run; the runtime requests that are neither pending nor named by a
// kept row. So a feed holds at most compactAt runs and their records, however
// long it lives. The thread's run count (runs) stays.
func (f *Feed) compactLocked() {
	p := f.p
	if p == nil || len(p.Runs) <= compactAt {
		return
	}
	slices.SortStableFunc(p.Runs, func(a, b t3api.Run) int { return cmp.Compare(a.Ordinal, b.Ordinal) })
	p.Runs = slices.Delete(p.Runs, 0, len(p.Runs)-keepRuns)
	runs := make(map[string]bool, keepRuns)
	msgs, checkpoints := map[string]bool{}, map[string]bool{}
	for i := range p.Runs {
		r := &p.Runs[i]
		runs[r.ID] = true
		if id, ok := r.UserMessageId.Get(); ok {
			msgs[id] = true
		}
		if id, ok := r.CheckpointId.Get(); ok {
			checkpoints[id] = true
		}
	}
	p.Messages = slices.DeleteFunc(p.Messages, func(m t3api.Message) bool {
		return !runs[m.RunId.Or("")] && !msgs[m.ID]
	})
	p.Checkpoints = slices.DeleteFunc(p.Checkpoints, func(c t3api.Checkpoint) bool {
		return !runs[c.RunId.Or("")] && !checkpoints[c.ID]
	})
	reqs := map[string]bool{}
	for i := range p.TurnItems {
		if it := &p.TurnItems[i]; runs[it.RunId.Or("")] {
			if id, ok := it.RequestId.Get(); ok {
				reqs[id] = true
			}
		}
	}
	p.RuntimeRequests = slices.DeleteFunc(p.RuntimeRequests, func(r t3api.RuntimeRequest) bool {
		if r.Status == "pending" {
			reqs[r.ID] = true
			return false
		}
		return !reqs[r.ID]
	})
	p.TurnItems = slices.DeleteFunc(p.TurnItems, func(it t3api.TurnItem) bool {
		return !runs[it.RunId.Or("")] && !reqs[it.RequestId.Or("")]
	})
}
