package threadfeed

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

// This file: what t3_thread reads of a lingering feed (Pool.Linger), and the
// bound on what a feed holds.

// AwaitCurrent is the feed's projection once the feed can answer for the
// thread: its stream runs, T3 has sent its snapshot or replay (live), and it
// has applied the thread's events up to sequence atLeast (the sequence of the
// shell row the caller renders with, watch.ThreadAt) — a feed that is behind
// the row it is shown with, or whose stream ended, is never served. It waits
// while the feed has no snapshot yet for up to first, and while it is behind
// atLeast for up to behind (T3 sends a thread's events on its stream about
// when it sends the row; a stream that stays behind does not hold the caller
// long). ok is false when the feed fails, ctx ends or the time is up.
func (f *Feed) AwaitCurrent(ctx context.Context, atLeast int64, first, behind time.Duration) (State, bool) {
	start := time.Now()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		f.mu.Lock()
		if f.err != nil {
			f.mu.Unlock()
			return State{}, false
		}
		if f.live && f.p != nil && f.cursor >= atLeast {
			st := f.stateLocked()
			f.mu.Unlock()
			return st, true
		}
		limit := first
		if f.p != nil {
			limit = behind
		}
		changed := f.changed
		f.mu.Unlock()
		left := limit - time.Since(start)
		if left <= 0 {
			return State{}, false
		}
		if timer == nil {
			timer = time.NewTimer(left)
		} else {
			timer.Reset(left)
		}
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
			return State{}, false
		}
	}
}

// seed starts a feed from a read of the thread instead of a snapshot: its
// stream then asks for the events after the read (run). The projection is
// shared with the reader, who goes on using it: the feed copies it before
// it changes it (ownLocked).
func (f *Feed) seed(st State) {
	f.p, f.shared, f.runs, f.cursor = st.Projection, true, st.Runs, st.Cursor
	for _, r := range f.p.Runs {
		f.newestOrdinal = max(f.newestOrdinal, r.Ordinal)
	}
}

// advance takes a newer read of the thread in (Pool.Linger's seed for a feed
// already open): a read whose sequence is past the feed's cursor replaces
// the projection, as a snapshot on the stream would, and the stream's
// events up to it are then skipped as a replay's overlap. So a feed left
// behind the rows (after a reconnect, the watcher's new shell snapshot gives
// every row its sequence) catches up with the call that read.
func (f *Feed) advance(st State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil || st.Cursor <= f.cursor {
		return
	}
	live := f.live
	f.seed(st)
	f.live = live
	f.broadcastLocked()
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
	if f.p == nil || len(f.p.Runs) <= compactAt {
		return
	}
	f.ownLocked()
	p := f.p
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
