package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/plural"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

// auditCommand is `t3code-mcp audit`: it prints the audit log of the state
// directory, rotated files included, oldest first, as a table or (--json) as
// the stored JSON lines; with a database URL, the shared table's records first
// (every replica's), then the state directory's (this replica's records the
// database could not take). It only reads, so it works while a connector runs.
func (c *cli) auditCommand() *cobra.Command {
	var f struct {
		machine, thread, since string
		json                   bool
	}
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "print the audit log of mutating calls",
		Long: `Print the audit log (<state dir>/audit.log, rotated files included, oldest first) as a table,
or with --json as the stored JSON lines. With a database URL (T3CODE_MCP_DATABASE_URL), the
records of every replica in the database's audit table come first, then those in this state
directory's files (records the database could not take when they were written). Works while a
connector runs; changes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return c.printAudit(cmd.Context(), audit.Filter{Machine: f.machine, Thread: f.thread}, f.since, f.json)
		},
	}
	cmd.Flags().StringVar(&f.machine, "machine", "", "only calls on this machine")
	cmd.Flags().StringVar(&f.thread, "thread", "", "only calls about this thread id")
	cmd.Flags().StringVar(&f.since, "since", "", "only calls since then: a duration back from now (2h, 30m) or an RFC 3339 time")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the JSON lines as stored instead of a table")
	return cmd
}

func (c *cli) printAudit(ctx context.Context, f audit.Filter, since string, asJSON bool) error {
	if since != "" {
		t, err := audit.ParseSince(since, time.Now())
		if err != nil {
			fmt.Fprintln(c.stderr, "audit:", err)
			return exitUsage
		}
		f.Since = t
	}
	// Only the state directory and the database URL matter here; they are set even when another
	// variable is malformed.
	s, _ := app.SettingsFromEnv(c.getenv)
	sources := []audit.Source{audit.FileSource(s.StateDir)}
	from := s.StateDir
	if s.DatabaseURL != "" {
		// Connect, not Open: reading the log must not migrate the database.
		db, err := pgstore.Connect(ctx, s.DatabaseURL)
		if err != nil {
			fmt.Fprintln(c.stderr, "t3code-mcp audit: database (T3CODE_MCP_DATABASE_URL):", err)
			return exitFailed
		}
		defer db.Close()
		// The file's records that are in the table too (copied by migrate-store) are shown once.
		inTable := map[[sha256.Size]byte]bool{}
		table := func(f audit.Filter, fn func([]byte, audit.Record) error) (int, error) {
			return db.ScanAudit(ctx, f, func(line []byte, r audit.Record) error {
				inTable[sha256.Sum256(line)] = true
				return fn(line, r)
			})
		}
		file := func(f audit.Filter, fn func([]byte, audit.Record) error) (int, error) {
			return audit.Scan(s.StateDir, f, func(line []byte, r audit.Record) error {
				if inTable[sha256.Sum256(line)] {
					return nil
				}
				return fn(line, r)
			})
		}
		sources = []audit.Source{table, file}
		from = db.Location() + " and " + s.StateDir
	}
	n, bad, err := audit.Print(c.stdout, f, asJSON, sources...)
	if err != nil {
		fmt.Fprintln(c.stderr, "t3code-mcp audit:", err)
		return exitFailed
	}
	if bad > 0 {
		fmt.Fprintf(c.stderr, "audit: skipped %d unreadable lines\n", bad)
	}
	if !asJSON {
		fmt.Fprintf(c.stderr, "%s from %s\n", plural.Count(n, "audit record"), from)
	}
	return nil
}
