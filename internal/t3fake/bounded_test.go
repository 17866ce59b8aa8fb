package t3fake

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// The /bounded answer as T3 builds it (bounded.go): one test per rule.

type boundedBody struct {
	SnapshotSequence       int64           `json:"snapshotSequence"`
	Projection             boundedProj     `json:"projection"`
	HistoryCursor          *string         `json:"historyCursor"`
	HasMoreHistory         bool            `json:"hasMoreHistory"`
	LatestLocalTurnOrdinal *int64          `json:"latestLocalTurnOrdinal"`
	PayloadBudgetExceeded  *bool           `json:"payloadBudgetExceeded"`
	Raw                    json.RawMessage `json:"-"`
}

type boundedProj struct {
	Runs            []struct{ ID, Status, UserMessageId string } `json:"runs"`
	Attempts        []json.RawMessage                            `json:"attempts"`
	Nodes           []json.RawMessage                            `json:"nodes"`
	RuntimeRequests []struct{ ID, Status string }                `json:"runtimeRequests"`
	Messages        []struct{ ID, RunId string }                 `json:"messages"`
	TurnItems       []testItem                                   `json:"turnItems"`
	Checkpoints     []json.RawMessage                            `json:"checkpoints"`
	Visible         []struct {
		Position       int      `json:"position"`
		Visibility     string   `json:"visibility"`
		SourceThreadId string   `json:"sourceThreadId"`
		SourceItemId   string   `json:"sourceItemId"`
		Item           testItem `json:"item"`
	} `json:"visibleTurnItems"`
}

type testItem struct {
	ID, Type, RunId, MessageId, RequestId string
	Ordinal                               int64
}

func getBounded(t *testing.T, s *Server, tid string) (boundedBody, int) {
	t.Helper()
	r := doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/"+url.PathEscape(tid)+"/bounded", bearer(s.Token()), "")
	if r.status != 200 {
		t.Fatalf("bounded: %d %s", r.status, r.body)
	}
	var b boundedBody
	if err := json.Unmarshal([]byte(r.body), &b); err != nil {
		t.Fatal(err)
	}
	return b, len(r.body)
}

func getWhole(t *testing.T, s *Server, tid string) boundedProj {
	t.Helper()
	r := doHTTP(t, nil, "GET", s.URL()+"/api/orchestration/threads/"+url.PathEscape(tid), bearer(s.Token()), "")
	var b struct{ Projection boundedProj }
	if err := json.Unmarshal([]byte(r.body), &b); err != nil || r.status != 200 {
		t.Fatalf("thread: %d %v", r.status, err)
	}
	return b.Projection
}

func runs(t *testing.T, s *Server, tid string, prompts ...string) {
	t.Helper()
	for _, p := range prompts {
		if _, err := s.StartRun(tid, p); err != nil {
			t.Fatal(err)
		}
		s.StepAll()
	}
}

func itemIDs(items []testItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

// (b), (e), (f): the window is the newest ten user turns; runs and checkpoints stay whole; the
// history fields say where the window starts, and latestLocalTurnOrdinal is the newest ordinal
// of all the thread's items.
func TestBoundedWindowIsTheNewestTenUserTurns(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, KeepRuns: -1})
	tid := s.AddThread(s.AddProject("p", "/srv/p"), "t", "idle")
	for i := range 12 {
		runs(t, s, tid, fmt.Sprint("work ", i))
	}
	whole := getWhole(t, s, tid)
	b, _ := getBounded(t, s, tid)
	p := b.Projection

	userTurns := 0
	for _, v := range p.Visible {
		if v.Item.Type == "user_message" {
			userTurns++
		}
	}
	if userTurns != boundedUserTurns || len(p.Visible) >= len(whole.TurnItems) || p.Visible[0].Item.Type != "user_message" {
		t.Fatalf("window: %d items, %d user turns, first %q; the thread has %d items", len(p.Visible), userTurns, p.Visible[0].Item.Type, len(whole.TurnItems))
	}
	wantIDs := itemIDs(whole.TurnItems[len(whole.TurnItems)-len(p.Visible):])
	var visIDs []string
	for i, v := range p.Visible {
		visIDs = append(visIDs, v.Item.ID)
		if v.Position != i || v.Visibility != "local" || v.SourceThreadId != tid || v.SourceItemId != v.Item.ID {
			t.Errorf("visible %d: %+v", i, v)
		}
	}
	if !slices.Equal(visIDs, wantIDs) {
		t.Errorf("visibleTurnItems %v, want the newest %v", visIDs, wantIDs)
	}
	if got := itemIDs(p.TurnItems); !slices.Equal(got, wantIDs) { // (a): no control items here
		t.Errorf("turnItems %v, want the window %v", got, wantIDs)
	}
	if len(p.Runs) != 12 || len(p.Checkpoints) != len(whole.Checkpoints) || len(p.RuntimeRequests) != len(whole.RuntimeRequests) {
		t.Errorf("runs %d, checkpoints %d of %d: want them whole", len(p.Runs), len(p.Checkpoints), len(whole.Checkpoints))
	}
	if b.HistoryCursor == nil || !b.HasMoreHistory {
		t.Fatalf("history fields %+v", b)
	}
	if c, ok := parseHistoryCursor(*b.HistoryCursor); !ok || c != p.Visible[0].Item.Ordinal {
		t.Errorf("cursor names %d, want the window's oldest ordinal %d", c, p.Visible[0].Item.Ordinal)
	}
	maxOrdinal := int64(0)
	for _, it := range whole.TurnItems {
		maxOrdinal = max(maxOrdinal, it.Ordinal)
	}
	if b.LatestLocalTurnOrdinal == nil || *b.LatestLocalTurnOrdinal != maxOrdinal {
		t.Errorf("latestLocalTurnOrdinal %v, want %d", b.LatestLocalTurnOrdinal, maxOrdinal)
	}
	if b.PayloadBudgetExceeded == nil || *b.PayloadBudgetExceeded {
		t.Errorf("payloadBudgetExceeded %v on a small thread", b.PayloadBudgetExceeded)
	}
}

