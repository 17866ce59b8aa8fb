package t3fake

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-faster/jx"
	"github.com/ogen-go/ogen/validate"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// result is what an RPC call ends with: a success value, a typed failure (cause Fail) or a defect
// (cause Die).
type result struct {
	value jx.Raw
	fail  *t3rpc.TaggedError
	die   string
}

func ok(v encoder) result { return result{value: encode(v)} }

func failed(e *t3rpc.TaggedError) result { return result{fail: e} }

func died(defect string) result { return result{die: defect} }

// Failure texts are T3's (recorded in testdata/t3) so that the connector's error mapping is tested
// against the real wording.

func missingScope(scope string) *t3rpc.TaggedError {
	return &t3rpc.TaggedError{
		Tag:           "EnvironmentAuthorizationError",
		Message:       optStr("The authenticated token is missing required scope: " + scope + "."),
		RequiredScope: optStr(scope),
	}
}

func dispatchError(commandID, commandType, msg string) *t3rpc.TaggedError {
	return &t3rpc.TaggedError{
		Tag:         "OrchestrationV2DispatchCommandError",
		CommandId:   optStr(commandID),
		CommandType: optStr(commandType),
		Message:     optStr(msg),
		Detail:      optStr(msg),
	}
}

func launchError(commandID, projectID, msg string) *t3rpc.TaggedError {
	return &t3rpc.TaggedError{
		Tag:       "OrchestrationV2ThreadLaunchError",
		CommandId: optStr(commandID),
		ProjectId: optStr(projectID),
		Message:   optStr(msg),
	}
}

func projectionError(threadID string) *t3rpc.TaggedError {
	return &t3rpc.TaggedError{
		Tag:      "OrchestrationV2GetThreadProjectionError",
		ThreadId: optStr(threadID),
		Message:  optStr("Failed to load orchestration V2 thread " + threadID),
	}
}

func noThread(commandID, commandType, threadID string) *t3rpc.TaggedError {
	return dispatchError(commandID, commandType, "Failed to load orchestration projection for thread "+threadID+".")
}

// t3CommandTypes is T3's V2 command union as its decode defect lists it (recorded).
var t3CommandTypes = []string{
	"thread.create", "thread.archive", "thread.unarchive", "thread.delete", "thread.settle",
	"thread.unsettle", "thread.snooze", "thread.unsnooze", "thread.visit", "thread.mark-unread",
	"thread.metadata.update", "thread.title.regeneration.complete", "thread.runtime-mode.set",
	"thread.interaction-mode.set", "thread.model-selection.set", "provider-session.detach",
	"message.dispatch", "prepared-run.release", "prepared-run.progress", "prepared-run.fail",
	"run.interrupt", "queued-message.promote-to-steer", "queued-run.reorder", "queued-run.cancel",
	"queued-run.edit", "runtime-request.respond", "checkpoint.rollback", "thread.fork",
	"thread.merge_back", "delegated_task.request", "delegated_task.wake-policy",
	"thread.created.record", "provider.switch",
}

// unionDefect is T3's Die text for a command whose type is not in the union.
var unionDefect = func() string {
	parts := make([]string, len(t3CommandTypes))
	for i, t := range t3CommandTypes {
		extra := ""
		if t == "thread.unsettle" || t == "thread.unsnooze" {
			extra = ` readonly "reason": "user",`
		}
		parts[i] = fmt.Sprintf(`{ readonly "type": %q,%s ... }`, t, extra)
	}
	return "Expected " + strings.Join(parts, " | ")
}()

// peekStrings reads the top-level string fields named in keys without decoding the rest; ok is
// false when the payload is not a JSON object.
func peekStrings(payload jx.Raw, keys ...string) (map[string]string, bool) {
	out := map[string]string{}
	d := jx.DecodeBytes(payload)
	if d.Next() != jx.Object {
		return nil, false
	}
	err := d.ObjBytes(func(d *jx.Decoder, k []byte) error {
		if slices.Contains(keys, string(k)) && d.Next() == jx.String {
			v, err := d.Str()
			out[string(k)] = v
			return err
		}
		return d.Skip()
	})
	return out, err == nil
}

