package pgstore

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/t3code-mcp/t3code-mcp/internal/lease"
)

// migrations are the schema's steps, migrations/NNNN_name.sql, applied in number order. A step
// is never edited once landed: a change is a new file.
//
//go:embed migrations/*.sql
var migrations embed.FS

// goSteps are steps whose SQL lives beside the Go code that uses it, by version. They are as
// immutable as the files: a change is a new step.
var goSteps = map[int]step{
	2: {version: 2, name: "0002_leases (internal/lease/schema.sql)", sql: lease.Schema},
}

// migrateLock is the advisory lock held while migrating, so replicas starting together migrate
// once (the others wait, then find nothing to do).
const migrateLock = 0x7433_6d69_6772_6174 // "t3migrat"

type step struct {
	version int
	name    string
	sql     string
}

func steps() ([]step, error) {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	var out []step
	for _, n := range names {
		base := strings.TrimPrefix(n, "migrations/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: the name must be NNNN_name.sql", base)
		}
		b, err := migrations.ReadFile(n)
		if err != nil {
			return nil, err
		}
		out = append(out, step{version: v, name: base, sql: string(b)})
	}
	for _, st := range goSteps {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i := range out {
		if out[i].version != i+1 {
			return nil, fmt.Errorf("migration %s: versions must run 1, 2, 3… without gaps or repeats", out[i].name)
		}
	}
	return out, nil
}

// Latest is the schema version this binary's migrations reach.
func Latest() int {
	s, err := steps()
	if err != nil {
		return 0
	}
	return len(s)
}

// Migrate applies the migrations the database lacks, all in one transaction under an advisory
// lock: a failed step leaves the database as it was. A database at a version newer than this
// binary knows is refused.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	all, err := steps()
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
			return fmt.Errorf("migrating: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS t3_schema_version (
			version    integer PRIMARY KEY,
			name       text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("migrating: %w", err)
		}
		var have int
		if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM t3_schema_version`).Scan(&have); err != nil {
			return fmt.Errorf("migrating: %w", err)
		}
		if have > len(all) {
			return fmt.Errorf("the database was migrated by a newer t3code-mcp (schema %d, this binary knows %d)", have, len(all))
		}
		for _, st := range all[have:] {
			if _, err := tx.Exec(ctx, st.sql); err != nil {
				return fmt.Errorf("migration %s: %w", st.name, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO t3_schema_version (version, name) VALUES ($1, $2)`, st.version, st.name); err != nil {
				return fmt.Errorf("migration %s: %w", st.name, err)
			}
		}
		return nil
	})
}
