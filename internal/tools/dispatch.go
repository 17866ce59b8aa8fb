package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
)

func dispatchTool(d *Deps) func(context.Context, *Call, *mcptools.DispatchInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.DispatchInput) (Result, error) {
		const tool = mcptools.ToolDispatch
		machine, project := strings.TrimSpace(in.Machine.Or("")), strings.TrimSpace(in.Project.Or(""))
		threadID := strings.TrimSpace(in.ThreadID.Or(""))
		// Recorded as asked until resolved below.
		c.Audit.Machine, c.Audit.Project, c.Audit.Thread = machine, project, threadID
		if in.Prompt != "" {
			c.Audit.SetPrompt(in.Prompt)
		}
		key, err := d.dispatchKey(tool, in)
		if err != nil {
			return Result{}, err
		}
		fingerprint := callFingerprint(*in)
		if key != "" {
			unlock := d.idem.locks.lock(key)
			defer unlock()
			d.pruneKeys(time.Now())
			p, found, err := d.storedPlan(key)
			if err != nil {
				return Result{}, fmt.Errorf("%s: %w", tool, err)
			}
			if found {
				return d.replay(ctx, c, key, fingerprint, p)
			}
		}
		var (
			plan  *dispatchPlan
			m     *fleet.Machine
			shell *t3rpc.ThreadShell
		)
		if threadID != "" {
			// A follow-up: the thread knows its machine and project.
			plan, m, shell, ctx, err = continuePlan(ctx, d, c, threadID, *in)
		} else {
			plan, m, ctx, err = newThreadPlan(ctx, d, c, machine, project, *in)
		}
		if err != nil {
			return Result{}, err
		}
		plan.Fingerprint, plan.Origin, plan.Watch = fingerprint, c.Origin, in.Watch.Or(true)
		if key != "" {
			stored, claimed, err := d.claimPlan(key, plan)
			if err != nil {
				return Result{}, fmt.Errorf("%s: could not record idempotency_key %q in the state file: %w; nothing was sent", tool, key, err)
			}
			if !claimed {
				// Another process sharing the store took the key meanwhile.
				return d.replay(ctx, c, key, fingerprint, stored)
			}
		}
		if err := d.runPlan(ctx, c, m, plan, key, shell); err != nil {
			return Result{}, err
		}
		return plan.result(), nil
	}
}

// dispatchKey checks the prompt (not blank, within MaxPromptChars) and
// returns the call's idempotency key ("" for none).
func (d *Deps) dispatchKey(tool string, in *mcptools.DispatchInput) (string, error) {
	if err := requireText(tool, "prompt", in.Prompt); err != nil {
		return "", err
	}
	if n := utf8.RuneCountInString(in.Prompt); n > d.Limits.MaxPromptChars {
		return "", fmt.Errorf("%s: prompt is %d characters, more than the limit of %d (T3CODE_MCP_MAX_PROMPT_CHARS); shorten it or put the details in a file in the workspace", tool, n, d.Limits.MaxPromptChars)
	}
	key := strings.TrimSpace(in.IdempotencyKey.Or(""))
	if in.IdempotencyKey.Set {
		if err := requireText(tool, "idempotency_key", key); err != nil {
			return "", err
		}
	}
	return key, nil
}

