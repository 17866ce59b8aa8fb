// Package threadview reads a T3 thread projection the way an agent needs it:
// per run the prompt, the final reply, the tools used, the changed files and
// the error; the pending question with its choices. It renders the compact
// ThreadState that t3_thread, t3_wait, t3_answer and t3_interrupt return and
// supplies the summary, error and question of webhook events. Long texts are
// cut with a marker that says how much was cut; the raw projection never leaves.
package threadview

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// Limits bound what one rendering holds (characters, items).
type Limits struct {
	Reply, Prompt, Tool, Error, Question int
	Tools, Files                         int
}

// DefaultLimits keep a three-run ThreadState within a few KiB.
var DefaultLimits = Limits{Reply: 4000, Prompt: 1000, Tool: 200, Error: 1000, Question: 1000, Tools: 30, Files: 50}

// View indexes one projection.
type View struct {
	p     *t3api.ThreadProjection
	runs  []t3api.Run                  // by ordinal
	items map[string][]*t3api.TurnItem // by run id, by ordinal
	byReq map[string]*t3api.TurnItem   // question/approval items by request id
}

// New indexes a projection in one pass over its items.
func New(p *t3api.ThreadProjection) *View {
	v := &View{p: p, items: map[string][]*t3api.TurnItem{}, byReq: map[string]*t3api.TurnItem{}}
	v.runs = append(v.runs, p.Runs...)
	sort.SliceStable(v.runs, func(i, j int) bool { return v.runs[i].Ordinal < v.runs[j].Ordinal })
	for i := range p.TurnItems {
		it := &p.TurnItems[i]
		if run, ok := it.RunId.Get(); ok {
			v.items[run] = append(v.items[run], it)
		}
		if req, ok := it.RequestId.Get(); ok && (it.Type == "user_input_request" || it.Type == "approval_request") {
			v.byReq[req] = it
		}
	}
	for _, list := range v.items {
		sort.SliceStable(list, func(i, j int) bool { return list[i].Ordinal < list[j].Ordinal })
	}
	return v
}

// Runs returns the runs, oldest first.
func (v *View) Runs() []t3api.Run { return v.runs }

// Run finds a run by id.
func (v *View) Run(id string) (t3api.Run, bool) {
	for _, r := range v.runs {
		if r.ID == id {
			return r, true
		}
	}
	return t3api.Run{}, false
}

// RunByMessage finds the run T3 made for a user message (its userMessageId).
func (v *View) RunByMessage(messageID string) (t3api.Run, bool) {
	for _, r := range v.runs {
		if m, ok := r.UserMessageId.Get(); ok && m == messageID {
			return r, true
		}
	}
	return t3api.Run{}, false
}

// Reply is the run's final assistant text: its last assistant_message item
// (wherever in the run's node tree it sits), else its last assistant message.
func (v *View) Reply(runID string) string {
	items := v.items[runID]
	for i := len(items) - 1; i >= 0; i-- {
		if items[i].Type == "assistant_message" {
			if t, ok := items[i].Text.Get(); ok && t != "" {
				return t
			}
		}
	}
	for i := len(v.p.Messages) - 1; i >= 0; i-- {
		m := &v.p.Messages[i]
		if r, ok := m.RunId.Get(); ok && r == runID && m.Role == "assistant" && m.Text != "" {
			return m.Text
		}
	}
	return ""
}

// Prompt is the user text that started the run.
func (v *View) Prompt(runID string) string {
	for _, it := range v.items[runID] {
		if it.Type == "user_message" {
			if t, ok := it.Text.Get(); ok {
				return t
			}
		}
	}
	if r, ok := v.Run(runID); ok {
		if mid, ok := r.UserMessageId.Get(); ok {
			for i := range v.p.Messages {
				if v.p.Messages[i].ID == mid {
					return v.p.Messages[i].Text
				}
			}
		}
	}
	return ""
}

// Error is why the run failed: its last error item's failure message.
func (v *View) Error(runID string) string {
	items := v.items[runID]
	for i := len(items) - 1; i >= 0; i-- {
		if items[i].Type == "error" {
			if f, ok := items[i].Failure.Get(); ok {
				if c, ok := f.Class.Get(); ok && c != "" {
					return c + ": " + f.Message
				}
				return f.Message
			}
		}
	}
	return ""
}

