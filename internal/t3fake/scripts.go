package t3fake

import (
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Script describes one scripted run, for the package doc and for the demo to print.
type Script struct {
	Name  string   // default, question, hang, fail
	Words []string // a prompt word starting with one of these chooses the script; none for default
	Steps string   // what the run does, one line
}

// scripts is the source of truth; Scripts is a copy for callers, so editing it cannot change
// which script a prompt picks.
var scripts = [...]Script{
	{Name: "default", Steps: "starting → running → command_execution (go test ./..., exit 0) → file_change README.md (+3 −1) → " +
		"assistant reply \"Done: <first 60 chars of the prompt>\" → waiting → checkpoint (README.md modified +3 −1) → completed"},
	{Name: "question", Words: []string{"question"}, Steps: "starting → running → pending user_input request with two questions " +
		"(scope: Workspace|Session; checks: multiSelect lint|test), shell pendingRuntimeRequest set; after runtime-request.respond " +
		"→ reply \"Done: <prompt>. Answers: checks=…; scope=…\" → waiting → checkpoint → completed"},
	{Name: "hang", Words: []string{"hang", "forever"}, Steps: "starting → running → a command that never ends; " +
		"run.interrupt → run_interrupt_request, run_interrupt_result → interrupted"},
	{Name: "fail", Words: []string{"fail"}, Steps: "starting → running → error turn item {failure: {class: provider_error, " +
		"message: \"Simulated provider failure: <prompt>\"}} → failed"},
	{Name: "approval", Words: []string{"approv", "permission"}, Steps: "starting → running → command_execution " +
		"`cat server/package.json` (running) and a pending command approval (fixture 18: approval_request item with requestKind " +
		"command and the command as prompt, no options); decision accept/acceptForSession → command completes, decline → approval " +
		"cancelled, the run goes on: reply → waiting → checkpoint → completed; cancel → run cancelled; answers instead of a " +
		"decision resolve it and the run hangs until run.interrupt (as T3 does)"},
	{Name: "elicitation", Words: []string{"elicit"}, Steps: "starting → running → a form elicitation as a user_input request " +
		"(fixture 19: one question approved, \"Approve this request?\", options true|false) → after the answer: reply → waiting → " +
		"checkpoint → completed"},
	{Name: "stale", Words: []string{"stale"}, Steps: "starting → running → a user_input request whose responseCapability is " +
		"not_resumable (the provider session that asked is gone): answering it fails; only run.interrupt ends the run"},
}

// Scripts lists the scripted runs in the order they are matched (default matches when no other
// does). It is a copy: changing it does not change how prompts are matched.
var Scripts = func() []Script {
	out := make([]Script, len(scripts))
	for i, sc := range scripts {
		sc.Words = append([]string(nil), sc.Words...)
		out[i] = sc
	}
	return out
}()

type scriptKind int

const (
	scriptDefault scriptKind = iota
	scriptQuestion
	scriptHang
	scriptFail
	scriptApproval
	scriptElicitation
	scriptStale
	scriptSeeded // a run made by AddThread: no steps, waits for run.interrupt
)

// chooseScript picks the first script (after default) with a word that some word of the prompt
// starts with; "Failing" picks fail, "questions" picks question.
func chooseScript(prompt string) scriptKind {
	words := strings.FieldsFunc(strings.ToLower(prompt), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	for i := 1; i < len(scripts); i++ {
		for _, w := range scripts[i].Words {
			for _, pw := range words {
				if strings.HasPrefix(pw, w) {
					return scriptKind(i)
				}
			}
		}
	}
	return scriptDefault
}

// promptFacts is what the fake derives from a prompt: its script and the excerpt a reply quotes.
type promptFacts struct {
	kind    scriptKind
	excerpt string
}

// maxPromptFacts bounds Server.prompts; the load harness uses three prompts, tests a few dozen.
const maxPromptFacts = 256

// facts returns prompt's facts, remembered: splitting a 200-character prompt into words for
// every run was a visible part of the fake's cost under load. Callers hold Server.mu.
func (s *Server) facts(prompt string) promptFacts {
	if prompt == s.lastPrompt && prompt != "" {
		return s.lastFacts
	}
	f, ok := s.prompts[prompt]
	if !ok {
		f = promptFacts{kind: chooseScript(prompt), excerpt: excerpt(prompt, 60)}
		if len(s.prompts) >= maxPromptFacts {
			clear(s.prompts)
		}
		s.prompts[prompt] = f
	}
	s.lastPrompt, s.lastFacts = prompt, f
	return f
}

func (s *Server) scriptOf(prompt string) scriptKind { return s.facts(prompt).kind }

func (s *Server) promptExcerpt(prompt string) string { return s.facts(prompt).excerpt }

// ScriptFor names the script a prompt would run.
func ScriptFor(prompt string) string { return scripts[chooseScript(prompt)].Name }

type stepResult int

const (
	stepNext stepResult = iota // schedule the following step
	stepPark                   // wait for a command (an answer or an interrupt)
	stepDone                   // the run is over
)

type stepFunc func(s *Server, r *run) stepResult

var scriptSteps = map[scriptKind][]stepFunc{
	scriptDefault:  {stepRunning, stepCommandStart, stepCommandDone, stepFileChange, stepReply, stepWaiting, stepComplete},
	scriptQuestion: {stepRunning, stepAsk, stepReply, stepWaiting, stepComplete},
	scriptHang:     {stepRunning, stepHang},
	scriptFail:     {stepRunning, stepFail},
	// After the decision: the command ends, then the run goes on as the mock did.
	scriptApproval:    {stepRunning, stepApprove, stepCommandDone, stepReply, stepWaiting, stepComplete},
	scriptElicitation: {stepRunning, stepElicit, stepReply, stepWaiting, stepComplete},
	scriptStale:       {stepRunning, stepAskStale},
}

type runState int

const (
	runQueued runState = iota // in readyQ
	runParked                 // waiting for a command
	runDone
)

type run struct {
	th       *thread
	rec      t3rpc.Run
	kind     scriptKind
	prompt   string
	steps    []stepFunc
	idx      int
	state    runState
	readyAt  time.Time
	nextItem int64

	esc          string              // escapedID's cache
	itemIDs      []string            // ids of the items putNewItem added for this run
	files        []t3rpc.ChangedFile // what the checkpoint lists
	commandItem  string              // the command_execution item while it runs
	requestID    string              // the runtime request while pending
	requests     []string            // every runtime request of the run, for pruning
	questionItem string
	answers      map[string][]string
	interrupting bool
	interruptReq string     // the run_interrupt_request item
	provision    *provision // a worktree launch's run: what stepProvision does first
}

// escapedID is the run id as nested in item, message and request ids (pathEscapeColons),
// made once per run.
func (r *run) escapedID() string {
	if r.esc == "" {
		r.esc = pathEscapeColons(r.rec.ID)
	}
	return r.esc
}

// interruptible matches T3's refusal text "Run … is not interruptible." for the rest.
func (r *run) interruptible() bool {
	if r.interrupting || r.state == runDone {
		return false
	}
	switch r.rec.Status {
	case "preparing", "queued", "starting", "running", "waiting":
		return true
	}
	return false
}

// startRun creates run n+1 of th for a user message, emits what T3 emits when message.dispatch
// is accepted (run.created, the user message and its turn item, the shell row) and schedules the
// script. launched runs (launchThread) start in preparing, as T3's do.
//
// serverMessage says the message id was made by the fake (StartRun): it is new, so its message
// and item are appended without a search.
func (s *Server) startRun(th *thread, messageID, text string, model t3rpc.OptModelSelection, launched, serverMessage bool) *run {
	th.runCount++ // not len(th.runs): pruning shortens it, ordinals must not repeat
	ordinal := th.runCount
	id := fmt.Sprintf("run:thread:%s:ordinal:%d", th.id, ordinal)
	if !model.Set {
		model = th.app.ModelSelection
	}
	status := "starting"
	if launched {
		status = "preparing"
	}
	// A busy thread queues the run behind the active one (recorded, 21).
	queue := th.active != nil
	if queue {
		status = "queued"
	}
	ts := s.touch(th)
	r := &run{th: th, prompt: text, kind: s.scriptOf(text)}
	r.rec = t3rpc.Run{
		ID:             id,
		ThreadId:       th.id,
		Ordinal:        ordinal,
		UserMessageId:  optNilStr(messageID),
		Status:         status,
		ModelSelection: model,
		RequestedAt:    optNilStr(ts),
		StartedAt:      null(),
		CompletedAt:    null(),
		CheckpointId:   null(),
	}
	r.steps = scriptSteps[r.kind]
	if launched {
		r.steps = append([]stepFunc{stepStarting}, r.steps...)
	}
	th.runs = append(th.runs, r)
	if queue {
		th.queued = append(th.queued, r)
		r.state = runParked
	} else {
		th.active = r
	}
	s.emit(th, id, "run.created", copyOf(r.rec))

	msg := t3rpc.Message{
		ID: messageID, ThreadId: optStr(th.id), RunId: optNilStr(id), Role: "user", Text: text,
		Streaming: t3rpc.NewOptBool(false), CreatedAt: optStr(ts), UpdatedAt: optStr(ts),
	}
	if serverMessage {
		th.messages = append(th.messages, msg)
	} else {
		th.upsertMessage(msg)
	}
	s.emit(th, id, "message.updated", &msg)

	it := s.newItem(r, "", "user_message", "completed", "", true)
	it.ID = "turn-item:message:" + messageID // T3's id for a user message item
	it.MessageId = optStr(messageID)
	it.Text = optStr(text)
	if serverMessage {
		s.putNewItem(r, it)
	} else {
		s.putItem(r, it)
	}

	th.shell.Status = status
	th.shell.LatestRunId = optNilStr(id)
	th.shell.LatestRunRequestedAt = optNilStr(ts)
	th.shell.LatestRunStartedAt = null()
	th.shell.LatestRunCompletedAt = null()
	th.shell.LatestVisibleMessage = t3rpc.NewOptNilVisibleMessage(t3rpc.VisibleMessage{
		ID: messageID, Role: "user", Text: text, UpdatedAt: optStr(ts),
	})
	if queue {
		// The active run keeps its pointer and any question it asks.
		s.publishShell(th)
		return r
	}
	th.shell.ActiveRunId = optNilStr(id)
	th.shell.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	s.publishShell(th)
	s.schedule(r)
	return r
}

// seedRun gives an AddThread thread one run in status, without items or script.
func (s *Server) seedRun(th *thread, status string) {
	th.runCount++ // not len(th.runs): pruning shortens it, ordinals must not repeat
	ordinal := th.runCount
	id := fmt.Sprintf("run:thread:%s:ordinal:%d", th.id, ordinal)
	ts := s.touch(th)
	r := &run{th: th, kind: scriptSeeded, state: runParked}
	r.rec = t3rpc.Run{
		ID: id, ThreadId: th.id, Ordinal: ordinal, UserMessageId: null(), Status: status,
		ModelSelection: th.app.ModelSelection, RequestedAt: optNilStr(ts), StartedAt: null(),
		CompletedAt: null(), CheckpointId: null(),
	}
	th.shell.Status = status
	th.shell.LatestRunId = optNilStr(id)
	th.shell.LatestRunRequestedAt = optNilStr(ts)
	switch status {
	case "preparing", "queued", "starting", "running", "waiting":
		th.active = r
		th.shell.ActiveRunId = optNilStr(id)
		if status != "preparing" && status != "queued" && status != "starting" {
			r.rec.StartedAt = optNilStr(ts)
			th.shell.LatestRunStartedAt = optNilStr(ts)
		}
	default:
		r.state = runDone
		r.rec.StartedAt = optNilStr(ts)
		r.rec.CompletedAt = optNilStr(ts)
		th.shell.LatestRunStartedAt = optNilStr(ts)
		th.shell.LatestRunCompletedAt = optNilStr(ts)
	}
	th.runs = append(th.runs, r)
	s.emit(th, id, "run.created", copyOf(r.rec))
	s.publishShell(th)
}

// ---- scheduling ----

func (s *Server) schedule(r *run) {
	r.state = runQueued
	r.readyAt = time.Now().Add(s.stepDelay)
	s.readyQ = append(s.readyQ, r)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// advance runs r's next step. Runs share one delay, so readyQ stays in readyAt order by
// appending: no heap needed.
func (s *Server) advance(r *run) {
	if r.state != runQueued || r.idx >= len(r.steps) {
		return
	}
	r.th.mu.Lock()
	defer r.th.mu.Unlock()
	switch r.steps[r.idx](s, r) {
	case stepNext:
		r.idx++
		s.schedule(r)
	case stepPark:
		r.idx++
		r.state = runParked
	case stepDone:
		r.state = runDone
	}
}

// scheduler paces runs in automatic mode: it sleeps until the oldest queued run is due, then runs
// one step under the lock. One goroutine for every run keeps steps of all runs in one order and
// costs nothing while idle.
func (s *Server) scheduler() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return
		}
		if len(s.readyQ) == 0 {
			s.mu.Unlock()
			select {
			case <-s.wake:
			case <-s.stop:
				return
			}
			continue
		}
		r := s.readyQ[0]
		if d := time.Until(r.readyAt); d > 0 {
			s.mu.Unlock()
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-s.stop:
				return
			}
			continue
		}
		s.readyQ[0] = nil
		s.readyQ = s.readyQ[1:]
		s.advance(r)
		s.mu.Unlock()
	}
}

