package tools

import (
	"context"
	"fmt"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
	"github.com/t3code-mcp/t3code-mcp/internal/threadstate"
)

// interruptReason is the reason t3_interrupt gives T3.
const interruptReason = "interrupted through t3code-mcp"

func interruptTool(d *Deps) func(context.Context, *Call, *mcptools.InterruptInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.InterruptInput) (Result, error) {
		const tool = mcptools.ToolInterrupt
		f, err := d.actOn(tool, c, in.ThreadID, "interrupt runs")
		if err != nil {
			return Result{}, err
		}
		m := f.Machine
		run := threadstate.ActiveRun(&f.Shell)
		if run == "" {
			return Result{}, fmt.Errorf("%s: thread %q has no active run to interrupt (status %s)", tool, f.Shell.ID, f.Shell.Status)
		}
		c.Audit.Run = run
		cmd := t3.RunInterrupt(f.Shell.ID, run, interruptReason)
		ctx, err = d.approve(ctx, c, tool, m, approval{
			action:  config.ApproveInterrupt,
			summary: "interrupting run " + run,
			details: [][2]string{
				{"project", fmt.Sprintf("%s (%s)", f.Project.Title, f.Project.WorkspaceRoot)},
				{"thread", fmt.Sprintf("%s, titled %q, now %s", f.Shell.ID, f.Shell.Title, f.Shell.Status)},
				{"run", run + " (stopped where it is: its work so far stays, the rest is not done)"},
				{"reason", interruptReason},
			},
			thread:   f.Shell.ID,
			commands: []t3.Command{cmd},
		})
		if err != nil {
			return Result{}, err
		}
		if _, err := m.Dispatch(ctx, cmd); err != nil {
			return Result{}, fmt.Errorf("%s: interrupting run %q of thread %q failed: %w", tool, run, f.Shell.ID, err)
		}
		if p, ok := threadstate.PendingRequest(&f.Shell); ok {
			// The interrupt cancels the run's pending request; a wait right
			// after must not report it from a row that has not caught up.
			d.answered.add(p.ID)
		}
		shell, st, err := d.stateAfter(ctx, f)
		if err != nil {
			return Result{}, err
		}
		out := mcptools.InterruptOutput{ThreadID: f.Shell.ID, RunID: run, Status: shell.Status, State: st}
		return Result{Structured: &out, Text: fmt.Sprintf("interrupt sent to run %s of thread %s (now %s); t3_wait reports when it has stopped", run, f.Shell.ID, shell.Status)}, nil
	}
}