// toolNames summarizes the tools the run used, in order.
func (v *View) toolNames(runID string) []string {
	var out []string
	for _, it := range v.items[runID] {
		if s := toolSummary(it); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func toolSummary(it *t3api.TurnItem) string {
	switch it.Type {
	case "command_execution":
		in, _ := it.Input.Get()
		s := "ran `" + oneLine(in) + "`"
		if c, ok := it.ExitCode.Get(); ok {
			s += fmt.Sprintf(" (exit %d)", c)
		} else if st, ok := it.Status.Get(); ok && st != "completed" {
			s += " (" + st + ")"
		}
		return s
	case "file_change":
		name, _ := it.FileName.Get()
		s := "edited " + name
		a, aok := it.Additions.Get()
		d, dok := it.Deletions.Get()
		if aok || dok {
			s += fmt.Sprintf(" +%d −%d", a, d)
		}
		return s
	case "file_search", "web_search":
		q, _ := it.Query.Get()
		if q == "" {
			q, _ = it.Title.Get()
		}
		what := "searched files"
		if it.Type == "web_search" {
			what = "searched the web"
		}
		if q != "" {
			return what + " for " + oneLine(q)
		}
		return what
	case "dynamic_tool", "subagent":
		t, _ := it.Title.Get()
		if t == "" {
			t = it.Type
		}
		return "used " + oneLine(t)
	}
	return ""
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// changedFiles lists the files the run changed: from the run's checkpoint
// when T3 captured one, else from its file_change items.
func (v *View) changedFiles(runID string) []t3api.ChangedFile {
	r, _ := v.Run(runID)
	cpID, _ := r.CheckpointId.Get()
	for _, c := range v.p.Checkpoints {
		cr, _ := c.RunId.Get()
		if (cpID != "" && c.ID == cpID) || (cr != "" && cr == runID) {
			if len(c.Files) > 0 {
				return c.Files
			}
		}
	}
	for _, it := range v.items[runID] {
		if it.Type == "checkpoint" && len(it.Files) > 0 {
			return it.Files
		}
	}
	var out []t3api.ChangedFile
	seen := map[string]int{}
	for _, it := range v.items[runID] {
		if it.Type != "file_change" {
			continue
		}
		name, _ := it.FileName.Get()
		if name == "" {
			continue
		}
		a, _ := it.Additions.Get()
		d, _ := it.Deletions.Get()
		if i, ok := seen[name]; ok {
			out[i].Additions.SetTo(out[i].Additions.Or(0) + a)
			out[i].Deletions.SetTo(out[i].Deletions.Or(0) + d)
			continue
		}
		seen[name] = len(out)
		out = append(out, t3api.ChangedFile{Path: name, Kind: t3api.NewOptString("modified"), Additions: t3api.NewOptInt64(a), Deletions: t3api.NewOptInt64(d)})
	}
	return out
}

// Request finds the pending-request item (question or approval) by id.
func (v *View) Request(requestID string) (*t3api.TurnItem, bool) {
	it, ok := v.byReq[requestID]
	return it, ok
}

// Unanswerable reports whether T3 can no longer deliver an answer to a
// runtime request (its responseCapability is not_resumable), and why: such a
// request is reported, never answered.
func (v *View) Unanswerable(requestID string) (reason string, ok bool) {
	for _, r := range v.p.RuntimeRequests {
		if r.ID != requestID {
			continue
		}
		c, set := r.ResponseCapability.Get()
		if !set || c.Type != notResumable {
			return "", false
		}
		if reason = c.Reason.Or(""); reason == "" {
			reason = "the agent session that asked is gone"
		}
		return reason, true
	}
	return "", false
}

// notResumable is the responseCapability type of a request T3 can no longer
// deliver an answer to.
const notResumable = "not_resumable"

// ApprovalDecisions are what an approval request is answered with (T3's
// closed set; cancel also ends the run cancelled).
var ApprovalDecisions = []string{"accept", "acceptForSession", "decline", "cancel"}

// cutter cuts texts to limits and records what it cut.
type cutter struct{ notes []mcptools.TruncationNote }

func (c *cutter) cut(field, s string, max int) string {
	if max <= 0 || utf8.RuneCountInString(s) <= max {
		return s
	}
	cut := utf8.RuneCountInString(s) - max
	c.notes = append(c.notes, mcptools.TruncationNote{Field: field, CutChars: cut})
	return text.Runes(s, max) + fmt.Sprintf("%s [%d characters cut]", text.Ellipsis, cut)
}

// Cut shortens s to max characters with a marker saying how much was cut.
func Cut(s string, max int) string {
	var c cutter
	return c.cut("", s, max)
}

// Meta is what the projection does not say about the thread.
type Meta struct {
	Machine string
	Project mcptools.ProjectRef
	// Status is the shell row's status (fresher than the projection's runs).
	Status string
	// PendingRequestID from the shell row; "" when none.
	PendingRequestID string
	PendingKind      string
}

// Render builds the ThreadState of the last `turns` runs.
func (v *View) Render(m Meta, turns int, lim Limits) mcptools.ThreadState {
	var c cutter
	st := mcptools.ThreadState{
		ThreadID: v.p.Thread.ID,
		Machine:  m.Machine,
		Project:  m.Project,
		Title:    v.p.Thread.Title,
		Status:   m.Status,
		Runs:     []mcptools.RunSummary{},
	}
	st.RunCount.SetTo(len(v.runs))
	if st.Status == "" {
		st.Status = "idle"
		if n := len(v.runs); n > 0 {
			st.Status = v.runs[n-1].Status
		}
	}
	if n := len(v.runs); n > 0 {
		st.LatestRun.SetTo(v.latestRun(&c, v.runs[n-1], lim))
	}
	if turns <= 0 {
		turns = 3
	}
	first := max(0, len(v.runs)-turns)
	for i, r := range v.runs[first:] {
		st.Runs = append(st.Runs, v.runSummary(&c, fmt.Sprintf("runs[%d]", i), r, lim))
	}
	if m.PendingRequestID != "" {
		if q, ok := v.PendingQuestion(m.PendingRequestID, m.PendingKind, lim, &c); ok {
			st.PendingQuestion.SetTo(q)
		}
	}
	if len(c.notes) > 0 {
		st.Truncated = c.notes
	}
	return st
}

// latestRun is the thread's latest run: its status, times and error.
func (v *View) latestRun(c *cutter, r t3api.Run, lim Limits) mcptools.LatestRun {
	lr := mcptools.LatestRun{ID: r.ID, Status: r.Status}
	if s, ok := r.StartedAt.Get(); ok {
		lr.StartedAt.SetTo(s)
	}
	if s, ok := r.CompletedAt.Get(); ok {
		lr.CompletedAt.SetTo(s)
	}
	if e := v.Error(r.ID); e != "" {
		lr.Error.SetTo(c.cut("latest_run.error", e, lim.Error))
	}
	return lr
}

// runSummary is one run of Runs (field is its path in the result, for truncation notes): prompt,
// reply and error cut to the limits, its tools and changed files up to theirs.
func (v *View) runSummary(c *cutter, field string, r t3api.Run, lim Limits) mcptools.RunSummary {
	rs := mcptools.RunSummary{RunID: r.ID, Status: r.Status, Tools: []string{}, ChangedFiles: []mcptools.ChangedFile{}}
	if s := v.Prompt(r.ID); s != "" {
		rs.Prompt.SetTo(c.cut(field+".prompt", s, lim.Prompt))
	}
	if s := v.Reply(r.ID); s != "" {
		rs.Reply.SetTo(c.cut(field+".reply", s, lim.Reply))
	}
	if s := v.Error(r.ID); s != "" {
		rs.Error.SetTo(c.cut(field+".error", s, lim.Error))
	}
	tools := v.toolNames(r.ID)
	if len(tools) > lim.Tools {
		c.notes = append(c.notes, mcptools.TruncationNote{Field: field + ".tools", CutChars: len(tools) - lim.Tools})
		tools = append(tools[:lim.Tools:lim.Tools], fmt.Sprintf("… and %d more", len(tools)-lim.Tools))
	}
	for j, t := range tools {
		rs.Tools = append(rs.Tools, c.cut(fmt.Sprintf("%s.tools[%d]", field, j), t, lim.Tool))
	}
	files := v.changedFiles(r.ID)
	if len(files) > lim.Files {
		c.notes = append(c.notes, mcptools.TruncationNote{Field: field + ".changed_files", CutChars: len(files) - lim.Files})
		files = files[:lim.Files]
	}
	for _, f := range files {
		cf := mcptools.ChangedFile{Path: f.Path}
		if k, ok := f.Kind.Get(); ok {
			cf.Kind.SetTo(k)
		}
		if a, ok := f.Additions.Get(); ok {
			cf.Additions.SetTo(int(a))
		}
		if d, ok := f.Deletions.Get(); ok {
			cf.Deletions.SetTo(int(d))
		}
		rs.ChangedFiles = append(rs.ChangedFiles, cf)
	}
	return rs
}

// ApprovalText says what an approval request asks permission for, from its
// approval_request item: the kind of request and the command or change in
// its prompt (T3 lists no options for it), e.g. "command: cat package.json".
func ApprovalText(it *t3api.TurnItem, kind string) string {
	what, _ := it.RequestKind.Get()
	if what == "" {
		what = kind
	}
	if what == "" {
		what = "permission"
	}
	var parts []string
	for _, s := range []string{it.Prompt.Or(""), it.Input.Or("")} {
		if s = strings.TrimSpace(s); s != "" && !slices.Contains(parts, s) {
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		if t := strings.TrimSpace(it.Title.Or("")); t != "" {
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return "the agent asks permission for a " + what + " request (T3 did not say more)"
	}
	return "the agent asks permission (" + what + "): " + strings.Join(parts, "\n")
}

// PendingQuestion renders a pending request with its questions and choices.
func (v *View) PendingQuestion(requestID, kind string, lim Limits, c *cutter) (mcptools.PendingQuestion, bool) {
	if c == nil {
		c = &cutter{}
	}
	pq := mcptools.PendingQuestion{RequestID: requestID, Kind: mcptools.QuestionKindUserInput, Questions: []mcptools.Question{}}
	if kind != "" && kind != "user_input" {
		pq.Kind = mcptools.QuestionKindApproval
	}
	if reason, ok := v.Unanswerable(requestID); ok {
		pq.Answerable.SetTo(false)
		pq.NotAnswerableReason.SetTo(c.cut("pending_question.not_answerable_reason", reason, lim.Question))
	}
	it, ok := v.Request(requestID)
	if !ok {
		return pq, kind != ""
	}
	if it.Type == "approval_request" || pq.Kind == mcptools.QuestionKindApproval {
		pq.Kind = mcptools.QuestionKindApproval
		pq.Questions = append(pq.Questions, mcptools.Question{
			ID: requestID, Text: c.cut("pending_question.text", ApprovalText(it, kind), lim.Question),
			Options: append([]string(nil), ApprovalDecisions...),
		})
		return pq, true
	}
	for i, q := range it.Questions {
		mq := mcptools.Question{ID: q.ID, Text: c.cut(fmt.Sprintf("pending_question.questions[%d].text", i), q.Question, lim.Question), Options: []string{}}
		if h, ok := q.Header.Get(); ok {
			mq.Header.SetTo(h)
		}
		for _, o := range q.Options {
			mq.Options = append(mq.Options, o.Label)
		}
		if ms, ok := q.MultiSelect.Get(); ok {
			mq.MultiSelect.SetTo(ms)
		}
		if ac, ok := q.AllowCustomAnswer.Get(); ok {
			mq.AllowCustom.SetTo(ac)
		}
		if rq, ok := q.Required.Get(); ok {
			mq.Required.SetTo(rq)
		}
		pq.Questions = append(pq.Questions, mq)
	}
	return pq, true
}