// Step runs the next due script step of the oldest queued run, ignoring StepDelay, and reports
// whether there was one. With Options.ManualSteps it is the only thing that moves runs, which lets
// a test observe every intermediate state. A run parked on a question or hanging until interrupted
// is not queued: Step returns false once nothing but such runs is left.
func (s *Server) Step() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.readyQ) == 0 {
		return false
	}
	r := s.readyQ[0]
	s.readyQ[0] = nil
	s.readyQ = s.readyQ[1:]
	s.advance(r)
	return true
}

// StepAll calls Step until no step is due and returns how many ran: every queued run reaches its
// end or its next wait.
func (s *Server) StepAll() int {
	n := 0
	for s.Step() {
		n++
	}
	return n
}

// Pending is the number of runs waiting for their next step.
func (s *Server) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.readyQ)
}

// ---- steps ----

func (s *Server) newItem(r *run, key, typ, status, title string, done bool) t3rpc.TurnItem {
	r.nextItem++
	ts := s.ts()
	it := t3rpc.TurnItem{
		ID:           "turn-item:run:" + r.escapedID() + ":" + key,
		Type:         typ,
		ThreadId:     optStr(r.th.id),
		RunId:        optNilStr(r.rec.ID),
		ParentItemId: null(),
		Ordinal:      r.rec.Ordinal*1_000_000 + r.nextItem, // T3 numbers items 1000001, 1000002, … per run
		Status:       optStr(status),
		Title:        strOrNull(title),
		StartedAt:    optNilStr(ts),
		CompletedAt:  null(),
		UpdatedAt:    optNilStr(ts),
	}
	if done {
		it.CompletedAt = optNilStr(ts)
	}
	return it
}

