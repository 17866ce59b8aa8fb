package events

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-faster/jx"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// recording is one recorded T3 exchange: its shell rows in the order T3 sent them, and the final
// text of every assistant message the recording shows with its run (from thread projections,
// thread events and turn items).
type recording struct {
	rows    []t3rpc.ThreadShell
	replies map[string]map[string]string // run id → message id → final text (message ids repeat across threads)
}

func (r *recording) add(run, msg, text string) {
	if r.replies[run] == nil {
		r.replies[run] = map[string]string{}
	}
	r.replies[run][msg] = text
}

func loadRecordings(t *testing.T) map[string]*recording {
	t.Helper()
	out := map[string]*recording{}
	files, err := filepath.Glob("../../testdata/t3/*/*.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var doc any
		if json.Unmarshal(b, &doc) != nil {
			continue
		}
		r := &recording{replies: map[string]map[string]string{}}
		r.walk(t, doc)
		out[filepath.Base(path)] = r
	}
	return out
}

// walk collects, in document order, the shell rows of thread.updated items and every final
// assistant message (as a message or an assistant_message turn item), looking into frames'
// JSON strings too.
func (r *recording) walk(t *testing.T, v any) {
	switch v := v.(type) {
	case map[string]any:
		id, _ := v["id"].(string)
		run, _ := v["runId"].(string)
		text, hasText := v["text"].(string)
		if v["role"] == "assistant" && id != "" && run != "" && hasText && v["streaming"] != true {
			r.add(run, id, text)
		}
		if mid, ok := v["messageId"].(string); ok && v["type"] == "assistant_message" && v["streaming"] != true && run != "" && hasText {
			r.add(run, mid, text)
		}
		if th, ok := v["thread"].(map[string]any); ok && v["kind"] == "thread.updated" {
			raw, _ := json.Marshal(th)
			var row t3rpc.ThreadShell
			if err := row.Decode(jx.DecodeBytes(raw)); err != nil {
				t.Fatalf("recorded shell row: %v", err)
			}
			r.rows = append(r.rows, row)
		}
		for _, x := range v {
			r.walk(t, x)
		}
	case []any:
		for _, x := range v {
			r.walk(t, x)
		}
	case string:
		if strings.HasPrefix(v, "{") || strings.HasPrefix(v, "[") {
			var x any
			if json.Unmarshal([]byte(v), &x) == nil {
				r.walk(t, x)
			}
		}
	}
}

// TestRowReplyFixtures: in T3's recorded traffic, every shell row that rowReply accepts carries
// the whole final reply of the run it settles (the same text as that run's assistant message in
// the thread's projection and events), and the rows it must refuse are refused: a run still
// waiting for its checkpoint, a row whose latest message is the user's, a failed or interrupted
// run. At least the completions of the basic run, the busy-thread and the turn-diff recordings
// are accepted, so the check is not vacuous.
func TestRowReplyFixtures(t *testing.T) {
	accepted := 0
	for name, rec := range loadRecordings(t) {
		for i := range rec.rows {
			row := &rec.rows[i]
			latest := threadstate.LatestRun(row)
			text, ok := rowReply(row, latest)
			m, hasMsg := row.LatestVisibleMessage.Get()
			if !ok {
				if _, ours := rec.replies[latest][m.ID]; row.Status == "completed" && threadstate.ActiveRun(row) == "" && hasMsg && m.Role == "assistant" && ours {
					t.Errorf("%s: row of thread %s (run %s completed, its reply on the row) refused", name, row.ID, latest)
				}
				continue
			}
			if row.Status != "completed" {
				t.Errorf("%s: row in status %q accepted", name, row.Status)
			}
			if len(rec.replies[latest]) == 0 {
				continue // the recording does not show the run's messages: nothing to compare with
			}
			accepted++
			want, known := rec.replies[latest][m.ID]
			if !known {
				t.Errorf("%s: accepted message %s is not one of run %s's messages %v", name, m.ID, latest, rec.replies[latest])
				continue
			}
			if text != want {
				t.Errorf("%s: row reply %q, the run's message says %q", name, text, want)
			}
		}
	}
	if accepted < 3 {
		t.Fatalf("rowReply accepted %d recorded rows; the recordings hold at least 3 completed runs with their reply", accepted)
	}
}

