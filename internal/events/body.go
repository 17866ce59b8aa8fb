package events

import (
	"context"
	"fmt"
	"time"

	genevents "github.com/t3code-mcp/t3code-mcp/gen/events"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// SummaryLimit bounds an event's summary (the final assistant text).
const SummaryLimit = 2000

// Reader reads a thread from its machine. The fleet satisfies it; the
// detector reads only off the Ack path (look-ups, enrichment).
type Reader interface {
	ReadThread(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, error)
}

// ReaderFunc adapts a function to Reader.
type ReaderFunc func(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, error)

// ReadThread implements Reader.
func (f ReaderFunc) ReadThread(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, error) {
	return f(ctx, machine, threadID)
}

// RecentReader also reads just the newest part of a thread (T3's bounded
// read: every run and request, the newest timeline rows); complete is false
// when older rows were left out. The enricher prefers it: an event is about a
// run that just ended, whose rows are the newest.
type RecentReader interface {
	ReadRecent(ctx context.Context, machine, threadID string) (p *t3api.ThreadProjection, complete bool, err error)
}

// KeepReader is a RecentReader that can also decode only some runs of the
// bounded read: the named ones (and requests) and the newest. The enricher
// prefers it: an event needs its own run, not the thread's whole history.
type KeepReader interface {
	ReadRecentKeep(ctx context.Context, machine, threadID string, runIDs, requestIDs []string) (p *t3api.ThreadProjection, complete bool, err error)
}

// eventType is the webhook event type that reports an outcome.
func eventType(o threadstate.Outcome) genevents.EventType {
	switch o {
	case threadstate.Completed:
		return genevents.EventTypeThreadCompleted
	case threadstate.Interrupted:
		return genevents.EventTypeThreadInterrupted
	case threadstate.Question:
		return genevents.EventTypeThreadQuestion
	}
	return genevents.EventTypeThreadFailed
}

// facts renders what the shell row and the tracked thread say about a
// transition: the event without the details only T3's thread read gives
// (summary, error, the question's text). It is what the Ack path commits.
func facts(tr Transition) genevents.Event {
	ev := genevents.Event{
		ID:         tr.ID,
		Type:       eventType(tr.Outcome),
		OccurredAt: tr.At,
		Machine:    tr.Machine,
		Project:    genevents.EventProject{ID: tr.ProjectID, Title: tr.Tracked.ProjectTitle},
		ThreadID:   tr.ThreadID,
		RunID:      tr.RunID,
		Title:      tr.Title,
	}
	if tr.RunStatus != "" {
		ev.RunStatus.SetTo(tr.RunStatus)
	}
	if ev.Project.ID == "" {
		ev.Project.ID = tr.Tracked.ProjectID
	}
	if ev.Title == "" {
		ev.Title = tr.Tracked.Title
	}
	if tr.Tracked.Origin != "" {
		ev.Origin.SetTo(tr.Tracked.Origin)
	}
	setWorkspace(&ev, tr.Branch, tr.Worktree)
	if tr.Outcome == threadstate.Question {
		q := genevents.EventQuestion{RequestID: tr.RequestID, Kind: genevents.EventQuestionKindUserInput, Questions: []genevents.EventQuestionItem{}}
		if tr.Kind != "user_input" {
			q.Kind = genevents.EventQuestionKindApproval
		}
		ev.Question.SetTo(q)
	}
	return ev
}

// complete adds what the thread's projection says: the run's final reply as
// summary, its error, the question with its choices.
func complete(ev *genevents.Event, p *t3api.ThreadProjection) {
	// The worktree path may have arrived since the row the facts came from.
	setWorkspace(ev, p.Thread.Branch.Or(""), p.Thread.WorktreePath.Or(""))
	v := threadview.New(p)
	if ev.Type != genevents.EventTypeThreadQuestion {
		if r, ok := v.Run(ev.RunID); ok && !ev.RunStatus.Set {
			if _, settled := threadstate.Settled(r.Status); settled {
				ev.RunStatus.SetTo(r.Status) // committed before the run's status was known
			}
		}
		if s := v.Reply(ev.RunID); s != "" {
			ev.Summary.SetTo(threadview.Cut(s, SummaryLimit))
		}
	}
	if ev.Type == genevents.EventTypeThreadFailed {
		if e := v.Error(ev.RunID); e != "" {
			ev.Error.SetTo(threadview.Cut(e, SummaryLimit))
		}
	}
	if q, ok := ev.Question.Get(); ok {
		if pq, ok := v.PendingQuestion(q.RequestID, string(q.Kind), threadview.DefaultLimits, nil); ok {
			q.Questions = q.Questions[:0]
			for _, mq := range pq.Questions {
				item := genevents.EventQuestionItem{ID: mq.ID, Text: mq.Text, Options: mq.Options}
				if h, ok := mq.Header.Get(); ok {
					item.Header.SetTo(h)
				}
				if ms, ok := mq.MultiSelect.Get(); ok {
					item.MultiSelect.SetTo(ms)
				}
				q.Questions = append(q.Questions, item)
			}
			if pq.Kind == "approval" {
				q.Kind = genevents.EventQuestionKindApproval
			}
			ev.Question.SetTo(q)
		}
	}
}

// missing names the fields a body of this type lacks until enriched.
func missing(t genevents.EventType) []string {
	switch t {
	case genevents.EventTypeThreadFailed:
		return []string{"summary", "error"}
	case genevents.EventTypeThreadQuestion:
		return []string{"question.questions"}
	}
	return []string{"summary"}
}

// Enricher completes the bodies the Ack path committed with only their facts
// (store.Event.Enrich): the outbox calls it before an event's first delivery
// attempt (outbox.Enricher), off the watcher's Ack path.
type Enricher struct {
	read Reader
	pre  prefetcher // reads started before the event's commit (prefetch.go)
	m    *Metrics   // nil: none
}

// NewEnricher reads threads through read.
func NewEnricher(read Reader) *Enricher { return &Enricher{read: read} }

// WithMetrics counts the prefetches' outcomes in m (t3code_mcp_events_enrich_prefetch_total).
func (en *Enricher) WithMetrics(m *Metrics) *Enricher {
	en.m = m
	return en
}

// Enrich reads the thread and returns the complete body. An error means T3
// could not be read now: the outbox tries again later. The read the detector
// started before the event's commit (Prefetch) is taken when there is one:
// waited for while under way, read again when it failed.
func (en *Enricher) Enrich(ctx context.Context, e store.Event) ([]byte, error) {
	body, outcome, err := en.pre.prefetched(ctx, e.ID)
	if err != nil {
		return nil, err
	}
	en.m.prefetched(outcome, 1)
	if outcome == prefetchUsed {
		return body, nil
	}
	return en.enrich(ctx, e)
}

// enrich reads the thread and completes e's body.
func (en *Enricher) enrich(ctx context.Context, e store.Event) ([]byte, error) {
	var ev genevents.Event
	if err := ev.UnmarshalJSON(e.Body); err != nil {
		// Not ours to fix: deliver what was stored rather than retrying forever.
		return e.Body, nil
	}
	p, err := en.readFor(ctx, &ev)
	if err != nil {
		return nil, fmt.Errorf("read thread %q on machine %q: %w", ev.ThreadID, ev.Machine, err)
	}
	complete(&ev, p)
	return ev.MarshalJSON()
}

// readFor reads what the event needs: the bounded read when the reader has
// one and the event's run (or request) is in its window, else the whole
// thread.
func (en *Enricher) readFor(ctx context.Context, ev *genevents.Event) (*t3api.ThreadProjection, error) {
	if kr, ok := en.read.(KeepReader); ok {
		var reqs []string
		if q, ok := ev.Question.Get(); ok {
			reqs = []string{q.RequestID}
		}
		p, complete, err := kr.ReadRecentKeep(ctx, ev.Machine, ev.ThreadID, []string{ev.RunID}, reqs)
		if err != nil {
			return nil, err
		}
		if complete || inWindow(p, ev) {
			return p, nil
		}
	} else if rr, ok := en.read.(RecentReader); ok {
		p, complete, err := rr.ReadRecent(ctx, ev.Machine, ev.ThreadID)
		if err != nil {
			return nil, err
		}
		if complete || inWindow(p, ev) {
			return p, nil
		}
	}
	return en.read.ReadThread(ctx, ev.Machine, ev.ThreadID)
}

// inWindow reports whether a bounded read holds the event's subject: the
// question's request item, or an item of the run and the run's end.
func inWindow(p *t3api.ThreadProjection, ev *genevents.Event) bool {
	if q, ok := ev.Question.Get(); ok {
		for i := range p.TurnItems {
			if r, ok := p.TurnItems[i].RequestId.Get(); ok && r == q.RequestID {
				return true
			}
		}
		return false
	}
	for i := range p.TurnItems {
		if r, ok := p.TurnItems[i].RunId.Get(); ok && r == ev.RunID {
			return true
		}
	}
	return false
}

// Partial returns the stored facts marked partial: partial true, the fields
// missing, and why (the last read error).
func (en *Enricher) Partial(e store.Event, cause error) []byte {
	var ev genevents.Event
	if err := ev.UnmarshalJSON(e.Body); err != nil {
		return e.Body
	}
	ev.Partial.SetTo(true)
	ev.Missing = missing(ev.Type)
	reason := "the thread could not be read from its machine"
	if cause != nil {
		reason += ": " + cause.Error()
	}
	ev.PartialReason.SetTo(threadview.Cut(reason, 500))
	b, err := ev.MarshalJSON()
	if err != nil {
		return e.Body
	}
	return b
}

// render is the complete body when the projection is at hand (a look-up
// read the thread anyway) or the row proved the run's reply (Transition.Reply:
// a plain completion needs nothing else from T3), else the facts for the
// outbox to enrich.
func render(tr Transition, p *t3api.ThreadProjection) (body []byte, enrich bool, err error) {
	ev := facts(tr)
	switch {
	case p != nil:
		complete(&ev, p)
	case tr.Reply != "":
		ev.Summary.SetTo(threadview.Cut(tr.Reply, SummaryLimit))
	}
	b, err := ev.MarshalJSON()
	return b, p == nil && tr.Reply == "", err
}

// rowReply is the settled run's reply as the shell row shows it, when the row proves that its
// latestVisibleMessage is that reply; ok is false when it cannot (the event is then enriched
// from T3, as before). Only a plain completion is taken from the row: a failure's error, a
// question's text and an interrupted run's partial reply are not on it. The proof:
//
//   - the run is the row's latest run, it completed (the caller judged the row RunSettled,
//     Completed) and no run is active (an active run's messages would be newer);
//   - the message is the assistant's, with text;
//   - it was last updated at or after the run started and not after it completed, so it is not
//     an earlier run's (an earlier run's messages are final before it completes, and the run
//     after it starts only then) nor a later run's.
//
// Every recorded row carries the message's whole text, the same as the run's message in the
// thread (TestRowReplyFixtures); no recorded reply is long enough to show whether T3 cuts a long
// one in the row (if it did, such a summary would end at T3's cut instead of SummaryLimit).
// Nothing of it is kept per thread: the row is the chunk's, decoded for this chunk only.
func rowReply(row *t3rpc.ThreadShell, runID string) (string, bool) {
	m, ok := row.LatestVisibleMessage.Get()
	if !ok || m.Role != "assistant" || m.Text == "" {
		return "", false
	}
	if runID == "" || runID != threadstate.LatestRun(row) || threadstate.ActiveRun(row) != "" {
		return "", false
	}
	if out, v := threadstate.Judge(row, runID); v != threadstate.RunSettled || out != threadstate.Completed || row.Status != "completed" {
		return "", false
	}
	updated, ok := parseTime(m.UpdatedAt.Or(""))
	if !ok {
		return "", false
	}
	started, ok := parseTime(row.LatestRunStartedAt.Or(""))
	if !ok || updated.Before(started) {
		return "", false
	}
	if c, ok := parseTime(row.LatestRunCompletedAt.Or("")); ok && updated.After(c) {
		return "", false
	}
	return m.Text, true
}

// parseTime reads T3's ISO 8601 times.
func parseTime(s string) (time.Time, bool) {
	if s == "" {
		return time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	return t.UTC(), err == nil
}

// setWorkspace names the thread's branch and worktree in the event, where known.
func setWorkspace(ev *genevents.Event, branch, worktree string) {
	if branch != "" {
		ev.Branch.SetTo(branch)
	}
	if worktree != "" {
		ev.Worktree.SetTo(worktree)
	}
}
