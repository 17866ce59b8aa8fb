package tools

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/threadview"
)

// approvalDecisions are what T3 accepts for an approval request.
var approvalDecisions = threadview.ApprovalDecisions

func answerTool(d *Deps) func(context.Context, *Call, *mcptools.AnswerInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.AnswerInput) (Result, error) {
		const tool = mcptools.ToolAnswer
		f, err := d.actOn(tool, c, in.ThreadID, "answer questions")
		if err != nil {
			return Result{}, err
		}
		m := f.Machine
		pending, ok := threadstate.PendingRequest(&f.Shell)
		if !ok || d.answered.snapshot()[pending.ID] {
			return Result{}, fmt.Errorf("%s: thread %q has no pending question (status %s); t3_wait returns reason question when it asks one", tool, f.Shell.ID, f.Shell.Status)
		}
		c.Audit.Request = pending.ID
		rec, err := m.Recent(ctx, f.Shell.ID)
		if err != nil {
			return Result{}, err
		}
		view := threadview.New(rec.Projection)
		item, found := view.Request(pending.ID)
		if !found && rec.HasMoreHistory {
			// Older than the bounded window (a request left pending a long
			// while): read the whole thread for it.
			p, err := m.Projection(ctx, f.Shell.ID)
			if err != nil {
				return Result{}, err
			}
			view = threadview.New(p)
			item, _ = view.Request(pending.ID)
		}
		if reason, ok := view.Unanswerable(pending.ID); ok {
			// T3 would accept an answer and deliver it nowhere.
			return Result{}, fmt.Errorf("%s: thread %q: request %s cannot be answered any more (T3: not_resumable, %s); stop the run with t3_interrupt, or dispatch the prompt again", tool, f.Shell.ID, pending.ID, reason)
		}
		cmd, err := buildResponse(f.Shell.ID, pending, item, *in)
		if err != nil {
			return Result{}, fmt.Errorf("%s: thread %q: %w", tool, f.Shell.ID, err)
		}
		ctx, err = d.approve(ctx, c, tool, m, answerApproval(f, pending, item, in.Answers.Value, cmd))
		if err != nil {
			return Result{}, err
		}
		if _, err := m.Dispatch(ctx, cmd); err != nil {
			return Result{}, fmt.Errorf("%s: sending the answer to thread %q on machine %q failed: %w", tool, f.Shell.ID, m.Name, err)
		}
		d.answered.add(pending.ID)
		_, st, err := d.stateAfter(ctx, f)
		if err != nil {
			return Result{}, err
		}
		return Result{Structured: &st, Text: "answer sent; call t3_wait for the outcome. " + stateText(st)}, nil
	}
}

// isApproval reports whether the pending request asks permission (answered
// with a decision) rather than a question (answered with answers).
func isApproval(pending threadstate.Pending, item *t3api.TurnItem) bool {
	return !pending.IsQuestion() || (item != nil && item.Type == "approval_request")
}

// buildResponse validates the answer against the pending request: T3 accepts
// any shape — answers sent to an approval resolve it and the run then hangs
// for good (fixture 18) — so this check is the only one there is.
func buildResponse(threadID string, pending threadstate.Pending, item *t3api.TurnItem, in mcptools.AnswerInput) (t3.Command, error) {
	answers, hasAnswers := in.Answers.Get()
	decision, hasDecision := in.Decision.Get()
	if hasAnswers && hasDecision {
		return nil, fmt.Errorf("pass either answers (a question) or decision (an approval), not both")
	}
	if isApproval(pending, item) {
		if hasDecision {
			return t3.RespondDecision(threadID, pending.ID, t3rpc.ApprovalDecision(decision)), nil
		}
		// The older form: one answer keyed by the request id, naming a
		// decision. Any other answers are refused: T3 would take them and
		// the run would never go on.
		if v, ok := answers[pending.ID]; ok && len(answers) == 1 && v.Type == mcptools.StringAnswerValue && slices.Contains(approvalDecisions, v.String) {
			return t3.RespondDecision(threadID, pending.ID, t3rpc.ApprovalDecision(v.String)), nil
		}
		return nil, fmt.Errorf("request %s asks permission (approval, %s): answer it with decision, one of %s, not with answers (T3 would accept answers and the run would then hang)", pending.ID, pending.Kind, strings.Join(approvalDecisions, ", "))
	}
	if hasDecision {
		return nil, fmt.Errorf("request %s is a question (user_input): answer it with answers (question id → answer), not with decision", pending.ID)
	}
	if len(answers) == 0 {
		return nil, fmt.Errorf("answers is empty: pass question id → answer for the pending question")
	}
	if item == nil {
		return nil, fmt.Errorf("the questions of request %q are not readable yet; call t3_thread and try again", pending.ID)
	}
	out, err := questionAnswers(item.Questions, answers)
	if err != nil {
		return nil, err
	}
	return t3.RespondAnswers(threadID, pending.ID, out), nil
}