// (b): the window is at most the row limit (T3: 75; a test's Options.HistoryPage), and an empty
// thread has no window, no cursor and no ordinal.
func TestBoundedWindowRowLimit(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 7})
	tid := s.AddThread(s.AddProject("p", "/srv/p"), "t", "idle")
	b, _ := getBounded(t, s, tid)
	if len(b.Projection.Visible) != 0 || b.HistoryCursor != nil || b.HasMoreHistory || b.LatestLocalTurnOrdinal != nil {
		t.Fatalf("empty thread: %+v", b)
	}
	runs(t, s, tid, "one", "two")
	b, _ = getBounded(t, s, tid)
	if len(b.Projection.Visible) != 7 || len(b.Projection.TurnItems) != 7 || !b.HasMoreHistory {
		t.Fatalf("window of %d (turnItems %d), want 7", len(b.Projection.Visible), len(b.Projection.TurnItems))
	}
}

// (b): the byte budget: the window stops before the item that would overrun it, but always has
// the newest item.
func TestBoundedWindowByteBudget(t *testing.T) {
	items := make([]*t3rpc.TurnItem, 20)
	for i := range items {
		items[i] = &t3rpc.TurnItem{Type: "assistant_message", Ordinal: int64(i)}
	}
	size := func(*t3rpc.TurnItem) int { return 100 }
	for _, c := range []struct{ budget, want int }{{10_000, 0}, {1_000, 10}, {1_050, 10}, {100, 19}, {50, 19}, {-5, 19}} {
		if got := boundedWindow(items, boundedRows, func() int { return c.budget }, size); got != c.want {
			t.Errorf("budget %d: window from %d, want %d", c.budget, got, c.want)
		}
	}
	items[15].Type = "user_message"
	items[5].Type = "user_message"
	if got := boundedWindow(items, 3, func() int { return 1 << 20 }, size); got != 17 {
		t.Errorf("row limit 3: from %d, want 17", got)
	}
}

// (b): with turn starts, T3 windows by user turns only: ten turns of 20 items each are a
// 200-item window, past the 75 items and whatever bytes a timeline without turns is held to; the
// store window's hard row bound still holds.
// The budget of a timeline without turns is not even asked for (nil).
func TestBoundedWindowByTurnsHasNoItemOrByteBudget(t *testing.T) {
	items := make([]*t3rpc.TurnItem, 300)
	for i := range items {
		items[i] = &t3rpc.TurnItem{Type: "command_execution", Ordinal: int64(i)}
		if i%20 == 0 {
			items[i].Type = "user_message"
		}
	}
	size := func(*t3rpc.TurnItem) int { return 10_000 } // 2 MB for 200 items: over boundedBudget
	if got := boundedWindow(items, 0, nil, size); got != 100 {
		t.Errorf("window from %d, want 100 (the newest ten turns)", got)
	}
	for _, it := range items {
		it.Type = "command_execution"
	}
	items[0].Type = "user_message" // one turn of 300 items: only the hard bounds cut it
	if got := boundedWindow(items, 0, nil, func(*t3rpc.TurnItem) int { return 1 }); got != 0 {
		t.Errorf("one long turn: window from %d, want 0", got)
	}
	items[0].Type = "command_execution" // no turn starts: 75 items within the budget
	if got := boundedWindow(items, 0, func() int { return 1 << 20 }, func(*t3rpc.TurnItem) int { return 1 }); got != 300-boundedRows {
		t.Errorf("no turns: window from %d, want %d", got, 300-boundedRows)
	}
}

