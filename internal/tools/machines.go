package tools

import (
	"context"
	"fmt"
	"strings"

	"github.com/t3code-mcp/t3code-mcp/gen/mcptools"
	"github.com/t3code-mcp/t3code-mcp/internal/plural"
)

func machinesTool(d *Deps) func(context.Context, *Call, *mcptools.MachinesInput) (Result, error) {
	return func(ctx context.Context, c *Call, in *mcptools.MachinesInput) (Result, error) {
		out := mcptools.MachinesOutput{Machines: []mcptools.Machine{}}
		var b strings.Builder
		var lookups map[string]int
		if d.Tracker != nil {
			lookups = d.Tracker.PendingLookups()
		}
		for _, m := range d.Fleet.Machines() {
			in := m.Info()
			mm := mcptools.Machine{
				Name: in.Name, URL: in.URL, Online: in.Online, Status: mcptools.MachineStatus(in.Status),
				Allowlist: append([]string{}, in.Projects...), Demo: in.Demo,
			}
			if in.Problem != "" && !in.Online {
				mm.Problem.SetTo(in.Problem)
			}
			if in.Protocol > 0 {
				mm.Protocol.SetTo(in.Protocol)
			}
			if in.ServerVersion != "" {
				mm.T3Version.SetTo(in.ServerVersion)
			}
			if in.Label != "" {
				mm.Environment.SetTo(in.Label)
			}
			n := lookups[in.Name]
			if n > 0 {
				mm.ThreadsAwaitingLookup.SetTo(n)
			}
			out.Machines = append(out.Machines, mm)
			demo := ""
			if in.Demo {
				demo = " (built-in demo machine: a fake T3 server with scripted runs, not a real machine)"
			}
			fmt.Fprintf(&b, "%s%s: %s (%s)", in.Name, demo, in.Status, in.URL)
			if mm.Problem.Set {
				fmt.Fprintf(&b, " — %s", in.Problem)
			}
			if n > 0 {
				fmt.Fprintf(&b, "; %s wait for a read of the thread before their next events", plural.Count(n, "watched thread"))
			}
			b.WriteString("\n")
		}
		if len(out.Machines) == 0 {
			b.WriteString("no machines configured: add one to t3code.toml (see t3code.example.toml)")
		}
		return Result{Structured: &out, Text: strings.TrimSpace(b.String())}, nil
	}
}