// TestRowReplyRefuses: what the row cannot prove is left to the enrichment read.
func TestRowReplyRefuses(t *testing.T) {
	base := func() t3rpc.ThreadShell {
		return t3rpc.ThreadShell{
			ID: "t1", Status: "completed",
			LatestRunId:          t3rpc.NewOptNilString("r2"),
			ActiveRunId:          t3rpc.OptNilString{Set: true, Null: true},
			LatestRunStartedAt:   t3rpc.NewOptNilString("2026-11-29T08:52:41.039Z"),
			LatestRunCompletedAt: t3rpc.NewOptNilString("2026-11-29T08:52:41.235Z"),
			LatestVisibleMessage: t3rpc.NewOptNilVisibleMessage(t3rpc.VisibleMessage{
				ID: "m2", Role: "assistant", Text: "the reply", UpdatedAt: t3rpc.NewOptString("2026-11-29T08:52:41.202Z"),
			}),
		}
	}
	if text, ok := rowReply(ptr(base()), "r2"); !ok || text != "the reply" {
		t.Fatalf("the plain completion: %q %v", text, ok)
	}
	for name, change := range map[string]func(r *t3rpc.ThreadShell){
		"no message":         func(r *t3rpc.ThreadShell) { r.LatestVisibleMessage = t3rpc.OptNilVisibleMessage{Set: true, Null: true} },
		"the user's message": func(r *t3rpc.ThreadShell) { r.LatestVisibleMessage.Value.Role = "user" },
		"empty text":         func(r *t3rpc.ThreadShell) { r.LatestVisibleMessage.Value.Text = "" },
		"written before the run": func(r *t3rpc.ThreadShell) {
			r.LatestVisibleMessage.Value.UpdatedAt = t3rpc.NewOptString("2026-11-29T08:52:41.038Z")
		},
		"written after it completed": func(r *t3rpc.ThreadShell) {
			r.LatestVisibleMessage.Value.UpdatedAt = t3rpc.NewOptString("2026-11-29T08:52:41.236Z")
		},
		"no time on the message": func(r *t3rpc.ThreadShell) { r.LatestVisibleMessage.Value.UpdatedAt = t3rpc.OptString{} },
		"run start unknown":      func(r *t3rpc.ThreadShell) { r.LatestRunStartedAt = t3rpc.OptNilString{Set: true, Null: true} },
		"another run active":     func(r *t3rpc.ThreadShell) { r.ActiveRunId = t3rpc.NewOptNilString("r1") },
		"failed":                 func(r *t3rpc.ThreadShell) { r.Status = "failed" },
		"interrupted":            func(r *t3rpc.ThreadShell) { r.Status = "interrupted" },
		"still waiting":          func(r *t3rpc.ThreadShell) { r.Status = "waiting" },
		"not the latest run":     func(r *t3rpc.ThreadShell) { r.LatestRunId = t3rpc.NewOptNilString("r3") },
	} {
		row := base()
		change(&row)
		if text, ok := rowReply(&row, "r2"); ok {
			t.Errorf("%s: accepted %q", name, text)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// TestCompletionCommittedComplete: a chunk whose row proves the completed run's reply commits
// the event complete (summary set, no enrichment mark) without reading the thread; a failure in
// the same chunk is committed with its facts and the mark, for the outbox to complete from T3.
func TestCompletionCommittedComplete(t *testing.T) {
	e := newEnv(t, "")
	for _, id := range []string{"t1", "t2"} {
		base := row(id, "running", "r1", "r1", "")
		e.watchThread(id, "", &base)
	}
	done := row("t1", "completed", "", "r1", "")
	done.LatestRunStartedAt = t3rpc.NewOptNilString("2026-12-01T10:00:00.000Z")
	done.LatestRunCompletedAt = t3rpc.NewOptNilString("2026-12-01T10:00:05.000Z")
	done.LatestVisibleMessage = t3rpc.NewOptNilVisibleMessage(t3rpc.VisibleMessage{
		ID: "m1", Role: "assistant", Text: "All done.", UpdatedAt: t3rpc.NewOptString("2026-12-01T10:00:04.000Z"),
	})
	failed := done
	failed.ID, failed.Status = "t2", "failed"
	e.apply(done, failed)
	recs := e.records()
	if len(recs) != 2 {
		t.Fatalf("%d events, want 2: %+v", len(recs), recs)
	}
	for _, r := range recs {
		switch r.Type {
		case "thread.completed":
			if r.enrich || r.Summary != "All done." || r.RunStatus != "completed" {
				t.Errorf("completion committed enrich=%v %+v", r.enrich, r.body)
			}
		case "thread.failed":
			if !r.enrich || r.Summary != "" {
				t.Errorf("failure committed enrich=%v %+v", r.enrich, r.body)
			}
		default:
			t.Errorf("unexpected event %+v", r.body)
		}
	}
	if e.reads != 0 {
		t.Fatalf("%d reads of T3 on the Ack path", e.reads)
	}
}