// newThreadPlan checks a call that starts a thread and builds its commands:
// thread.create plus message.dispatch, or with worktree one launchThread.
func newThreadPlan(ctx context.Context, d *Deps, c *Call, machine, project string, in mcptools.DispatchInput) (*dispatchPlan, *fleet.Machine, context.Context, error) {
	const tool = mcptools.ToolDispatch
	if machine == "" || project == "" {
		return nil, nil, ctx, fmt.Errorf("%s: a new thread needs machine and project (from t3_machines and t3_projects); to continue a thread, pass its thread_id and the prompt only", tool)
	}
	if in.Mode.Set {
		return nil, nil, ctx, fmt.Errorf("%s: mode applies to a busy thread given by thread_id; a new thread starts at once, so leave mode out", tool)
	}
	if err := requireText(tool, "machine", in.Machine.Or("")); err != nil {
		return nil, nil, ctx, err
	}
	ws, err := workspaceStrategy(in)
	if err != nil {
		return nil, nil, ctx, err
	}
	m, err := d.Fleet.Machine(machine)
	if err != nil {
		return nil, nil, ctx, err
	}
	c.Audit.Machine = m.Name
	if m.Config.ReadOnly() {
		return nil, nil, ctx, refuseReadOnly(tool, m, "start threads or send prompts")
	}
	if err := m.Ready(); err != nil {
		return nil, nil, ctx, err
	}
	p, err := m.Project(project)
	if err != nil {
		return nil, nil, ctx, err
	}
	c.Audit.Project = p.Title
	sel, err := modelSelection(ctx, m, in.Model.Or(""), p)
	if err != nil {
		return nil, nil, ctx, err
	}
	c.Audit.Model = sel.InstanceId + "/" + sel.Model
	title := strings.TrimSpace(in.Title.Or(""))
	if title == "" {
		title = titleFrom(in.Prompt)
	}
	threadID, msgID := t3.NewID("thread"), t3.NewID("msg")
	c.Audit.Thread = threadID
	plan := &dispatchPlan{
		Machine: m.Name, ThreadID: threadID, ProjectID: p.ID, ProjectTitle: p.Title, Title: title,
		MessageID: msgID, Created: true, Branch: ws.Branch.Or(""),
	}
	details := [][2]string{
		{"project", fmt.Sprintf("%s (%s)", p.Title, p.WorkspaceRoot)},
		{"thread", fmt.Sprintf("new, titled %q", title)},
		{"model", modelText(sel)},
	}
	more, err := plan.newThreadSteps(tool, p, sel, ws, in.Prompt)
	if err != nil {
		return nil, nil, ctx, err
	}
	details = append(details, more...)
	ctx, err = d.approve(ctx, c, tool, m, approval{
		action:    config.ApproveDispatch,
		summary:   "starting a new thread",
		details:   details,
		bodyTitle: promptTitle(in.Prompt),
		body:      in.Prompt,
		thread:    "new",
		commands:  plan.commands(),
	})
	if err != nil {
		return nil, nil, ctx, err
	}
	return plan, m, ctx, nil
}

// newThreadSteps adds the steps that start plan's thread in project p:
// thread.create and message.dispatch in the project's root, or one
// launchThread with a worktree. It returns the approval's lines about them.
func (plan *dispatchPlan) newThreadSteps(tool string, p t3rpc.Project, sel t3rpc.ModelSelection, ws t3rpc.WorkspaceStrategy, prompt string) ([][2]string, error) {
	if ws.Type == "root" {
		create := t3.ThreadCreate(plan.ThreadID, p.ID, plan.Title, sel)
		send := t3.MessageDispatch(plan.ThreadID, plan.MessageID, prompt, plan.Title)
		for _, cmd := range []t3.Command{create, send} {
			st, err := commandStep(cmd)
			if err != nil {
				return nil, fmt.Errorf("%s: encoding the %s command: %w", tool, cmd.CommandType(), err)
			}
			plan.Steps = append(plan.Steps, st)
		}
		return [][2]string{{"runtime mode", runtimeModeText(commandField(create, "runtimeMode"))}}, nil
	}
	launch := t3.LaunchThreadInput(plan.ThreadID, p.ID, plan.Title, sel, plan.MessageID, prompt)
	launch.WorkspaceStrategy = ws
	st, err := launchStep(launch)
	if err != nil {
		return nil, fmt.Errorf("%s: encoding the launch: %w", tool, err)
	}
	plan.Steps = append(plan.Steps, st)
	return [][2]string{{"runtime mode", runtimeModeText(launch.RuntimeMode)}, {"workspace", worktreeText(ws)}}, nil
}

