package events

import (
	"context"

	genevents "github.com/t3code-mcp/t3code-mcp/gen/events"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// SummaryLimit bounds an event's summary (the final assistant text).
const SummaryLimit = 2000

// ReadThread reads a thread's projection from its machine.
type ReadThread func(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, error)

type readCacheKey struct{}

type readResult struct {
	p   *t3api.ThreadProjection
	err error
}

// CachedRead wraps read so that, within one Detector.Apply, each thread is
// read from its machine at most once; outside Apply it reads every time. The
// projection is shared: callers must not modify it.
func CachedRead(read ReadThread) ReadThread {
	return func(ctx context.Context, machine, threadID string) (*t3api.ThreadProjection, error) {
		cache, ok := ctx.Value(readCacheKey{}).(map[string]readResult)
		if !ok {
			return read(ctx, machine, threadID)
		}
		k := machine + "\x00" + threadID
		if r, ok := cache[k]; ok {
			return r.p, r.err
		}
		p, err := read(ctx, machine, threadID)
		cache[k] = readResult{p, err}
		return p, err
	}
}

// NewBuilder renders events from the thread's projection: the run's final
// reply as summary, its error, or the pending question with its choices. When
// the machine cannot be read, the event goes out without those details rather
// than not at all.
func NewBuilder(read ReadThread, logf func(msg string, args ...any)) Builder {
	return func(ctx context.Context, tr Transition) ([]byte, error) {
		ev := genevents.Event{
			ID:         tr.ID,
			Type:       genevents.EventType(tr.Type),
			OccurredAt: tr.At,
			Machine:    tr.Machine,
			Project:    genevents.EventProject{ID: tr.Shell.ProjectId, Title: tr.Tracked.ProjectTitle},
			ThreadID:   tr.ThreadID,
			RunID:      tr.RunID,
			Title:      tr.Shell.Title,
		}
		if tr.Tracked.Origin != "" {
			ev.Origin.SetTo(tr.Tracked.Origin)
		}
		if tr.Type == Question {
			q := genevents.EventQuestion{RequestID: tr.RequestID, Kind: genevents.EventQuestionKindUserInput, Questions: []genevents.EventQuestionItem{}}
			if tr.Kind != "user_input" {
				q.Kind = genevents.EventQuestionKindApproval
			}
			ev.Question.SetTo(q)
		}
		p, err := read(ctx, tr.Machine, tr.ThreadID)
		if err != nil {
			if logf != nil {
				logf("event sent without details: thread unreadable", "event", tr.ID, "err", err)
			}
			return ev.MarshalJSON()
		}
		v := threadview.New(p)
		if ev.Project.Title == "" {
			ev.Project.Title = tr.Tracked.ProjectTitle
		}
		if s := v.Reply(tr.RunID); s != "" && tr.Type != Question {
			ev.Summary.SetTo(threadview.Cut(s, SummaryLimit))
		}
		if tr.Type == Failed {
			if e := v.Error(tr.RunID); e != "" {
				ev.Error.SetTo(threadview.Cut(e, SummaryLimit))
			}
		}
		if tr.Type == Question {
			if pq, ok := v.PendingQuestion(tr.RequestID, tr.Kind, threadview.DefaultLimits, nil); ok {
				q := ev.Question.Value
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
				ev.Question.SetTo(q)
			}
		}
		return ev.MarshalJSON()
	}
}
