package t3fake

import (
	slashpath "path"
	"slices"
	"strings"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// Worktree threads (fixture 20) and steering a busy thread (fixture 21).
//
// Worktrees: orchestration.launchThread with workspaceStrategy {type:"worktree", baseRef,
// branch?} answers with the branch set and worktreePath null; T3 provisions the worktree in the
// background and the path arrives in thread.metadata-updated (and the shell row). A base ref the
// repository does not have does not fail the launch: the run fails with a validation_error item
// "Workspace preparation failed …" and the row keeps the branch, worktreePath null.
// {type:"existing_worktree", worktreePath, branch?} sets both at once. Not recorded: the branch T3
// picks when none is given (the fake uses t3/<thread id>) and a project that is not a git
// repository (the fake fails the run like a bad ref).
//
// Steering: message.dispatch with steer_active / restart_active aimed at the active run keeps the
// same run (T3 adds an attempt, which the fake does not model) and the message joins it; the fake
// then runs the script the new message chooses within that run. Aimed at a queued run they fail
// with T3's recorded text.

// worktreeRoot is where T3 puts new worktrees on the recorded machine.
const worktreeRoot = "/home/dev/.t3/worktrees"

// SetGitRefs makes a project's workspace a git repository with these refs (branches, tags or
// commits); with none it is not a git repository. AddProject's projects have the ref "main".
func (s *Server) SetGitRefs(projectID string, refs ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.projectByID[projectID]; p != nil {
		p.refs = append([]string(nil), refs...)
	}
}

// RefuseModes makes message.dispatch with these dispatchMode types fail, on threads of provider
// instance instanceID, as T3 refuses what a provider cannot do (the text is the fake's: T3's
// wording for it was not recorded). No modes: accept them all again.
func (s *Server) RefuseModes(instanceID string, modes ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refusedModes == nil {
		s.refusedModes = map[string][]string{}
	}
	s.refusedModes[instanceID] = append([]string(nil), modes...)
}

// ThreadWorkspace returns a thread's branch and worktree path as its row shows them.
func (s *Server) ThreadWorkspace(threadID string) (branch, worktree string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	th := s.threadByID[threadID]
	if th == nil {
		return "", "", false
	}
	return th.shell.Branch.Or(""), th.shell.WorktreePath.Or(""), true
}

// provision is what a worktree launch still has to do when its run starts.
type provision struct {
	worktree string // the path to announce
	failure  string // non-empty: the run fails with this validation_error instead
}

// applyWorkspace gives a just-created thread the launch's workspace. It returns what its first
// run must provision (nil: nothing).
func (s *Server) applyWorkspace(th *thread, ws t3rpc.WorkspaceStrategy) (pv *provision) {
	switch ws.Type {
	case "existing_worktree":
		th.shell.Branch = strOrNull(ws.Branch.Or(""))
		th.shell.WorktreePath = optNilStr(ws.WorktreePath.Or(""))
		th.app.Branch, th.app.WorktreePath = th.shell.Branch, th.shell.WorktreePath
	case "worktree":
		root := s.projectByID[th.shell.ProjectId].rec.WorkspaceRoot // launchThread checked the project
		branch := ws.Branch.Or("")
		if branch == "" {
			branch = "t3/" + th.id
		}
		th.shell.Branch = optNilStr(branch)
		th.app.Branch = th.shell.Branch
		pv = &provision{worktree: slashpath.Join(worktreeRoot, slashpath.Base(strings.TrimRight(root, "/")), branch)}
		if !slices.Contains(s.projectByID[th.shell.ProjectId].refs, ws.BaseRef.Or("")) {
			pv = &provision{failure: "Workspace preparation failed during provision worktree: Git command failed in GitVcsDriver.createWorktree (" +
				root + "): git worktree add failed"}
		}
	default:
		return nil
	}
	s.touch(th)
	s.emit(th, "", "thread.metadata-updated", copyOf(th.app))
	s.publishShell(th)
	return pv
}

// announceWorktree is the background provisioning finishing: the path in thread.metadata-updated.
func (s *Server) announceWorktree(th *thread, worktree string) {
	s.touch(th)
	th.shell.WorktreePath = optNilStr(worktree)
	th.app.WorktreePath = th.shell.WorktreePath
	s.emit(th, "", "thread.metadata-updated", copyOf(th.app))
	s.publishShell(th)
}

// stepProvision is a worktree run's first step: the worktree appears, or the run fails as T3's
// did for a bad base ref (fixture 20, D).
func stepProvision(s *Server, r *run) stepResult {
	pv := r.provision
	r.provision = nil
	if pv == nil {
		return stepNext
	}
	if pv.failure == "" {
		s.announceWorktree(r.th, pv.worktree)
		return stepNext
	}
	return s.failRun(r, "error:workspace", "Workspace preparation failed", t3rpc.Failure{
		Class:     optStr("validation_error"),
		Message:   pv.failure,
		Code:      null(),
		Retryable: t3rpc.NewOptNilBool(false),
	})
}

// refusedMode is the fake's refusal of a mode a provider cannot do ("" when allowed).
func (s *Server) refusedMode(th *thread, mode string) string {
	inst := th.app.ModelSelection.Or(t3rpc.ModelSelection{}).InstanceId
	if slices.Contains(s.refusedModes[inst], mode) {
		return "Provider instance " + inst + " does not support dispatch mode " + mode + "."
	}
	return ""
}

// steer is steer_active / restart_active: the message joins the target run, which goes on with
// the script the message chooses.
func (s *Server) steer(th *thread, c *t3rpc.MessageDispatchCommand) *t3rpc.TaggedError {
	target := c.DispatchMode.TargetRunId.Or("")
	r := th.run(target)
	switch {
	case r == nil:
		return dispatchError(c.CommandId, "message.dispatch", "Target run "+target+" was not found.") // not recorded
	case slices.Contains(th.queued, r):
		return dispatchError(c.CommandId, "message.dispatch", "Target run "+target+" is queued and cannot be steered.") // recorded (21)
	case r != th.active || r.interrupting || r.state == runDone:
		return dispatchError(c.CommandId, "message.dispatch", "Target run "+target+" is not active.") // not recorded
	}
	ts := s.touch(th)
	msg := t3rpc.Message{
		ID: c.MessageId, ThreadId: optStr(th.id), RunId: optNilStr(r.rec.ID), Role: "user", Text: c.Text,
		Streaming: t3rpc.NewOptBool(false), CreatedAt: optStr(ts), UpdatedAt: optStr(ts),
	}
	th.upsertMessage(msg)
	s.emit(th, r.rec.ID, "message.updated", &msg)
	it := s.newItem(r, "", "user_message", "completed", "", true)
	it.ID = "turn-item:message:" + c.MessageId
	it.MessageId = optStr(c.MessageId)
	it.Text = optStr(c.Text)
	s.putItem(r, it)
	if r.commandItem != "" {
		s.finishItem(r, r.commandItem, "interrupted", nil)
		r.commandItem = ""
	}
	s.cancelRequest(r, ts)
	th.shell.PendingRuntimeRequest = t3rpc.OptNilPendingRuntimeRequest{Set: true, Null: true}
	r.prompt, r.kind = c.Text, s.scriptOf(c.Text)
	r.steps, r.idx = scriptSteps[r.kind], 0
	th.shell.LatestVisibleMessage = t3rpc.NewOptNilVisibleMessage(t3rpc.VisibleMessage{
		ID: c.MessageId, Role: "user", Text: c.Text, UpdatedAt: optStr(ts),
	})
	s.publishShell(th)
	if r.state == runParked {
		s.schedule(r)
	}
	return nil
}