func (s *Server) putItem(r *run, it t3rpc.TurnItem) {
	r.th.upsertItem(&it) // it is this call's copy: the thread and the event share it
	s.emit(r.th, r.rec.ID, "turn-item.updated", &it)
}

// putNewItem is putItem for an item newItem made for r: its id names r, so only r's own item ids
// (a handful, kept in r.itemIDs) are searched, not every item of the thread, which under load was
// a large part of a step. A key used twice in one run (a steered run can repeat a step) still
// replaces the first item, as putItem would.
func (s *Server) putNewItem(r *run, it t3rpc.TurnItem) {
	if slices.Contains(r.itemIDs, it.ID) {
		s.putItem(r, it)
		return
	}
	r.itemIDs = append(r.itemIDs, it.ID)
	r.th.addItem(&it)
	s.emit(r.th, r.rec.ID, "turn-item.updated", &it)
}

func (s *Server) putRun(r *run) { s.emit(r.th, r.rec.ID, "run.updated", copyOf(r.rec)) }

// finishItem marks an existing item done with status, keeping its start time.
func (s *Server) finishItem(r *run, id, status string, edit func(*t3rpc.TurnItem)) {
	it, ok := r.th.item(id)
	if !ok {
		return
	}
	ts := s.ts()
	it.Status = optStr(status)
	it.CompletedAt = optNilStr(ts)
	it.UpdatedAt = optNilStr(ts)
	if edit != nil {
		edit(&it)
	}
	s.putItem(r, it)
}

