package tools

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/internal/tracked"
)

func watchTool(d *Deps) func(context.Context, *Call, *mcptools.WatchInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.WatchInput) (Result, error) {
		const tool = mcptools.ToolWatch
		id, hasID := in.ThreadID.Get()
		enabled, hasEnabled := in.Enabled.Get()
		switch {
		case !hasID && !hasEnabled:
			return listTracked(d)
		case hasID != hasEnabled:
			return Result{}, fmt.Errorf("%s: pass both thread_id and enabled to turn a thread's events on or off, or neither to list tracked threads", tool)
		}
		f, err := d.Fleet.Thread(id)
		if err != nil {
			return Result{}, err
		}
		tr := f.Tracked
		now := time.Now().UTC()
		if !f.IsTracked {
			tr = tracked.Thread{ID: f.Shell.ID, Machine: f.Machine.Name, Origin: c.Origin, CreatedAt: now}
		}
		if enabled && c.Origin != "" {
			tr.Origin = c.Origin
		}
		tr.ProjectID, tr.ProjectTitle, tr.Title, tr.UpdatedAt = f.Project.ID, f.Project.Title, f.Shell.Title, now
		tr.Watch = enabled
		// Only transitions from now on are reported, not the thread's past.
		if err := d.track(f.Machine.Name, tr, &f.Shell); err != nil {
			return Result{}, fmt.Errorf("%s: could not record the thread in the state file: %w", tool, err)
		}
		entry := trackedEntry(tr, f.Shell.Status)
		out := mcptools.WatchOutput{Threads: []mcptools.TrackedThread{}}
		out.Thread.SetTo(entry)
		word := "off"
		if enabled {
			word = "on"
			if d.Tracker == nil {
				word = "on (but no events are sent: T3CODE_MCP_HOOK_URL is not set)"
			}
		}
		return Result{Structured: &out, Text: fmt.Sprintf("events for thread %s are %s", tr.ID, word)}, nil
	}
}

// trackedEntry is a tracked thread as t3_watch lists it.
func trackedEntry(t tracked.Thread, status string) mcptools.TrackedThread {
	e := mcptools.TrackedThread{
		ThreadID: t.ID, Machine: t.Machine, Project: mcptools.ProjectRef{ID: t.ProjectID, Title: t.ProjectTitle},
		Title: t.Title, Status: status, Watching: t.Watch,
	}
	if t.Origin != "" {
		e.Origin.SetTo(t.Origin)
	}
	return e
}

// listTracked lists tracked threads whose projects the allowlists still admit.
func listTracked(d *Deps) (Result, error) {
	all, err := d.Threads.ListThreads()
	if err != nil {
		return Result{}, err
	}
	out := mcptools.WatchOutput{Threads: []mcptools.TrackedThread{}}
	var b strings.Builder
	for _, t := range all {
		status := "unknown"
		if m, err := d.Fleet.Machine(t.Machine); err == nil && m.Watcher() != nil {
			shell, ok := m.Watcher().Thread(t.ID)
			if ok {
				p, found := m.ProjectByID(shell.ProjectId)
				if !found || !m.Allowed(p) {
					continue
				}
				status = shell.Status
			} else if !m.Config.Allows(t.ProjectTitle, "") {
				continue
			}
		}
		e := trackedEntry(t, status)
		out.Threads = append(out.Threads, e)
		w := "unwatched"
		if t.Watch {
			w = "watched"
		}
		fmt.Fprintf(&b, "%s on %s (%s) %q: %s, %s\n", t.ID, t.Machine, t.ProjectTitle, t.Title, status, w)
	}
	if len(out.Threads) == 0 {
		b.WriteString("no tracked threads: t3_dispatch starts one, t3_watch adopts an existing one")
	}
	return Result{Structured: &out, Text: strings.TrimSpace(b.String())}, nil
}
