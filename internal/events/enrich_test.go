package events

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	genevents "github.com/t3code-mcp/t3code-mcp/gen/events"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// recentReader serves a bounded window (items of the runs in window) and the
// whole thread, counting each.
type recentReader struct {
	window        []string // runs whose items the bounded read holds
	recent, whole int
	err           error
}

func (r *recentReader) project(runs []string) *t3api.ThreadProjection {
	p := &t3api.ThreadProjection{Thread: t3api.AppThread{ID: "t1"}}
	for i, id := range runs {
		p.Runs = append(p.Runs, t3api.Run{ID: id, ThreadId: "t1", Ordinal: int64(i + 1), Status: "completed"})
		p.TurnItems = append(p.TurnItems, t3api.TurnItem{ID: "i-" + id, Type: "assistant_message", Ordinal: int64(i + 1), RunId: t3api.NewOptNilString(id), Text: t3api.NewOptString("reply of " + id)})
	}
	return p
}

func (r *recentReader) ReadThread(context.Context, string, string) (*t3api.ThreadProjection, error) {
	r.whole++
	return r.project([]string{"r1", "r2"}), r.err
}

func (r *recentReader) ReadRecent(context.Context, string, string) (*t3api.ThreadProjection, bool, error) {
	r.recent++
	if r.err != nil {
		return nil, false, r.err
	}
	return r.project(r.window), false, nil
}

func factsEvent(t *testing.T, run string) store.Event {
	t.Helper()
	b, _, err := render(Transition{ID: "evt_1", Outcome: threadstate.Completed, Machine: "m", ThreadID: "t1", RunID: run, Title: "T"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return store.Event{ID: "evt_1", Stream: "m/t1", Body: b, Enrich: true}
}

// The enricher reads the bounded window when the run is in it, the whole
// thread only when it is not; a read error is returned (try again later).
func TestEnricherPrefersTheBoundedRead(t *testing.T) {
	rr := &recentReader{window: []string{"r2"}}
	en := NewEnricher(rr)
	body, err := en.Enrich(context.Background(), factsEvent(t, "r2"))
	if err != nil || !strings.Contains(string(body), `"summary":"reply of r2"`) || rr.recent != 1 || rr.whole != 0 {
		t.Fatalf("r2: %s %v (recent %d, whole %d)", body, err, rr.recent, rr.whole)
	}
	body, err = en.Enrich(context.Background(), factsEvent(t, "r1")) // out of the window
	if err != nil || !strings.Contains(string(body), `"summary":"reply of r1"`) || rr.whole != 1 {
		t.Fatalf("r1: %s %v (recent %d, whole %d)", body, err, rr.recent, rr.whole)
	}
	rr.err = errors.New("HTTP 500")
	if _, err := en.Enrich(context.Background(), factsEvent(t, "r2")); err == nil {
		t.Fatal("a failed read must be an error (the outbox retries)")
	}
}

// A partial body says so, names what is missing and why.
func TestEnricherPartial(t *testing.T) {
	en := NewEnricher(&recentReader{})
	var b body
	if err := json.Unmarshal(en.Partial(factsEvent(t, "r1"), errors.New("machine \"m\": timeout")), &b); err != nil {
		t.Fatal(err)
	}
	if !b.Partial || len(b.Missing) != 1 || b.Missing[0] != "summary" || !strings.Contains(b.PartialReason, "timeout") || b.ID != "evt_1" || b.Run != "r1" {
		t.Fatalf("partial body = %+v", b)
	}
}

// An event's type and id come from the run's outcome; the id hashes the webhook type as before
// the outcome became one type, so ids already in a state file stay the ids of the same events.
func TestEventTypeAndIDFromOutcome(t *testing.T) {
	for o, want := range map[threadstate.Outcome]genevents.EventType{
		threadstate.Completed:   genevents.EventTypeThreadCompleted,
		threadstate.Interrupted: genevents.EventTypeThreadInterrupted,
		threadstate.Failed:      genevents.EventTypeThreadFailed,
		threadstate.Question:    genevents.EventTypeThreadQuestion,
	} {
		if got := eventType(o); got != want {
			t.Errorf("eventType(%s) = %s, want %s", o, got, want)
		}
	}
	// Pinned: sha256("mac\x00th-1\x00thread.completed\x00run-1")[:12].
	if got, want := eventID("mac", "th-1", threadstate.Completed, "run-1"), "evt_b7831c9c67a1988d68f52761"; got != want {
		t.Fatalf("eventID = %s, want %s", got, want)
	}
}