// decodeDefect turns a generated decoder's error into T3's Die text. Effect reports the first
// missing key; for commands it checks createdBy and creationSource before the rest (recorded:
// a message.dispatch with only type and threadId died with `Missing key at ["createdBy"]`).
func decodeDefect(err error) string {
	var verr *validate.Error
	if errors.As(err, &verr) && len(verr.Fields) > 0 {
		name := verr.Fields[0].Name
		for _, f := range verr.Fields {
			if f.Name == "createdBy" {
				name = f.Name
				break
			}
			if f.Name == "creationSource" && name != "createdBy" {
				name = f.Name
			}
		}
		return fmt.Sprintf("Missing key\n  at [%q]", name)
	}
	return "Invalid payload: " + err.Error()
}

type decoder interface{ Decode(d *jx.Decoder) error }

func decodePayload(payload jx.Raw, v decoder) error { return v.Decode(jx.DecodeBytes(payload)) }

func hasScope(scopes []string, want string) bool { return slices.Contains(scopes, want) }

// dispatchCommand is orchestration.dispatchCommand.
func (s *Server) dispatchCommand(payload jx.Raw, scopes []string) result {
	if !hasScope(scopes, ScopeOperate) {
		return failed(missingScope(ScopeOperate))
	}
	head, isObj := peekStrings(payload, "type", "commandId", "threadId")
	if !isObj {
		return died("Expected object, got " + strings.TrimSpace(string(payload)))
	}
	typ, cmdID := head["type"], head["commandId"]

	var (
		threadID string
		run      func() (int64, *t3rpc.TaggedError)
	)
	switch typ {
	case "thread.create":
		var c t3rpc.ThreadCreateCommand
		if err := decodePayload(payload, &c); err != nil {
			return died(decodeDefect(err))
		}
		threadID = c.ThreadId
		run = func() (int64, *t3rpc.TaggedError) { return s.threadCreate(&c) }
	case "message.dispatch":
		var c t3rpc.MessageDispatchCommand
		if err := decodePayload(payload, &c); err != nil {
			return died(decodeDefect(err))
		}
		threadID = c.ThreadId
		run = func() (int64, *t3rpc.TaggedError) { return s.messageDispatch(&c) }
	case "run.interrupt":
		var c t3rpc.RunInterruptCommand
		if err := decodePayload(payload, &c); err != nil {
			return died(decodeDefect(err))
		}
		threadID = c.ThreadId
		run = func() (int64, *t3rpc.TaggedError) { return s.runInterrupt(&c) }
	case "runtime-request.respond":
		var c t3rpc.RuntimeRequestRespondCommand
		if err := decodePayload(payload, &c); err != nil {
			return died(decodeDefect(err))
		}
		threadID = c.ThreadId
		run = func() (int64, *t3rpc.TaggedError) { return s.respond(&c) }
	case "thread.model-selection.set":
		var c t3rpc.ThreadModelSelectionSetCommand
		if err := decodePayload(payload, &c); err != nil {
			return died(decodeDefect(err))
		}
		threadID = c.ThreadId
		run = func() (int64, *t3rpc.TaggedError) { return s.modelSelectionSet(&c) }
	case "queued-run.cancel":
		ids, _ := peekStrings(payload, "runId")
		threadID = head["threadId"]
		run = func() (int64, *t3rpc.TaggedError) {
			th := s.threadByID[threadID]
			if th == nil {
				return 0, noThread(cmdID, typ, threadID)
			}
			if !s.cancelQueued(th, ids["runId"]) {
				return 0, dispatchError(cmdID, typ, "Run "+ids["runId"]+" is not queued.")
			}
			return s.head, nil
		}
	case "thread.archive":
		threadID = head["threadId"]
		run = func() (int64, *t3rpc.TaggedError) { return s.archive(cmdID, threadID) }
	default:
		if !slices.Contains(t3CommandTypes, typ) {
			return died(unionDefect)
		}
		return failed(dispatchError(cmdID, typ, "t3fake does not implement command type "+typ+"."))
	}
	if strings.TrimSpace(cmdID) == "" {
		return died("Expected a non empty string, got \"\"\n  at [\"commandId\"]")
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if th := s.threadByID[threadID]; th != nil { // a new thread's createThread locks it itself
		th.mu.Lock()
		defer th.mu.Unlock()
	}
	if rc, seen := s.receipts[cmdID]; seen {
		switch {
		case rc.threadID != threadID || rc.launch:
			return failed(dispatchError(cmdID, typ, fmt.Sprintf("Command %s was already used for thread %s.", cmdID, rc.threadID)))
		case rc.fail != nil:
			msg, _ := rc.fail.Message.Get()
			return failed(dispatchError(cmdID, typ, fmt.Sprintf("Command %s was previously rejected: %s", cmdID, msg)))
		default:
			s.accepted.Add(1)
			return ok(&t3rpc.DispatchResult{Sequence: rc.seq})
		}
	}
	seq, fail := run()
	s.remember(cmdID, receipt{threadID: threadID, seq: seq, fail: fail})
	if fail != nil {
		return failed(fail)
	}
	s.accepted.Add(1)
	return ok(&t3rpc.DispatchResult{Sequence: seq})
}

func (s *Server) threadCreate(c *t3rpc.ThreadCreateCommand) (int64, *t3rpc.TaggedError) {
	if th := s.threadByID[c.ThreadId]; th != nil {
		// Recorded: thread.create on an existing id is accepted and only re-announces the thread.
		s.touch(th)
		s.emit(th, "", "thread.created", copyOf(th.app))
		s.publishShell(th)
		return s.head, nil
	}
	if s.projectByID[c.ProjectId] == nil {
		return 0, dispatchError(c.CommandId, "thread.create", "Project "+c.ProjectId+" was not found.")
	}
	s.createThread(threadSpec{
		id: c.ThreadId, projectID: c.ProjectId, title: c.Title, model: c.ModelSelection,
		runtimeMode: c.RuntimeMode, interactionMode: c.InteractionMode,
		// T3's WebSocket handler stamps client commands as created by the user.
		createdBy: "user", creationSource: c.CreationSource,
	})
	return s.head, nil
}

func (s *Server) messageDispatch(c *t3rpc.MessageDispatchCommand) (int64, *t3rpc.TaggedError) {
	th := s.threadByID[c.ThreadId]
	if th == nil {
		return 0, noThread(c.CommandId, "message.dispatch", c.ThreadId)
	}
	mode := string(c.DispatchMode.Type)
	switch mode {
	case "start_immediately", "queue_after_active", "steer_active", "restart_active":
	default:
		return 0, dispatchError(c.CommandId, "message.dispatch", "t3fake does not implement dispatch mode "+mode+".")
	}
	if msg := s.refuseDispatch.Load(); msg != nil {
		return 0, dispatchError(c.CommandId, "message.dispatch", *msg)
	}
	if msg := s.refusedMode(th, mode); msg != "" {
		return 0, dispatchError(c.CommandId, "message.dispatch", msg)
	}
	if mode == "steer_active" || mode == "restart_active" {
		if fail := s.steer(th, c); fail != nil {
			return 0, fail
		}
		return s.head, nil
	}
	// On a busy thread the run is queued behind the active one (fixture 21).
	s.startRun(th, c.MessageId, c.Text, c.ModelSelection, false, false)
	return s.head, nil
}

// archive is thread.archive (recorded, 23): the row moves to the archive list
// (thread.updated with location archive), and a run under way fails.
func (s *Server) archive(cmdID, threadID string) (int64, *t3rpc.TaggedError) {
	th := s.threadByID[threadID]
	if th == nil {
		return 0, noThread(cmdID, "thread.archive", threadID)
	}
	if th.archived {
		return 0, dispatchError(cmdID, "thread.archive", "Thread "+threadID+" is already archived.")
	}
	ts := s.touch(th)
	th.archived = true
	th.app.ArchivedAt = optNilStr(ts)
	th.shell.ArchivedAt = optNilStr(ts)
	s.emit(th, "", "thread.archived", copyOf(th.app))
	if r := th.active; r != nil {
		it := s.newItem(r, "error:archived", "error", "failed", "Run failed", true)
		it.Failure = t3rpc.NewOptFailure(t3rpc.Failure{
			Class:   optStr("provider_error"),
			Message: "Failed while ingesting orchestration V2 run execution: the thread was archived.",
		})
		s.putItem(r, it)
		r.state = runDone
		r.rec.Status = "failed"
		r.rec.CompletedAt = optNilStr(ts)
		s.putRun(r)
		s.settle(r, "failed", ts)
		return s.head, nil
	}
	s.publishShell(th)
	return s.head, nil
}

func (s *Server) runInterrupt(c *t3rpc.RunInterruptCommand) (int64, *t3rpc.TaggedError) {
	th := s.threadByID[c.ThreadId]
	if th == nil {
		return 0, noThread(c.CommandId, "run.interrupt", c.ThreadId)
	}
	r := th.run(c.RunId)
	if r == nil || !r.interruptible() || slices.Contains(th.queued, r) {
		return 0, dispatchError(c.CommandId, "run.interrupt", "Run "+c.RunId+" is not interruptible.")
	}
	reason, _ := c.Reason.Get()
	s.interrupt(r, reason)
	return s.head, nil
}

func (s *Server) respond(c *t3rpc.RuntimeRequestRespondCommand) (int64, *t3rpc.TaggedError) {
	th := s.threadByID[c.ThreadId]
	if th == nil {
		return 0, noThread(c.CommandId, "runtime-request.respond", c.ThreadId)
	}
	rr, found := th.request(c.RequestId)
	if !found {
		return 0, dispatchError(c.CommandId, "runtime-request.respond", "Runtime request "+c.RequestId+" was not found.")
	}
	if rr.Status != "pending" {
		return 0, dispatchError(c.CommandId, "runtime-request.respond", "Runtime request "+c.RequestId+" is "+rr.Status+".")
	}
	r := th.active
	if r == nil || r.requestID != rr.ID || r.interrupting {
		return 0, dispatchError(c.CommandId, "runtime-request.respond", "Runtime request "+c.RequestId+" is cancelled.")
	}
	if rc, ok := rr.ResponseCapability.Get(); ok && rc.Type == "not_resumable" {
		// Not recorded: t3fake refuses, where T3 may accept and deliver nothing.
		return 0, dispatchError(c.CommandId, "runtime-request.respond", "Runtime request "+rr.ID+" cannot be resumed.")
	}
	if rr.Kind != "user_input" {
		s.decide(r, c)
		return s.head, nil
	}
	// Like T3, the answers are not checked against the questions; they are recorded as sent.
	answers := map[string][]string{}
	if a, set := c.Answers.Get(); set {
		for q, v := range a {
			if list, isList := v.GetStringArray(); isList {
				answers[q] = append([]string{}, list...)
			} else {
				str, _ := v.GetString()
				answers[q] = []string{str}
			}
		}
	}
	if d, set := c.Decision.Get(); set {
		answers["decision"] = []string{string(d)}
	}
	s.answer(r, answers)
	return s.head, nil
}

func (s *Server) modelSelectionSet(c *t3rpc.ThreadModelSelectionSetCommand) (int64, *t3rpc.TaggedError) {
	th := s.threadByID[c.ThreadId]
	if th == nil {
		return 0, noThread(c.CommandId, "thread.model-selection.set", c.ThreadId)
	}
	if cur, set := th.app.ModelSelection.Get(); set && cur.InstanceId != c.ModelSelection.InstanceId {
		return 0, dispatchError(c.CommandId, "thread.model-selection.set", fmt.Sprintf(
			"Thread %s uses provider instance %s; switching to %s needs provider.switch.", th.id, cur.InstanceId, c.ModelSelection.InstanceId))
	}
	s.touch(th)
	th.app.ModelSelection = t3rpc.NewOptModelSelection(c.ModelSelection)
	th.shell.ModelSelection = th.app.ModelSelection
	s.emit(th, "", "thread.model-selection-updated", copyOf(th.app))
	s.publishShell(th)
	return s.head, nil
}

// launchThread is orchestration.launchThread: thread.create plus the first message in one call.
func (s *Server) launchThread(payload jx.Raw, scopes []string) result {
	if !hasScope(scopes, ScopeOperate) {
		return failed(missingScope(ScopeOperate))
	}
	var in t3rpc.LaunchThreadInput
	if err := decodePayload(payload, &in); err != nil {
		return died(decodeDefect(err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if rc, seen := s.receipts[in.CommandId]; seen {
		th := s.threadByID[rc.threadID]
		switch {
		case !rc.launch || rc.threadID != in.ThreadId:
			return failed(launchError(in.CommandId, in.ProjectId, fmt.Sprintf("Command %s was already used for thread %s.", in.CommandId, rc.threadID)))
		case rc.fail != nil:
			msg, _ := rc.fail.Message.Get()
			return failed(launchError(in.CommandId, in.ProjectId, fmt.Sprintf("Command %s was previously rejected: %s", in.CommandId, msg)))
		case th == nil:
			return failed(launchError(in.CommandId, in.ProjectId, "Thread "+in.ThreadId+" no longer exists."))
		default:
			// T3 journals launches under the commandId: a retry finds the finished launch.
			s.accepted.Add(1)
			return ok(&t3rpc.LaunchThreadResult{ThreadId: th.id, Projection: t3rpc.NewOptThreadProjection(s.projection(th)), Resumed: true})
		}
	}
	reject := func(msg string) result {
		e := launchError(in.CommandId, in.ProjectId, msg)
		s.remember(in.CommandId, receipt{threadID: in.ThreadId, fail: e, launch: true})
		return failed(e)
	}
	if s.projectByID[in.ProjectId] == nil {
		return reject("Project " + in.ProjectId + " was not found.")
	}
	if s.threadByID[in.ThreadId] != nil {
		return reject("Thread " + in.ThreadId + " already exists.")
	}
	th := s.createThread(threadSpec{
		id: in.ThreadId, projectID: in.ProjectId, title: in.Title, model: in.ModelSelection,
		runtimeMode: in.RuntimeMode, interactionMode: in.InteractionMode,
		createdBy: "user", creationSource: in.CreationSource,
	})
	th.mu.Lock()
	defer th.mu.Unlock()
	pv := s.applyWorkspace(th, in.WorkspaceStrategy)
	if msg, set := in.InitialMessage.Get(); set {
		id, _ := msg.MessageId.Get()
		if id == "" {
			id = "message:launch:" + in.CommandId // T3 makes one when the client sends none
		}
		r := s.startRun(th, id, msg.Text, t3rpc.OptModelSelection{}, true, false)
		if pv != nil {
			r.provision = pv
			r.steps = append([]stepFunc{stepProvision}, r.steps...)
		}
	} else if pv != nil && pv.failure == "" {
		// Without a first message T3 still provisions the worktree (fixture 20, B).
		s.announceWorktree(th, pv.worktree)
	}
	s.remember(in.CommandId, receipt{threadID: th.id, seq: s.head, launch: true})
	s.accepted.Add(1)
	return ok(&t3rpc.LaunchThreadResult{ThreadId: th.id, Projection: t3rpc.NewOptThreadProjection(s.projection(th)), Resumed: false})
}

// getThreadProjection is orchestration.getThreadProjection (the whole thread; T3 windows it).
func (s *Server) getThreadProjection(payload jx.Raw) result {
	var in t3rpc.GetThreadProjectionInput
	if err := decodePayload(payload, &in); err != nil {
		return died(decodeDefect(err))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	th := s.threadByID[in.ThreadId]
	if th == nil {
		return failed(projectionError(in.ThreadId))
	}
	p := s.projection(th)
	return ok(&p)
}
