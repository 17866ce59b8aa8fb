package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/spf13/cobra"

	"github.com/t3code-mcp/t3code-mcp/internal/audit"
	"github.com/t3code-mcp/t3code-mcp/internal/plural"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

func (c *cli) migrateStoreCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "migrate-store",
		Short: "copy the bbolt state file into PostgreSQL (T3CODE_MCP_DATABASE_URL)",
		Long: `Copy the state of the bbolt file in the state directory (--state-dir, T3CODE_MCP_STATE_DIR)
into the PostgreSQL database (--database-url, T3CODE_MCP_DATABASE_URL): the tracked threads, the
event detector's state, the pending events and the dead letters, in one transaction; then the
t3_dispatch idempotency keys and the audit log's records (audit.log, rotated files included).
Delivered events are not copied. The database must hold no connector state yet; the file is not changed.
Stop the connector first (the file is locked while it runs); then start it with the database URL.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return c.migrateStore(cmd.Context()) },
	}
}

func (c *cli) migrateStore(ctx context.Context) error {
	s, err := c.settings()
	if err != nil {
		return err
	}
	fail := func(err error) error {
		fmt.Fprintln(c.stderr, "t3code-mcp migrate-store:", err)
		return exitFailed
	}
	if s.DatabaseURL == "" {
		fmt.Fprintln(c.stderr, "t3code-mcp migrate-store: set T3CODE_MCP_DATABASE_URL (or --database-url) to the PostgreSQL database to copy into")
		return exitUsage
	}
	src, err := store.Open(s.StateDir)
	if errors.Is(err, store.ErrInUse) {
		return fail(fmt.Errorf("%w: stop the running t3code-mcp first (it holds %s)", err, s.StateDir))
	}
	if err != nil {
		return fail(err)
	}
	defer src.Close()
	threads, err := src.ListThreads()
	if err != nil {
		return fail(err)
	}
	detector := map[string][]byte{}
	if err := src.ForEachDetector(func(k string, v []byte) error { detector[k] = v; return nil }); err != nil {
		return fail(err)
	}
	pending, err := src.Pending(0)
	if err != nil {
		return fail(err)
	}
	dead, err := src.Dead()
	if err != nil {
		return fail(err)
	}
	keys, err := src.Idempotencies()
	if err != nil {
		return fail(err)
	}
	// In the file's sequence order, dead letters among the pending events: a requeue puts a
	// dead letter back at its place in its stream.
	evs := slices.SortedFunc(slices.Values(append(pending, dead...)), func(a, b store.Event) int { return cmp.Compare(a.Seq, b.Seq) })

	dst, err := pgstore.Open(ctx, s.DatabaseURL)
	if err != nil {
		return fail(fmt.Errorf("database (T3CODE_MCP_DATABASE_URL): %w", err))
	}
	defer dst.Close()
	if err := dst.Import(threads, detector, evs); err != nil {
		if errors.Is(err, pgstore.ErrNotEmpty) {
			err = fmt.Errorf("%s: %w; migrate-store copies into an empty database only", dst.Location(), err)
		}
		return fail(err)
	}
	// Idempotency keys after the rest: the database is ours alone until this command ends
	// (Import refused one holding state), so a claim here always stores the file's entry.
	for _, k := range keys {
		if _, _, err := dst.ClaimIdempotency(k); err != nil {
			return fail(fmt.Errorf("idempotency key %q: %w", k.Key, err))
		}
	}
	fmt.Fprintf(c.stdout, "copied %s, %s, %s and %s from %s to %s\n",
		plural.Count(len(threads), "tracked thread"), plural.Count(len(detector), "detector record"),
		plural.Count(len(pending), "pending event"), plural.Count(len(dead), "dead letter"), src.Path(), dst.Location())
	fmt.Fprintf(c.stdout, "copied %s\n", plural.Count(len(keys), "idempotency key"))
	n, err := copyAudit(ctx, s.StateDir, dst)
	if err != nil {
		return fail(fmt.Errorf("audit log %s: %w (everything else was copied; the file is unchanged)", s.StateDir, err))
	}
	fmt.Fprintf(c.stdout, "copied %s from %s\n", plural.Count(n, "audit record"), s.StateDir)
	return nil
}

// copyAudit copies the state directory's audit log into the database's audit table, in batches;
// a record already there is skipped (its line's digest), so a second copy adds nothing.
func copyAudit(ctx context.Context, dir string, dst audit.Table) (int, error) {
	var batch []audit.Record
	n := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := dst.AppendAudit(ctx, batch); err != nil {
			return err
		}
		n += len(batch)
		batch = batch[:0]
		return nil
	}
	_, err := audit.Scan(dir, audit.Filter{}, func(_ []byte, r audit.Record) error {
		batch = append(batch, r)
		if len(batch) == audit.DefaultBatch {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	return n, err
}