// continuePlan checks a call that sends the prompt to an existing thread and
// builds its commands: the model change, if any, and message.dispatch in the
// call's mode.
func continuePlan(ctx context.Context, d *Deps, c *Call, threadID string, in mcptools.DispatchInput) (*dispatchPlan, *fleet.Machine, *t3rpc.ThreadShell, context.Context, error) {
	const tool = mcptools.ToolDispatch
	fail := func(err error) (*dispatchPlan, *fleet.Machine, *t3rpc.ThreadShell, context.Context, error) {
		return nil, nil, nil, ctx, err
	}
	found, err := d.followUpThread(tool, c, threadID, in)
	if err != nil {
		return fail(err)
	}
	m := found.Machine
	setModel, modelLine, err := followUpModel(ctx, c, found, threadID, in)
	if err != nil {
		return fail(err)
	}
	// The row as it is now: the run T3 makes of the prompt is the next
	// latest run (queued behind the active one when the thread is busy).
	before := found.Shell
	if row, ok := m.Watcher().Thread(threadID); ok {
		before = row
	}
	mode, err := dispatchMode(m, threadID, &before, in.Mode)
	if err != nil {
		return fail(err)
	}
	msgID := t3.NewID("msg")
	plan := &dispatchPlan{
		Machine: m.Name, ThreadID: threadID, ProjectID: found.Project.ID, ProjectTitle: found.Project.Title,
		Title: found.Shell.Title, MessageID: msgID, Mode: string(mode.Type), Target: mode.TargetRunId.Or(""),
		PrevLatest: threadstate.LatestRun(&before), Busy: threadstate.ActiveRun(&before) != "",
	}
	commands := []t3.Command{t3.MessageDispatchMode(threadID, msgID, in.Prompt, "", mode)}
	if setModel != nil {
		commands = []t3.Command{setModel, commands[0]}
	}
	for _, cmd := range commands {
		st, err := commandStep(cmd)
		if err != nil {
			return fail(fmt.Errorf("%s: encoding the %s command: %w", tool, cmd.CommandType(), err))
		}
		plan.Steps = append(plan.Steps, st)
	}
	details := [][2]string{
		{"project", fmt.Sprintf("%s (%s)", found.Project.Title, found.Project.WorkspaceRoot)},
		{"thread", fmt.Sprintf("%s, titled %q, now %s", threadID, found.Shell.Title, found.Shell.Status)},
		{"model", modelLine},
		{"runtime mode", runtimeModeText(found.Shell.RuntimeMode.Or(""))},
	}
	if in.Mode.Set {
		details = append(details, [2]string{"mode", modeName(plan.Mode)})
	}
	ctx, err = d.approve(ctx, c, tool, m, approval{
		action:    config.ApproveDispatch,
		summary:   "sending a prompt to thread " + threadID,
		details:   details,
		bodyTitle: promptTitle(in.Prompt),
		body:      in.Prompt,
		thread:    threadID,
		commands:  commands,
	})
	if err != nil {
		return fail(err)
	}
	return plan, m, &found.Shell, ctx, nil
}

// followUpThread finds the thread a follow-up prompt goes to and checks the
// call against it: no worktree, the thread's own machine and project if
// named, a machine that permits changes and is ready.
func (d *Deps) followUpThread(tool string, c *Call, threadID string, in mcptools.DispatchInput) (fleet.Found, error) {
	if strings.ContainsRune(threadID, 0) {
		return fleet.Found{}, fmt.Errorf("%s: thread_id contains a NUL character", tool)
	}
	if in.Worktree.Set {
		return fleet.Found{}, fmt.Errorf("%s: worktree applies to a new thread; thread %q keeps the workspace it was started in (leave worktree out, or leave thread_id out to start a new thread)", tool, threadID)
	}
	found, err := d.Fleet.Thread(threadID)
	if err != nil {
		return fleet.Found{}, err
	}
	m := found.Machine
	c.Audit.Machine = m.Name
	if name := strings.TrimSpace(in.Machine.Or("")); name != "" && name != m.Name {
		return fleet.Found{}, fmt.Errorf("%s: thread %q is on machine %q, not %s; with thread_id, machine and project can be left out", tool, threadID, m.Name, text.Quoted(name))
	}
	if ref := strings.TrimSpace(in.Project.Or("")); ref != "" && ref != found.Project.ID && ref != found.Project.Title && strings.TrimRight(ref, "/") != strings.TrimRight(found.Project.WorkspaceRoot, "/") {
		return fleet.Found{}, fmt.Errorf("%s: thread %q belongs to project %q (%s), not %s; with thread_id, machine and project can be left out", tool, threadID, found.Project.Title, found.Project.WorkspaceRoot, text.Quoted(ref))
	}
	if m.Config.ReadOnly() {
		return fleet.Found{}, refuseReadOnly(tool, m, "start threads or send prompts")
	}
	if err := m.Ready(); err != nil {
		return fleet.Found{}, err
	}
	c.Audit.Project = found.Project.Title
	return found, nil
}