// questionAnswers checks the answers to a question request against its
// questions (known ids, options, one answer or a list, every required one
// answered) and puts them in T3's form.
func questionAnswers(questions []t3api.Question, answers mcptools.AnswerInputAnswers) (map[string]t3rpc.AnswerValue, error) {
	byID := map[string]t3api.Question{}
	ids := make([]string, 0, len(questions))
	for _, q := range questions {
		byID[q.ID] = q
		ids = append(ids, fmt.Sprintf("%q", q.ID))
	}
	keys := make([]string, 0, len(answers))
	for k := range answers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := map[string]t3rpc.AnswerValue{}
	for _, k := range keys {
		q, ok := byID[k]
		if !ok {
			return nil, fmt.Errorf("unknown question id %q; the questions are: %s", k, strings.Join(ids, ", "))
		}
		v, err := answerTo(k, q, answers[k])
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	var missing []string
	for _, q := range questions {
		if _, ok := out[q.ID]; !ok && q.Required.Or(true) {
			missing = append(missing, fmt.Sprintf("%q", q.ID))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("missing answers to required questions: %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// answerTo checks one answer to question k: an option of it (unless it takes
// custom answers), a list only where it is multi-select.
func answerTo(k string, q t3api.Question, v mcptools.AnswerValue) (t3rpc.AnswerValue, error) {
	labels := make([]string, 0, len(q.Options))
	for _, o := range q.Options {
		labels = append(labels, o.Label)
	}
	custom := q.AllowCustomAnswer.Or(false) || len(q.Options) == 0
	check := func(s string) error {
		if strings.TrimSpace(s) == "" {
			return fmt.Errorf("the answer to question %q is empty", k)
		}
		if custom || slices.Contains(labels, s) {
			return nil
		}
		return fmt.Errorf("%q is not an option of question %q; choose one of: %s", s, k, optionList(labels))
	}
	multi := q.MultiSelect.Or(false)
	switch v.Type {
	case mcptools.StringAnswerValue:
		if err := check(v.String); err != nil {
			return t3rpc.AnswerValue{}, err
		}
		if multi {
			return t3rpc.NewStringArrayAnswerValue([]string{v.String}), nil
		}
		return t3rpc.NewStringAnswerValue(v.String), nil
	case mcptools.StringArrayAnswerValue:
		if !multi {
			return t3rpc.AnswerValue{}, fmt.Errorf("question %q takes one answer, not a list; choose one of: %s", k, optionList(labels))
		}
		if len(v.StringArray) == 0 {
			return t3rpc.AnswerValue{}, fmt.Errorf("the answer to question %q is an empty list; choose from: %s", k, optionList(labels))
		}
		for _, s := range v.StringArray {
			if err := check(s); err != nil {
				return t3rpc.AnswerValue{}, err
			}
		}
		return t3rpc.NewStringArrayAnswerValue(v.StringArray), nil
	}
	return t3rpc.AnswerValue{}, fmt.Errorf("the answer to question %q must be a string or a list of strings", k)
}

// answerApproval shows a person the request being answered and the
// answers exactly as they will be sent.
func answerApproval(f fleet.Found, pending threadstate.Pending, item *t3api.TurnItem, answers mcptools.AnswerInputAnswers, cmd t3.Command) approval {
	// (answers is nil for a decision.)
	a := approval{
		action: config.ApproveAnswer,
		details: [][2]string{
			{"project", fmt.Sprintf("%s (%s)", f.Project.Title, f.Project.WorkspaceRoot)},
			{"thread", fmt.Sprintf("%s, titled %q, now %s", f.Shell.ID, f.Shell.Title, f.Shell.Status)},
			{"request", pending.ID},
		},
		thread:   f.Shell.ID,
		commands: []t3.Command{cmd},
	}
	var b strings.Builder
	if isApproval(pending, item) {
		a.summary = "answering the agent's request for permission on thread " + f.Shell.ID
		a.bodyTitle = "The agent asks permission for:"
		asks := fmt.Sprintf("(T3 did not say more than: a %s request)", pending.Kind)
		if item != nil {
			asks = threadview.ApprovalText(item, pending.Kind)
		}
		b.WriteString(asks + "\n")
		fmt.Fprintf(&b, "\nAnswer that will be sent: %s", commandField(cmd, "decision"))
		a.body = b.String()
		return a
	}
	a.summary = "answering the agent's question on thread " + f.Shell.ID
	a.bodyTitle = "Questions, and the answers that will be sent:"
	if item != nil {
		for i, q := range item.Questions {
			question := q.Question
			if h := q.Header.Or(""); h != "" {
				question = "[" + h + "] " + question
			}
			fmt.Fprintf(&b, "%d. %s\n", i+1, question)
			if len(q.Options) > 0 {
				labels := make([]string, 0, len(q.Options))
				for _, o := range q.Options {
					labels = append(labels, o.Label)
				}
				fmt.Fprintf(&b, "   options: %s\n", strings.Join(labels, " | "))
			}
			v, ok := answers[q.ID]
			switch {
			case !ok:
				b.WriteString("   answer:  (none)\n")
			case v.Type == mcptools.StringArrayAnswerValue:
				fmt.Fprintf(&b, "   answer:  %s\n", text.QuoteList(v.StringArray)) // buildResponse refused an empty list
			default:
				fmt.Fprintf(&b, "   answer:  %q\n", v.String)
			}
		}
	}
	a.body = strings.TrimRight(b.String(), "\n")
	return a
}

// optionList lists a question's option labels for a message; a question without options takes
// free text.
func optionList(labels []string) string {
	if len(labels) == 0 {
		return "(free text)"
	}
	return text.QuoteList(labels)
}
