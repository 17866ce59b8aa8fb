package threadview

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
)

const fixtures = "../../testdata/t3/t3-v2-pr2829/"

type recording struct {
	Exchanges []struct {
		URL          string `json:"url"`
		Status       int    `json:"status"`
		ResponseBody string `json:"responseBody"`
	} `json:"exchanges"`
	Frames []struct {
		Dir  string `json:"dir"`
		Data string `json:"data"`
	} `json:"frames"`
}

func load(t testing.TB, name string) recording {
	t.Helper()
	b, err := os.ReadFile(fixtures + name)
	if err != nil {
		t.Fatal(err)
	}
	var r recording
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// projectionFromHTTP returns the recorded GET /threads/{id} body for a thread.
func projectionFromHTTP(t testing.TB, name, threadID string) *t3api.ThreadProjection {
	t.Helper()
	for _, e := range load(t, name).Exchanges {
		if strings.HasSuffix(e.URL, "/threads/"+threadID) && e.Status == 200 {
			var s t3api.ThreadSnapshot
			if err := s.UnmarshalJSON([]byte(e.ResponseBody)); err != nil {
				t.Fatal(err)
			}
			return &s.Projection
		}
	}
	t.Fatalf("no projection of %s in %s", threadID, name)
	return nil
}

// projectionFromEvents folds a recording's thread events into a projection the
// way T3's client does: payloads are whole records, upserted by id.
func projectionFromEvents(t testing.TB, name string) *t3api.ThreadProjection {
	t.Helper()
	type keyed struct {
		order []string
		byID  map[string]json.RawMessage
	}
	lists := map[string]*keyed{}
	upsert := func(list string, payload json.RawMessage) {
		var id struct {
			ID string `json:"id"`
		}
		_ = json.Unmarshal(payload, &id)
		k := lists[list]
		if k == nil {
			k = &keyed{byID: map[string]json.RawMessage{}}
			lists[list] = k
		}
		if _, ok := k.byID[id.ID]; !ok {
			k.order = append(k.order, id.ID)
		}
		k.byID[id.ID] = payload
	}
	var thread json.RawMessage
	for _, f := range load(t, name).Frames {
		if f.Dir != "recv" || !strings.Contains(f.Data, `"kind":"`) {
			continue
		}
		var msg struct {
			Values []struct {
				Kind       string          `json:"kind"`
				Projection json.RawMessage `json:"projection"`
				Event      struct {
					Type    string          `json:"type"`
					Payload json.RawMessage `json:"payload"`
				} `json:"event"`
			} `json:"values"`
		}
		if err := json.Unmarshal([]byte(f.Data), &msg); err != nil {
			continue
		}
		for _, v := range msg.Values {
			if v.Kind == "snapshot" && thread == nil {
				var snap struct {
					Thread json.RawMessage `json:"thread"`
				}
				if json.Unmarshal(v.Projection, &snap) == nil && len(snap.Thread) > 0 {
					thread = snap.Thread
				}
			}
			switch e := v.Event; {
			case e.Type == "thread.created":
				thread = e.Payload
			case strings.HasPrefix(e.Type, "run."):
				upsert("runs", e.Payload)
			case e.Type == "turn-item.updated":
				upsert("turnItems", e.Payload)
			case e.Type == "runtime-request.updated":
				upsert("runtimeRequests", e.Payload)
			case e.Type == "message.updated":
				upsert("messages", e.Payload)
			case e.Type == "checkpoint.captured":
				upsert("checkpoints", e.Payload)
			}
		}
	}
	out := map[string]any{"thread": thread}
	for name, k := range lists {
		arr := []json.RawMessage{}
		for _, id := range k.order {
			arr = append(arr, k.byID[id])
		}
		out[name] = arr
	}
	if _, ok := out["runs"]; !ok {
		out["runs"] = []any{}
	}
	b, _ := json.Marshal(out)
	var p t3api.ThreadProjection
	if err := p.UnmarshalJSON(b); err != nil {
		t.Fatalf("fold %s: %v", name, err)
	}
	return &p
}

func TestRenderCompletedRun(t *testing.T) {
	p := projectionFromHTTP(t, "11-http-reads-populated.json", "thread-6dcf45e8-edb5-4e41-bef9-584ba76aa7d3")
	st := New(p).Render(Meta{Machine: "vm", Project: mcptools.ProjectRef{ID: "p", Title: "fixtures"}, Status: "completed"}, 3, DefaultLimits)
	if len(st.Runs) != 1 {
		t.Fatalf("runs = %d", len(st.Runs))
	}
	r := st.Runs[0]
	if got := r.Reply.Or(""); got != "hello from mock" {
		t.Errorf("reply = %q", got)
	}
	if got := r.Prompt.Or(""); got != "Launched with a first message." {
		t.Errorf("prompt = %q", got)
	}
	if st.LatestRun.Value.Status != "completed" || st.Status != "completed" {
		t.Errorf("status = %q / %q", st.Status, st.LatestRun.Value.Status)
	}
	if st.PendingQuestion.Set {
		t.Error("no question expected")
	}
}

func TestRenderFailedRunCarriesError(t *testing.T) {
	p := projectionFromEvents(t, "08-ws-run-failure.json")
	v := New(p)
	runs := v.Runs()
	if len(runs) == 0 {
		t.Fatal("no run folded")
	}
	last := runs[len(runs)-1]
	if last.Status != "failed" {
		t.Fatalf("status = %q", last.Status)
	}
	if e := v.Error(last.ID); !strings.Contains(e, "Mock prompt failure") {
		t.Errorf("error = %q", e)
	}
	st := v.Render(Meta{Machine: "vm"}, 3, DefaultLimits)
	if !strings.Contains(st.LatestRun.Value.Error.Or(""), "Mock prompt failure") {
		t.Errorf("latest_run.error = %q", st.LatestRun.Value.Error.Or(""))
	}
}

func TestRenderPendingQuestion(t *testing.T) {
	p := projectionFromEvents(t, "06-ws-pending-question.json")
	v := New(p)
	var reqID string
	for _, it := range p.TurnItems {
		if it.Type == "user_input_request" {
			reqID = it.RequestId.Or("")
		}
	}
	if reqID == "" {
		t.Fatal("no question item folded")
	}
	st := v.Render(Meta{Machine: "vm", Status: "running", PendingRequestID: reqID, PendingKind: "user_input"}, 3, DefaultLimits)
	q, ok := st.PendingQuestion.Get()
	if !ok || q.RequestID != reqID || q.Kind != mcptools.QuestionKindUserInput {
		t.Fatalf("pending = %+v", st.PendingQuestion)
	}
	if len(q.Questions) != 1 || q.Questions[0].ID != "Which scope should Grok use?" {
		t.Fatalf("questions = %+v", q.Questions)
	}
	if got := strings.Join(q.Questions[0].Options, ","); got != "Workspace,Session" {
		t.Errorf("options = %s", got)
	}
}

func TestCutMarksWhatWasCut(t *testing.T) {
	long := strings.Repeat("é", 50)
	got := Cut(long, 10)
	if !strings.HasPrefix(got, strings.Repeat("é", 10)) || !strings.HasSuffix(got, "… [40 characters cut]") {
		t.Fatalf("cut = %q", got)
	}
	p := projectionFromHTTP(t, "11-http-reads-populated.json", "thread-6dcf45e8-edb5-4e41-bef9-584ba76aa7d3")
	lim := DefaultLimits
	lim.Reply = 5
	st := New(p).Render(Meta{}, 3, lim)
	if len(st.Truncated) != 1 || st.Truncated[0].Field != "runs[0].reply" || st.Truncated[0].CutChars != len("hello from mock")-5 {
		t.Fatalf("truncated = %+v", st.Truncated)
	}
}
