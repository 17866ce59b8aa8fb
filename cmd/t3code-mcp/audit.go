package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
)

// auditCommand is `t3code-mcp audit`: it prints the audit log of the state
// directory, rotated files included, oldest first, as a table or (--json) as
// the stored JSON lines. It only reads, so it works while a connector runs.
func (c *cli) auditCommand() *cobra.Command {
	var f struct {
		machine, thread, since string
		json                   bool
	}
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "print the audit log of mutating calls",
		Long: `Print the audit log (<state dir>/audit.log, rotated files included, oldest first) as a table,
or with --json as the stored JSON lines. Works while a connector runs.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return c.printAudit(audit.Filter{Machine: f.machine, Thread: f.thread}, f.since, f.json)
		},
	}
	cmd.Flags().StringVar(&f.machine, "machine", "", "only calls on this machine")
	cmd.Flags().StringVar(&f.thread, "thread", "", "only calls about this thread id")
	cmd.Flags().StringVar(&f.since, "since", "", "only calls since then: a duration back from now (2h, 30m) or an RFC 3339 time")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the JSON lines as stored instead of a table")
	return cmd
}

func (c *cli) printAudit(f audit.Filter, since string, asJSON bool) error {
	if since != "" {
		t, err := audit.ParseSince(since, time.Now())
		if err != nil {
			fmt.Fprintln(c.stderr, "audit:", err)
			return exitUsage
		}
		f.Since = t
	}
	// Only the state directory matters here; it is set even when another
	// variable is malformed.
	s, _ := app.SettingsFromEnv(c.getenv)
	n, bad, err := audit.Print(c.stdout, s.StateDir, f, asJSON)
	if err != nil {
		fmt.Fprintln(c.stderr, "t3code-mcp audit:", err)
		return exitFailed
	}
	if bad > 0 {
		fmt.Fprintf(c.stderr, "audit: skipped %d unreadable lines\n", bad)
	}
	if !asJSON {
		fmt.Fprintf(c.stderr, "%d audit records from %s\n", n, s.StateDir)
	}
	return nil
}