func stepStarting(s *Server, r *run) stepResult {
	s.touch(r.th)
	r.rec.Status = "starting"
	s.putRun(r)
	r.th.rowStatus(r, "starting")
	s.publishShell(r.th)
	return stepNext
}

func stepRunning(s *Server, r *run) stepResult {
	ts := s.touch(r.th)
	r.rec.Status = "running"
	r.rec.StartedAt = optNilStr(ts)
	s.putRun(r)
	r.th.rowStatus(r, "running")
	r.th.shell.LatestRunStartedAt = optNilStr(ts)
	s.publishShell(r.th)
	return stepNext
}

func stepCommandStart(s *Server, r *run) stepResult {
	s.startCommand(r, "Run tests", "go test ./...")
	return stepNext
}

// startCommand starts r's command item (title, the command line input) and publishes the row.
func (s *Server) startCommand(r *run, title, input string) {
	s.touch(r.th)
	it := s.newItem(r, "command:1", "command_execution", "running", title, false)
	it.Input = optStr(input)
	r.commandItem = it.ID
	s.putNewItem(r, it)
	s.publishShell(r.th)
}

func stepCommandDone(s *Server, r *run) stepResult {
	s.touch(r.th)
	s.finishItem(r, r.commandItem, "completed", func(it *t3rpc.TurnItem) {
		it.ExitCode = t3rpc.NewOptNilInt64(0)
	})
	r.commandItem = ""
	s.publishShell(r.th)
	return stepNext
}

