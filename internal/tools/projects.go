package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/plural"
)

func modelString(p t3rpc.Project) string {
	if ms, ok := p.DefaultModelSelection.Get(); ok {
		return ms.InstanceId + "/" + ms.Model
	}
	return ""
}

func projectsTool(d *Deps) func(context.Context, *Call, *mcptools.ProjectsInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.ProjectsInput) (Result, error) {
		m, err := d.readyMachine(mcptools.ToolProjects, in.Machine)
		if err != nil {
			return Result{}, err
		}
		counts := m.ThreadCounts()
		out := mcptools.ProjectsOutput{Machine: m.Name, Projects: []mcptools.Project{}}
		var b strings.Builder
		for _, p := range m.Projects() {
			out.Projects = append(out.Projects, mcptools.Project{ID: p.ID, Title: p.Title, Path: p.WorkspaceRoot, DefaultModel: modelString(p), ThreadCount: counts[p.ID]})
			fmt.Fprintf(&b, "%s — %s (id %s, %s)\n", p.Title, p.WorkspaceRoot, p.ID, plural.Count(counts[p.ID], "thread"))
		}
		if len(out.Projects) == 0 {
			fmt.Fprintf(&b, "no project on machine %q is allowed by its projects patterns %q", m.Name, m.Config.Projects)
		}
		return Result{Structured: &out, Text: strings.TrimSpace(b.String())}, nil
	}
}