// followUpModel is the model change a follow-up asks for (nil when it keeps
// the thread's model) and the approval's line about the model.
func followUpModel(ctx context.Context, c *Call, found fleet.Found, threadID string, in mcptools.DispatchInput) (t3.Command, string, error) {
	current := "the thread's own"
	if ms, ok := found.Shell.ModelSelection.Get(); ok {
		current = modelText(ms)
	}
	model := strings.TrimSpace(in.Model.Or(""))
	if model == "" {
		return nil, current + " (unchanged)", nil
	}
	sel, err := modelSelection(ctx, found.Machine, model, found.Project)
	if err != nil {
		return nil, "", err
	}
	c.Audit.Model = sel.InstanceId + "/" + sel.Model
	return t3.ModelSelectionSet(threadID, sel), fmt.Sprintf("%s (switching from %s)", modelText(sel), current), nil
}

// runGrace bounds how long t3_dispatch waits for the row to show the run T3
// made of an accepted prompt (T3 emits run.created with the command, so this
// is the watcher's lag, not the agent's work).
const runGrace = 3 * time.Second

// sent records a prompt T3 accepted: its message id and, once the machine's
// row shows it, the run T3 made of it — the row's latest run, once it differs
// from prevLatest (the latest run before the prompt). With the run known,
// t3_wait judges it from the row alone and reads nothing while waiting. A row
// that does not show it in time leaves the run to be found by message id.
func (d *Deps) sent(ctx context.Context, m *fleet.Machine, tr *tracked.Thread, msgID, prevLatest string) string {
	tr.LastMessageID, tr.LastRunID = msgID, ""
	if w := m.Watcher(); w != nil {
		timer := time.NewTimer(runGrace)
		defer timer.Stop()
	wait:
		for {
			row, ok, changed := w.ThreadAndWait(tr.ID)
			if latest := threadstate.LatestRun(&row); ok && latest != "" && latest != prevLatest {
				tr.LastRunID = latest
				break
			}
			select {
			case <-changed:
			case <-timer.C:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
	}
	tr.UpdatedAt = time.Now().UTC()
	if err := d.track(m.Name, *tr, nil); err != nil {
		// The prompt is running; only the shortcut to its run is lost.
		d.Logger.Warn("could not record the dispatched message in the state file", "machine", m.Name, "thread", tr.ID, "err", err)
	}
	return tr.LastRunID
}

// modelText shows a model selection as instanceId/model (option=value, …).
func modelText(sel t3rpc.ModelSelection) string {
	s := sel.InstanceId + "/" + sel.Model
	var opts []string
	for _, o := range sel.Options {
		switch o.Value.Type {
		case t3rpc.BoolModelOptionValue:
			opts = append(opts, fmt.Sprintf("%s=%t", o.ID, o.Value.Bool))
		default:
			opts = append(opts, fmt.Sprintf("%s=%s", o.ID, o.Value.String))
		}
	}
	if len(opts) > 0 {
		s += " (" + strings.Join(opts, ", ") + ")"
	}
	return s
}

// runtimeModeText explains a T3 runtime mode to the person approving.
func runtimeModeText(mode string) string {
	switch mode {
	case "full-access":
		return "full-access: the agent runs commands and edits files in the project without asking anyone"
	case "":
		return "the thread's own (T3 did not report it)"
	}
	return mode
}

func promptTitle(prompt string) string {
	return fmt.Sprintf("Prompt (%d characters, in full):", utf8.RuneCountInString(prompt))
}

// commandField reads one top-level string field of a command as it will be
// sent, so that what a person approves is read off the command itself.
func commandField(cmd t3.Command, field string) string {
	raw, err := cmd.MarshalJSON()
	if err != nil {
		return ""
	}
	var v map[string]json.RawMessage
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	var s string
	_ = json.Unmarshal(v[field], &s)
	return s
}

// titleFrom makes a thread title from the prompt's first line.
func titleFrom(prompt string) string {
	line := strings.TrimSpace(prompt)
	if i := strings.IndexByte(line, '\n'); i >= 0 {
		line = strings.TrimSpace(line[:i])
	}
	line = strings.Join(strings.Fields(line), " ")
	if utf8.RuneCountInString(line) > 80 {
		line = strings.TrimSpace(text.Runes(line, 79)) + text.Ellipsis
	}
	if line == "" {
		line = "t3code-mcp thread"
	}
	return line
}

// modelSelection picks the model of a new run: the call's model, else the
// machine's configured model (with its options), else the project's default.
// A model named in the call or the config is checked against the machine's
// providers (server.getConfig); a bad one is refused listing what is there.
func modelSelection(ctx context.Context, m *fleet.Machine, model string, p t3rpc.Project) (t3rpc.ModelSelection, error) {
	const tool = mcptools.ToolDispatch
	source := "model argument"
	var opts map[string]any
	if model == "" {
		if inst, slug, ok := m.Config.ModelSelection(); ok {
			model, opts, source = inst+"/"+slug, m.Config.Options, fmt.Sprintf("model of machine %q in t3code.toml", m.Name)
		}
	}
	if model == "" {
		if ms, ok := p.DefaultModelSelection.Get(); ok {
			return ms, nil
		}
		// No model anywhere: let the first usable provider decide.
		cfg, err := m.Providers(ctx)
		if err != nil {
			return t3rpc.ModelSelection{}, err
		}
		for _, pr := range cfg.Providers {
			if t3.ProviderUsable(pr) && len(pr.Models) > 0 {
				return t3rpc.ModelSelection{InstanceId: pr.InstanceId, Model: pr.Models[0].Slug}, nil
			}
		}
		return t3rpc.ModelSelection{}, fmt.Errorf("%s: machine %q has no usable provider (none is enabled and ready); set one up in T3 Code there", tool, m.Name)
	}
	inst, slug, ok := strings.Cut(model, "/")
	if !ok || inst == "" || slug == "" {
		return t3rpc.ModelSelection{}, fmt.Errorf("%s: %s %s is not instanceId/model (for example codex/gpt-5.6-sol)", tool, source, text.Quoted(model))
	}
	cfg, err := m.Providers(ctx)
	if err != nil {
		return t3rpc.ModelSelection{}, err
	}
	var avail []string
	for _, pr := range cfg.Providers {
		if !t3.ProviderUsable(pr) {
			continue
		}
		for _, md := range pr.Models {
			avail = append(avail, pr.InstanceId+"/"+md.Slug)
			if pr.InstanceId == inst && md.Slug == slug {
				sel := t3rpc.ModelSelection{InstanceId: inst, Model: slug}
				o, err := modelOptions(md, opts)
				if err != nil {
					return t3rpc.ModelSelection{}, fmt.Errorf("%s: %s: %w", tool, source, err)
				}
				sel.Options = o
				return sel, nil
			}
		}
	}
	sort.Strings(avail)
	if len(avail) == 0 {
		return t3rpc.ModelSelection{}, fmt.Errorf("%s: %s %s is not available on machine %q: it has no usable provider", tool, source, text.Quoted(model), m.Name)
	}
	return t3rpc.ModelSelection{}, fmt.Errorf("%s: %s %s is not available on machine %q; available: %s", tool, source, text.Quoted(model), m.Name, strings.Join(avail, ", "))
}

// modelOptions turns configured options into model options, checked against
// the model's option descriptors.
func modelOptions(md t3rpc.ProviderModel, opts map[string]any) ([]t3rpc.ModelOption, error) {
	if len(opts) == 0 {
		return nil, nil
	}
	descs := map[string]t3rpc.OptionDescriptor{}
	if caps, ok := md.Capabilities.Get(); ok {
		for _, d := range caps.OptionDescriptors {
			descs[d.ID] = d
		}
	}
	ids := make([]string, 0, len(opts))
	for id := range opts {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	var out []t3rpc.ModelOption
	for _, id := range ids {
		d, ok := descs[id]
		if !ok {
			known := make([]string, 0, len(descs))
			for k := range descs {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("option %q is not an option of model %s (its options: %s)", id, md.Slug, strings.Join(known, ", "))
		}
		switch v := opts[id].(type) {
		case bool:
			if d.Type != "boolean" {
				return nil, fmt.Errorf("option %q of model %s takes one of %s, not a boolean", id, md.Slug, choices(d))
			}
			out = append(out, t3rpc.ModelOption{ID: id, Value: t3rpc.NewBoolModelOptionValue(v)})
		case string:
			if d.Type == "select" {
				found := false
				for _, c := range d.Options {
					found = found || c.ID == v
				}
				if !found {
					return nil, fmt.Errorf("option %q of model %s is %q; allowed: %s", id, md.Slug, v, choices(d))
				}
			}
			out = append(out, t3rpc.ModelOption{ID: id, Value: t3rpc.NewStringModelOptionValue(v)})
		default:
			return nil, fmt.Errorf("option %q must be a string or a boolean", id)
		}
	}
	return out, nil
}

func choices(d t3rpc.OptionDescriptor) string {
	ids := make([]string, 0, len(d.Options))
	for _, c := range d.Options {
		ids = append(ids, c.ID)
	}
	if len(ids) == 0 {
		return d.Type
	}
	return strings.Join(ids, ", ")
}