func stepFileChange(s *Server, r *run) stepResult {
	s.touch(r.th)
	it := s.newItem(r, "file-change:1", "file_change", "completed", "Edit README.md", true)
	it.FileName = optStr("README.md")
	it.Additions = t3rpc.NewOptNilInt64(3)
	it.Deletions = t3rpc.NewOptNilInt64(1)
	r.files = append(r.files, t3rpc.ChangedFile{
		Path: "README.md", Kind: optStr("modified"), Additions: optI64(3), Deletions: optI64(1),
	})
	s.putNewItem(r, it)
	s.publishShell(r.th)
	return stepNext
}

// replyText is the assistant's answer: readable, and derived only from the prompt and answers.
func (s *Server) replyText(r *run) string {
	text := "Done: " + s.promptExcerpt(r.prompt)
	if r.answers != nil {
		parts := make([]string, 0, len(r.answers))
		for _, q := range sortedKeys(r.answers) {
			parts = append(parts, q+"="+strings.Join(r.answers[q], ", "))
		}
		text += ". Answers: " + strings.Join(parts, "; ")
	}
	return text
}

func stepReply(s *Server, r *run) stepResult {
	ts := s.touch(r.th)
	text := s.replyText(r)
	msgID := "message:run:" + r.escapedID() + ":assistant"
	msg := t3rpc.Message{
		ID: msgID, ThreadId: optStr(r.th.id), RunId: optNilStr(r.rec.ID), Role: "assistant", Text: text,
		Streaming: t3rpc.NewOptBool(false), CreatedAt: optStr(ts), UpdatedAt: optStr(ts),
	}
	r.th.upsertMessage(msg)
	s.emit(r.th, r.rec.ID, "message.updated", &msg)
	it := s.newItem(r, "assistant:1", "assistant_message", "completed", "", true)
	it.MessageId = optStr(msgID)
	it.Text = optStr(text)
	it.Streaming = t3rpc.NewOptBool(false)
	s.putNewItem(r, it)
	r.th.shell.LatestVisibleMessage = t3rpc.NewOptNilVisibleMessage(t3rpc.VisibleMessage{
		ID: msgID, Role: "assistant", Text: text, UpdatedAt: optStr(ts),
	})
	s.publishShell(r.th)
	return stepNext
}

// stepWaiting: the agent's turn is over, the checkpoint is not captured yet. T3's shell drops
// activeRunId here already (recorded), while the thread stays busy.
func stepWaiting(s *Server, r *run) stepResult {
	s.touch(r.th)
	r.rec.Status = "waiting"
	s.putRun(r)
	r.th.rowStatus(r, "waiting")
	r.th.shell.ActiveRunId = null()
	s.publishShell(r.th)
	return stepNext
}