// (a): an interrupt request and a pending request's item stay in turnItems outside the window.
func TestBoundedKeepsControlItems(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, KeepRuns: -1})
	tid := s.AddThread(s.AddProject("p", "/srv/p"), "t", "idle")
	rid, err := s.StartRun(tid, "hang forever")
	if err != nil {
		t.Fatal(err)
	}
	s.StepAll()
	s.mu.Lock()
	th := s.threadByID[tid]
	th.mu.Lock()
	_, fail := s.runInterrupt(&t3rpc.RunInterruptCommand{ThreadId: tid, RunId: rid})
	th.mu.Unlock()
	s.mu.Unlock()
	if fail != nil {
		t.Fatal(fail)
	}
	s.StepAll()
	for i := range 11 {
		runs(t, s, tid, fmt.Sprint("work ", i))
	}
	if _, err := s.StartRun(tid, "ask me a question first"); err != nil {
		t.Fatal(err)
	}
	s.StepAll() // parked on its question

	b, _ := getBounded(t, s, tid)
	p := b.Projection
	var interrupt, question *testItem
	for i, it := range p.TurnItems {
		switch {
		case it.Type == "run_interrupt_request":
			interrupt = &p.TurnItems[i]
		case it.RequestId != "" && slices.ContainsFunc(p.RuntimeRequests, func(r struct{ ID, Status string }) bool { return r.ID == it.RequestId && r.Status == "pending" }):
			question = &p.TurnItems[i]
		}
	}
	if interrupt == nil || question == nil {
		t.Fatalf("turnItems %v: want the interrupt request and the pending question", itemIDs(p.TurnItems))
	}
	if interrupt.RunId != rid || p.Visible[0].Item.Ordinal <= interrupt.Ordinal {
		t.Errorf("the interrupt request %+v is not older than the window (from %d)", interrupt, p.Visible[0].Item.Ordinal)
	}
	if len(p.TurnItems) != len(p.Visible)+1 {
		t.Errorf("turnItems %d: want the window's %d and the interrupt request", len(p.TurnItems), len(p.Visible))
	}

	// With a window of one item, the pending question's item is kept outside it too.
	s1 := StartT(t, Options{ManualSteps: true, HistoryPage: 1})
	tid1 := s1.AddThread(s1.AddProject("p", "/srv/p"), "t", "idle")
	if _, err := s1.StartRun(tid1, "ask me a question first"); err != nil {
		t.Fatal(err)
	}
	s1.StepAll()
	b1, _ := getBounded(t, s1, tid1)
	if len(b1.Projection.Visible) != 1 || !slices.ContainsFunc(b1.Projection.TurnItems, func(it testItem) bool { return it.Type == "user_input_request" }) {
		t.Errorf("window %d, turnItems %v: want the pending question's item", len(b1.Projection.Visible), itemIDs(b1.Projection.TurnItems))
	}
}

// (c): messages are those the kept items name and the latest run's; older runs' are left out.
func TestBoundedKeepsTheMessagesItNeeds(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, HistoryPage: 1, KeepRuns: -1})
	tid := s.AddThread(s.AddProject("p", "/srv/p"), "t", "idle")
	runs(t, s, tid, "one", "two", "three")
	whole := getWhole(t, s, tid)
	b, _ := getBounded(t, s, tid)
	p := b.Projection
	latest := p.Runs[len(p.Runs)-1]
	named := map[string]bool{}
	for _, it := range p.TurnItems {
		if it.MessageId != "" {
			named[it.MessageId] = true
		}
	}
	var want []string
	for _, m := range whole.Messages {
		if named[m.ID] || m.RunId == latest.ID || m.ID == latest.UserMessageId {
			want = append(want, m.ID)
		}
	}
	var got []string
	for _, m := range p.Messages {
		got = append(got, m.ID)
	}
	if !slices.Equal(got, want) || len(got) >= len(whole.Messages) || !slices.Contains(got, latest.UserMessageId) {
		t.Errorf("messages %v, want %v (of %d)", got, want, len(whole.Messages))
	}
}

// (f): a projection over the payload budget says so.
func TestBoundedSaysWhenOverBudget(t *testing.T) {
	s := StartT(t, Options{ManualSteps: true, KeepRuns: -1, ControlPlane: true})
	tid := s.AddThread(s.AddProject("p", "/srv/p"), "t", "idle")
	for i := 0; ; i++ {
		runs(t, s, tid, fmt.Sprint(loadPrompt, i))
		if i%50 != 49 {
			continue
		}
		b, n := getBounded(t, s, tid)
		over := *b.PayloadBudgetExceeded
		// The projection is the body less the few bytes around it.
		if n < boundedBudget-1_000 && over || n > boundedBudget+1_000 && !over {
			t.Fatalf("%d runs, body %d bytes: payloadBudgetExceeded %v", i+1, n, over)
		}
		if over {
			return
		}
	}
}
