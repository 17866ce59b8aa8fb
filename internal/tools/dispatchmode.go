package tools

import (
	"fmt"
	"strings"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// dispatchMode maps t3_dispatch's mode to T3's dispatchMode (fixture 21):
// none is start_immediately, as before modes existed (a new run now, queued
// on a busy thread); queue is queue_after_active; steer and restart are
// steer_active and restart_active aimed at the active run, which keep that
// run and add an attempt. T3's {"type":"queue"} and deliveryIntent do not
// exist at the recorded build and are never sent.
func dispatchMode(m *fleet.Machine, threadID string, row *t3rpc.ThreadShell, mode mcptools.OptDispatchInputMode) (t3rpc.DispatchMode, error) {
	const tool = mcptools.ToolDispatch
	v, set := mode.Get()
	if !set {
		return t3rpc.DispatchMode{Type: t3rpc.DispatchModeTypeStartImmediately}, nil
	}
	switch v {
	case mcptools.DispatchInputModeQueue:
		return t3rpc.DispatchMode{Type: t3rpc.DispatchModeTypeQueueAfterActive}, nil
	case mcptools.DispatchInputModeSteer, mcptools.DispatchInputModeRestart:
		active := threadstate.ActiveRun(row)
		if active == "" {
			return t3rpc.DispatchMode{}, fmt.Errorf("%s: mode %q needs a run under way, and thread %q on machine %q has none (status %s); leave mode out to start a new run with this prompt",
				tool, v, threadID, m.Name, row.Status)
		}
		typ := t3rpc.DispatchModeTypeSteerActive
		if v == mcptools.DispatchInputModeRestart {
			typ = t3rpc.DispatchModeTypeRestartActive
		}
		return t3rpc.DispatchMode{Type: typ, TargetRunId: t3rpc.NewOptString(active)}, nil
	}
	return t3rpc.DispatchMode{}, fmt.Errorf("%s: mode %q is not one of queue, steer, restart", tool, v)
}

// modes are t3_dispatch's names of T3's dispatchModes and what each does.
var modes = map[t3rpc.DispatchModeType][2]string{
	t3rpc.DispatchModeTypeStartImmediately: {"(none)", "a new run now, queued if the thread is busy"},
	t3rpc.DispatchModeTypeQueueAfterActive: {"queue", "queue: a new run after the active one"},
	t3rpc.DispatchModeTypeSteerActive:      {"steer", "steer: into the active run"},
	t3rpc.DispatchModeTypeRestartActive:    {"restart", "restart: the active run restarts with this prompt"},
}

// modeName says what a T3 dispatchMode does, in the tool's words.
func modeName(t3mode string) string { return modes[t3rpc.DispatchModeType(t3mode)][1] }

// toolMode is t3_dispatch's name of a T3 dispatchMode.
func toolMode(t3mode string) string { return modes[t3rpc.DispatchModeType(t3mode)][0] }

// modeError is T3's refusal of a mode, saying so and naming the modes left to
// try: T3 reports no provider capabilities for modes, so what a provider
// cannot do shows only as a refusal.
func modeError(m *fleet.Machine, p *dispatchPlan, err error) error {
	refused := toolMode(p.Mode)
	var others []string
	for _, o := range []string{"queue", "steer", "restart"} {
		if o != refused && (p.Busy || o == "queue") {
			others = append(others, o)
		}
	}
	others = append(others, "none (a new run now, queued while one is under way)")
	return fmt.Errorf("%s: T3 on machine %q refused mode %s for thread %q, which its provider cannot do here: %w; nothing was sent into the thread. Modes to use instead: %s",
		mcptools.ToolDispatch, m.Name, refused, p.ThreadID, err, strings.Join(others, ", "))
}

// workspaceStrategy is the workspace of a new thread: the project root, or
// with worktree a new worktree and branch from base_ref, or an existing
// worktree at path (orchestration.launchThread, fixture 20).
func workspaceStrategy(in mcptools.DispatchInput) (t3rpc.WorkspaceStrategy, error) {
	const tool = mcptools.ToolDispatch
	w, set := in.Worktree.Get()
	if !set {
		return t3rpc.WorkspaceStrategy{Type: "root"}, nil
	}
	base, path, branch := strings.TrimSpace(w.BaseRef.Or("")), strings.TrimSpace(w.Path.Or("")), strings.TrimSpace(w.Branch.Or(""))
	for field, v := range map[string]string{"worktree.base_ref": base, "worktree.path": path, "worktree.branch": branch} {
		if strings.ContainsRune(v, 0) {
			return t3rpc.WorkspaceStrategy{}, fmt.Errorf("%s: %s contains a NUL character", tool, field)
		}
	}
	ws := t3rpc.WorkspaceStrategy{}
	if branch != "" {
		ws.Branch = t3rpc.NewOptString(branch)
	}
	switch {
	case base != "" && path != "":
		return t3rpc.WorkspaceStrategy{}, fmt.Errorf("%s: worktree takes base_ref (a new worktree and branch from that ref) or path (an existing worktree), not both", tool)
	case base != "":
		ws.Type, ws.BaseRef = "worktree", t3rpc.NewOptString(base)
	case path != "":
		ws.Type, ws.WorktreePath = "existing_worktree", t3rpc.NewOptString(path)
	default:
		return t3rpc.WorkspaceStrategy{}, fmt.Errorf("%s: worktree needs base_ref (the branch or commit to start from, e.g. main) or path (an existing worktree on the machine)", tool)
	}
	return ws, nil
}

// worktreeText shows a workspace strategy to the person approving.
func worktreeText(ws t3rpc.WorkspaceStrategy) string {
	branch := ws.Branch.Or("chosen by T3")
	if ws.Type == "existing_worktree" {
		return fmt.Sprintf("the existing worktree %s (branch %s)", ws.WorktreePath.Or(""), branch)
	}
	return fmt.Sprintf("a new git worktree from %s, branch %s", ws.BaseRef.Or(""), branch)
}
