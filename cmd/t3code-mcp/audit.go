package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
)

// auditLog implements `t3code-mcp audit`: it prints the audit log of the
// state directory (T3CODE_MCP_STATE_DIR), rotated files included, oldest
// first, as a table or (--json) as the stored JSON lines. It only reads, so
// it works while a connector runs.
func auditLog(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("t3code-mcp audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	machine := fs.String("machine", "", "only calls on this machine")
	thread := fs.String("thread", "", "only calls about this thread id")
	since := fs.String("since", "", "only calls since then: a duration back from now (2h, 30m) or an RFC 3339 time")
	asJSON := fs.Bool("json", false, "print the JSON lines as stored instead of a table")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: t3code-mcp audit [--machine NAME] [--thread ID] [--since 2h|RFC3339] [--json]")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "audit: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	f := audit.Filter{Machine: *machine, Thread: *thread}
	if *since != "" {
		t, err := audit.ParseSince(*since, time.Now())
		if err != nil {
			fmt.Fprintln(stderr, "audit:", err)
			return 2
		}
		f.Since = t
	}
	// Only the state directory matters here; it is set even when another
	// variable is malformed.
	s, _ := app.SettingsFromEnv(os.Getenv)
	n, bad, err := audit.Print(stdout, s.StateDir, f, *asJSON)
	if err != nil {
		fmt.Fprintln(stderr, "t3code-mcp audit:", err)
		return 1
	}
	if bad > 0 {
		fmt.Fprintf(stderr, "audit: skipped %d unreadable lines\n", bad)
	}
	if !*asJSON {
		fmt.Fprintf(stderr, "%d audit records from %s\n", n, s.StateDir)
	}
	return 0
}