func stepComplete(s *Server, r *run) stepResult {
	ts := s.touch(r.th)
	files := append([]t3rpc.ChangedFile{}, r.files...)
	cp := t3rpc.Checkpoint{
		ID:         fmt.Sprintf("checkpoint:thread:%s:run:%d", pathEscapeColons(r.th.id), r.rec.Ordinal),
		RunId:      optNilStr(r.rec.ID),
		Status:     "ready",
		Files:      files,
		CapturedAt: optNilStr(ts),
	}
	r.th.checkpoints = append(r.th.checkpoints, cp)
	s.emit(r.th, r.rec.ID, "checkpoint.captured", &cp)
	it := s.newItem(r, "checkpoint:1", "checkpoint", "completed", "", true)
	it.Files = files
	s.putNewItem(r, it)
	r.rec.Status = "completed"
	r.rec.CompletedAt = optNilStr(ts)
	r.rec.CheckpointId = optNilStr(cp.ID)
	s.putRun(r)
	s.settle(r, "completed", ts)
	return stepDone
}

// settle puts the shell of a run that ended.
func (s *Server) settle(r *run, status, ts string) {
	th := r.th
	if th.active == r {
		th.active = nil
	}
	th.rowStatus(r, s.threadFaults.settledStatus(th.id, status))
	th.shell.ActiveRunId = null()
	if th.newest() == r {
		th.shell.LatestRunCompletedAt = optNilStr(ts)
	}
	th.shell.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	s.publishShell(th)
	s.pruneRuns(th)
	s.startNext(th)
}

// startNext starts the oldest queued run once nothing is active: after
// run.interrupt or a run's end, T3 starts the queued runs by itself (21).
func (s *Server) startNext(th *thread) {
	if th.active != nil || len(th.queued) == 0 {
		return
	}
	r := th.queued[0]
	th.queued = th.queued[1:]
	th.active = r
	s.touch(th)
	r.rec.Status = "starting"
	s.putRun(r)
	th.shell.ActiveRunId = optNilStr(r.rec.ID)
	th.rowStatus(r, "starting")
	s.publishShell(th)
	s.schedule(r)
}

// cancelQueued is queued-run.cancel: the run leaves the queue, cancelled.
func (s *Server) cancelQueued(th *thread, runID string) bool {
	for i, r := range th.queued {
		if r.rec.ID != runID {
			continue
		}
		th.queued = append(th.queued[:i], th.queued[i+1:]...)
		ts := s.touch(th)
		r.state = runDone
		r.rec.Status = "cancelled"
		r.rec.CompletedAt = optNilStr(ts)
		s.putRun(r)
		th.rowStatus(r, "cancelled") // recorded: the row says cancelled while run 1 runs on
		s.publishShell(th)
		return true
	}
	return false
}

// questions are what the question script asks: one single-select, one multi-select question.
func questions() []t3rpc.Question {
	return []t3rpc.Question{
		{
			ID: "scope", Header: optStr("Scope"), Question: "Which scope should I use?",
			Options: []t3rpc.QuestionOption{
				{Label: "Workspace", Description: optStr("Use the current workspace")},
				{Label: "Session", Description: optStr("Only use this session")},
			},
		},
		{
			ID: "checks", Header: optStr("Checks"), Question: "Which checks should I run?",
			Options: []t3rpc.QuestionOption{
				{Label: "lint", Description: optStr("Run the linters")},
				{Label: "test", Description: optStr("Run the test suite")},
			},
			MultiSelect: t3rpc.NewOptBool(true),
		},
	}
}

// elicitationQuestions is what a form elicitation becomes (recorded, 19).
func elicitationQuestions() []t3rpc.Question {
	return []t3rpc.Question{{
		ID: "approved", Header: optStr("Approved"), Question: "Approve this request?",
		Options: []t3rpc.QuestionOption{{Label: "true"}, {Label: "false"}},
	}}
}

// ApprovalCommand is the command the approval script asks permission for (fixture 18's).
const ApprovalCommand = "cat server/package.json"

// NotResumableReason is the reason the stale script's request gives.
const NotResumableReason = "provider session ended before the request was answered"

func stepAsk(s *Server, r *run) stepResult {
	return s.ask(r, "user_input", questions(), "live")
}

