package t3fake

import (
	"slices"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// T3's bounded thread read (GET /threads/{id}/bounded), as its server builds it
// (apps/server/src/orchestration-v2/threadHistoryPaging.ts, buildBoundedThreadProjection; the
// route loads getThreadSnapshotWindow with rowLimit 77 and userTurnLimit 10). It is not the whole
// projection with the timeline cut: the timeline is a recent window, and the parts that point
// into the timeline keep only what the window (or a run still going) needs. Everything else
// (runs, attempts, nodes, runtime requests, checkpoints) stays whole, so the answer still grows
// with the thread's runs.
const (
	// boundedUserTurns: a timeline with turn starts (user_message items) is windowed by turns
	// only: the newest this many user turns, whatever their items or bytes (T3's
	// selectOlderTimelinePage applies no item or byte budget then: "tool activity must not split
	// an ordinary conversation turn") …
	boundedUserTurns = 10
	// … within the hard bounds of the store's window query (THREAD_HISTORY_MAX_WINDOW_ROWS and
	// _BYTES), which only a single oversized turn reaches.
	boundedWindowRows  = 1_500
	boundedWindowBytes = 4 << 20
	// boundedRows: a timeline without turn starts is windowed by items: at most this many …
	boundedRows = 75
	// boundedBudget: … whose bytes fit in the payload budget less the rest of the answer (the
	// control plane's bytes and the control items' kept outside the window, plus 1,024). A
	// projection larger than it is flagged payloadBudgetExceeded.
	boundedBudget = 1 << 20
)

// activeRunStatus are the statuses of a run that is still going (its messages are kept).
var activeRunStatus = map[string]bool{"preparing": true, "starting": true, "running": true, "waiting": true, "queued": true}

// boundedAnswer is what encodeBounded learned that the answer's fields after the projection say.
type boundedAnswer struct {
	windowStart    int   // index in th.items of the window's oldest item (len: no items)
	latestOrdinal  int64 // the newest ordinal of all local items; valid with hasItems
	hasItems       bool
	budgetExceeded bool
}

// boundedWindow is the index of the oldest item of the recent window of items, newest first, as
// T3's selectOlderTimelinePage picks it. With a user_message among the items (a turn start; the
// fake's user messages all start a user's turn), the window is the newest boundedUserTurns turns,
// bounded only by the store window's hard bounds (boundedWindowRows, boundedWindowBytes) and by
// rows when rows > 0. Without one, it is at most rows items (boundedRows when rows <= 0) whose
// sizes (size) add up to at most budget(), asked for only then. The newest item is always in it.
func boundedWindow(items []*t3rpc.TurnItem, rows int, budget func() int, size func(*t3rpc.TurnItem) int) int {
	var limit int
	switch turnMode := slices.ContainsFunc(items, func(it *t3rpc.TurnItem) bool { return it.Type == "user_message" }); {
	case turnMode && rows > 0:
		rows, limit = min(rows, boundedWindowRows), boundedWindowBytes
	case turnMode:
		rows, limit = boundedWindowRows, boundedWindowBytes
	case rows <= 0:
		rows, limit = boundedRows, budget()
	default:
		limit = budget()
	}
	start, turns, used := len(items), 0, 0
	for start > 0 && len(items)-start < rows && turns < boundedUserTurns {
		it := items[start-1]
		used += size(it)
		if used > limit && start < len(items) {
			break
		}
		start--
		if it.Type == "user_message" { // a turn starts at its user message
			turns++
		}
	}
	return start
}

// controlItem reports whether it is kept in turnItems wherever it sits: an interrupt request, or
// the item of a runtime request still pending.
func controlItem(it *t3rpc.TurnItem, pending map[string]bool) bool {
	if it.Type == "run_interrupt_request" {
		return true
	}
	id, ok := it.RequestId.Get()
	return ok && pending[id]
}

// encodeBounded writes th's bounded projection (the "projection" of /bounded) as T3 builds it
// and returns what the fields after it say. rows bounds the window's items. scratch is an
// encoder for measuring items; its content is discarded. The caller holds th.mu.
//
//   - turnItems: the window's items, and the control items (controlItem) outside it, in order;
//   - visibleTurnItems: the window, each item wrapped as T3 wraps it (position from 0, local);
//   - messages: those the kept turnItems name, the user message of the latest run and of every
//     active run, and every message of those runs;
//   - runs, attempts, nodes, runtimeRequests, checkpoints, thread, updatedAt: whole.
//
// The fake has no plans, context handoffs or delegated completions, which T3 also filters.
func encodeBounded(e, scratch *jx.Encoder, th *thread, rows int, controlPlane bool) boundedAnswer {
	var ans boundedAnswer
	var pending map[string]bool
	for i := range th.requests {
		if th.requests[i].Status == "pending" {
			if pending == nil {
				pending = map[string]bool{}
			}
			pending[th.requests[i].ID] = true
		}
	}
	items := th.items
	control := 0
	for _, it := range items {
		if !ans.hasItems || it.Ordinal > ans.latestOrdinal {
			ans.latestOrdinal, ans.hasItems = it.Ordinal, true
		}
		if controlItem(it, pending) {
			control += encodedLen(scratch, it)
		}
	}
	// Without turn starts the window's budget is what the rest of the answer leaves of
	// boundedBudget, each row charged about as T3 charges a local row (its wrapper and its item,
	// which turnItems repeats). Measured only then (boundedWindow asks): the control plane of a
	// long thread is megabytes.
	budget := func() int { return boundedBudget - control - controlPlaneLen(scratch, th, controlPlane) - 1_024 }
	ans.windowStart = boundedWindow(items, rows, budget, func(it *t3rpc.TurnItem) int {
		n := encodedLen(scratch, it)
		return 2*n + len(`{"position":,"visibility":"local","sourceThreadId":"","sourceItemId":"","item":}`) + 6 + len(th.id) + len(it.ID)
	})
	kept := func(i int) bool { return i >= ans.windowStart || controlItem(items[i], pending) }

	// The messages kept: named by a kept item, or of the latest or an active run.
	msgIDs, runIDs := map[string]bool{}, map[string]bool{}
	for i, it := range items {
		if id, ok := it.MessageId.Get(); ok && kept(i) {
			msgIDs[id] = true
		}
	}
	for i, r := range th.runs {
		if i == len(th.runs)-1 || activeRunStatus[r.rec.Status] {
			runIDs[r.rec.ID] = true
			if id, ok := r.rec.UserMessageId.Get(); ok {
				msgIDs[id] = true
			}
		}
	}

	start := len(e.Bytes())
	e.ObjStart()
	encodeProjectionHead(e, th, controlPlane)
	e.FieldStart("messages")
	e.ArrStart()
	for i := range th.messages {
		if m := &th.messages[i]; msgIDs[m.ID] || m.RunId.Set && !m.RunId.Null && runIDs[m.RunId.Value] {
			m.Encode(e)
		}
	}
	e.ArrEnd()
	e.FieldStart("turnItems")
	e.ArrStart()
	for i, it := range items {
		if kept(i) {
			it.Encode(e)
		}
	}
	e.ArrEnd()
	encodeRecords(e, "checkpoints", th.checkpoints)
	e.FieldStart("visibleTurnItems")
	e.ArrStart()
	for i, it := range items[ans.windowStart:] {
		e.ObjStart()
		e.FieldStart("position")
		e.Int(i)
		e.FieldStart("visibility")
		e.Str("local")
		e.FieldStart("sourceThreadId")
		e.Str(th.id)
		e.FieldStart("sourceItemId")
		e.Str(it.ID)
		e.FieldStart("item")
		it.Encode(e)
		e.ObjEnd()
	}
	e.ArrEnd()
	e.FieldStart("updatedAt")
	e.Str(th.updatedAt)
	e.ObjEnd()
	ans.budgetExceeded = len(e.Bytes())-start > boundedBudget
	return ans
}

// controlPlaneLen is the length of th's bounded projection with no messages and no timeline: what
// T3 subtracts from the payload budget before it fits the window (controlBytes).
func controlPlaneLen(scratch *jx.Encoder, th *thread, controlPlane bool) int {
	scratch.Reset()
	scratch.ObjStart()
	encodeProjectionHead(scratch, th, controlPlane)
	for _, f := range []string{"messages", "turnItems"} {
		scratch.FieldStart(f)
		scratch.ArrStart()
		scratch.ArrEnd()
	}
	encodeRecords(scratch, "checkpoints", th.checkpoints)
	scratch.FieldStart("visibleTurnItems")
	scratch.ArrStart()
	scratch.ArrEnd()
	scratch.FieldStart("updatedAt")
	scratch.Str(th.updatedAt)
	scratch.ObjEnd()
	return len(scratch.Bytes())
}

// encodedLen is the length of it's encoding.
func encodedLen(scratch *jx.Encoder, it *t3rpc.TurnItem) int {
	scratch.Reset()
	it.Encode(scratch)
	return len(scratch.Bytes())
}

// encodeBoundedFields writes the fields of T3's bounded answer for th at snapshot sequence seq:
// the body of GET /bounded and, after its kind, a subscribeThread snapshot with
// acceptBoundedSnapshot (T3's buildBoundedThreadStreamSnapshot, checked by T3's own test against
// buildBoundedThreadProjection: the same window and history fields). The caller holds th.mu or
// Server.mu (every change holds both).
func (s *Server) encodeBoundedFields(e *jx.Encoder, th *thread, seq int64) {
	rows := s.opts.HistoryPage // 0: T3's window (boundedWindow); a test's HistoryPage caps it
	scratch := encoders.Get().(*jx.Encoder)
	defer func() {
		scratch.Reset()
		encoders.Put(scratch)
	}()
	e.FieldStart("snapshotSequence")
	e.Int64(seq)
	e.FieldStart("projection")
	ans := encodeBounded(e, scratch, th, rows, s.opts.ControlPlane)
	e.FieldStart("historyCursor")
	if ans.windowStart > 0 { // older items than the window's: the history pages hold them
		e.Str(historyCursor(th.items[ans.windowStart].Ordinal))
	} else {
		e.Null()
	}
	e.FieldStart("hasMoreHistory")
	e.Bool(ans.windowStart > 0)
	e.FieldStart("latestLocalTurnOrdinal")
	if ans.hasItems {
		e.Int64(ans.latestOrdinal)
	} else {
		e.Null()
	}
	e.FieldStart("payloadBudgetExceeded")
	e.Bool(ans.budgetExceeded)
}

// boundedSnapshotItem is the thread stream's snapshot item for a subscribeThread with
// acceptBoundedSnapshot at the head. Callers hold Server.mu.
func (s *Server) boundedSnapshotItem(th *thread) jx.Raw {
	return withEncoder(func(e *jx.Encoder) {
		e.ObjStart()
		e.FieldStart("kind")
		e.Str("snapshot")
		s.encodeBoundedFields(e, th, s.head)
		e.ObjEnd()
	})
}