func stepElicit(s *Server, r *run) stepResult {
	return s.ask(r, "user_input", elicitationQuestions(), "live")
}

func stepAskStale(s *Server, r *run) stepResult {
	return s.ask(r, "user_input", questions(), "not_resumable")
}

// stepApprove starts the command the agent wants to run and asks permission
// for it, as fixture 18 recorded: kind command, the command in the item's
// prompt, no options; the row's status stays running.
func stepApprove(s *Server, r *run) stepResult {
	s.touch(r.th)
	it := s.newItem(r, "command:1", "command_execution", "running", "Terminal", false)
	it.Input = optStr(ApprovalCommand)
	r.commandItem = it.ID
	s.putNewItem(r, it)
	return s.ask(r, "command", nil, "live")
}

// ask raises a pending runtime request of kind for r: a user_input request
// with questions, or an approval (any other kind) whose approval_request item
// names the command. capability is the request's responseCapability type.
func (s *Server) ask(r *run, kind string, qs []t3rpc.Question, capability string) stepResult {
	ts := s.touch(r.th)
	esc := r.escapedID()
	rc := t3rpc.ResponseCapability{Type: capability}
	if capability == "live" {
		// The provider session waits for the answer, as in every recorded request (18, 19).
		rc.ProviderSessionId = optStr("provider-session:" + esc)
	} else {
		rc.Reason = optStr(NotResumableReason)
	}
	rr := t3rpc.RuntimeRequest{
		ID:                 fmt.Sprintf("runtime-request:run:%s:question:1", esc),
		NodeId:             optNilStr(fmt.Sprintf("node:run:%s:question:1", esc)),
		Kind:               kind,
		Status:             "pending",
		ResponseCapability: t3rpc.NewOptResponseCapability(rc),
		CreatedAt:          optStr(ts),
		ResolvedAt:         null(),
	}
	r.th.upsertRequest(rr)
	s.emit(r.th, r.rec.ID, "runtime-request.updated", &rr)
	var it t3rpc.TurnItem
	if kind == "user_input" {
		it = s.newItem(r, "question:1", "user_input_request", "waiting", "", false)
		it.Questions = qs
	} else {
		it = s.newItem(r, "approval:1", "approval_request", "waiting", "", false)
		it.RequestKind = optStr(kind)
		it.Prompt = optStr(ApprovalCommand)
	}
	it.RequestId = optStr(rr.ID)
	s.putNewItem(r, it)
	r.requestID, r.questionItem = rr.ID, it.ID
	r.requests = append(r.requests, rr.ID)
	r.th.shell.PendingRuntimeRequest = t3rpc.NewOptNilPendingRuntimeRequest(t3rpc.PendingRuntimeRequest{
		ID: rr.ID, Kind: rr.Kind, CreatedAt: optStr(ts),
	})
	s.publishShell(r.th)
	return stepPark
}

// resolveRequest marks r's pending request resolved now (its runtime-request.updated event
// emitted), as a question's answers and an approval's decision both do first.
func (s *Server) resolveRequest(r *run) (ts string, rr t3rpc.RuntimeRequest) {
	ts = s.touch(r.th)
	rr, _ = r.th.request(r.requestID)
	rr.Status = "resolved"
	rr.ResolvedAt = optNilStr(ts)
	r.th.upsertRequest(rr)
	s.emit(r.th, r.rec.ID, "runtime-request.updated", &rr)
	return ts, rr
}

// answer resolves the pending question with the given answers and resumes the run.
func (s *Server) answer(r *run, answers map[string][]string) {
	_, rr := s.resolveRequest(r)
	s.finishItem(r, r.questionItem, "completed", nil)
	r.th.shell.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	s.publishShell(r.th)
	r.answers = answers
	s.answers[rr.ID] = answers
	r.requestID = ""
	s.schedule(r)
}

// decide answers a pending approval as T3 did in fixture 18. A decision
// resolves it: accept and acceptForSession complete the approval item,
// decline and cancel cancel it; the run goes on, except after cancel, which
// ends it cancelled. Answers instead of a decision also resolve it, but the
// agent never hears back: the run hangs until run.interrupt.
func (s *Server) decide(r *run, c *t3rpc.RuntimeRequestRespondCommand) {
	ts, rr := s.resolveRequest(r)
	r.th.shell.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	answers := map[string][]string{}
	decision, hasDecision := c.Decision.Get()
	if hasDecision {
		answers["decision"] = []string{string(decision)}
	} else if a, set := c.Answers.Get(); set {
		for q := range a {
			answers[q] = []string{"(answers to an approval)"}
		}
	}
	s.answers[rr.ID] = answers
	r.requestID = ""
	itemStatus := "completed"
	if decision == t3rpc.ApprovalDecisionDecline || decision == t3rpc.ApprovalDecisionCancel {
		itemStatus = "cancelled"
	}
	s.finishItem(r, r.questionItem, itemStatus, nil)
	switch {
	case !hasDecision:
		s.publishShell(r.th) // resolved, and the run hangs
	case decision == t3rpc.ApprovalDecisionCancel:
		s.finishItem(r, r.commandItem, "completed", nil)
		r.commandItem = ""
		r.state = runDone
		r.rec.Status = "cancelled"
		r.rec.CompletedAt = optNilStr(ts)
		s.putRun(r)
		s.settle(r, "cancelled", ts)
	default:
		s.publishShell(r.th)
		s.schedule(r)
	}
}

func stepHang(s *Server, r *run) stepResult {
	s.startCommand(r, "Wait forever", "sleep infinity")
	return stepPark
}

func stepFail(s *Server, r *run) stepResult {
	return s.failRun(r, "error:1", "Provider error", t3rpc.Failure{
		Class:     optStr("provider_error"),
		Message:   "Simulated provider failure: " + s.promptExcerpt(r.prompt),
		Code:      null(),
		Retryable: t3rpc.OptNilBool{Set: true, Null: true},
	})
}

// failRun ends r failed with an error item (key, title) carrying f.
func (s *Server) failRun(r *run, key, title string, f t3rpc.Failure) stepResult {
	ts := s.touch(r.th)
	it := s.newItem(r, key, "error", "failed", title, true)
	it.Failure = t3rpc.NewOptFailure(f)
	s.putNewItem(r, it)
	r.rec.Status = "failed"
	r.rec.CompletedAt = optNilStr(ts)
	s.putRun(r)
	s.settle(r, "failed", ts)
	return stepDone
}

// cancelRequest cancels the runtime request r waits on, if any (an interrupt, or a steer that
// replaces the question with new instructions).
func (s *Server) cancelRequest(r *run, ts string) {
	if r.requestID == "" {
		return
	}
	if rr, ok := r.th.request(r.requestID); ok {
		rr.Status = "cancelled"
		rr.ResolvedAt = optNilStr(ts)
		r.th.upsertRequest(rr)
		s.emit(r.th, r.rec.ID, "runtime-request.updated", &rr)
	}
	s.finishItem(r, r.questionItem, "cancelled", nil)
	r.requestID = ""
}

// interrupt is run.interrupt's synchronous part: the request item now, the result at the next
// step (T3 answers the command after the request item and interrupts the provider after).
func (s *Server) interrupt(r *run, reason string) {
	s.touch(r.th)
	if reason == "" {
		reason = "Interrupt requested"
	}
	it := s.newItem(r, "signal:interrupt-request", "run_interrupt_request", "completed", "Interrupt requested", true)
	it.Message = optStr(reason)
	s.putNewItem(r, it)
	s.publishShell(r.th)
	r.interrupting = true
	r.interruptReq = it.ID
	r.steps, r.idx = []stepFunc{stepInterrupted}, 0
	if r.state == runParked {
		s.schedule(r)
	}
}

func stepInterrupted(s *Server, r *run) stepResult {
	ts := s.touch(r.th)
	if r.commandItem != "" {
		s.finishItem(r, r.commandItem, "interrupted", nil)
		r.commandItem = ""
	}
	s.cancelRequest(r, ts)
	it := s.newItem(r, "signal:interrupt-result", "run_interrupt_result", "interrupted", "Interrupted", true)
	it.ParentItemId = optNilStr(r.interruptReq)
	it.Message = optStr("Run interrupted by user")
	s.putNewItem(r, it)
	r.rec.Status = "interrupted"
	r.rec.CompletedAt = optNilStr(ts)
	s.putRun(r)
	s.settle(r, "interrupted", ts)
	return stepDone
}
