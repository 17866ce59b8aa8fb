package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

// TestDoctorReportsTheSchemaWithoutMigrating: with a database URL, doctor reports the schema
// version and the migrations a start would apply — for an empty database, one a migration
// behind, a current one and one a newer binary migrated — and never changes the database.
func TestDoctorReportsTheSchemaWithoutMigrating(t *testing.T) {
	ctx := context.Background()
	clearEnv(t)
	t.Setenv("T3CODE_MCP_CONFIG", "")
	dbURL := pgtest.New(t)
	t.Setenv("T3CODE_MCP_DATABASE_URL", dbURL)
	latest := pgstore.Latest()
	exec := func(sql string, args ...any) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	version := func() (v int, tables int) {
		t.Helper()
		conn, err := pgx.Connect(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables > 0 {
			if err := conn.QueryRow(ctx, `SELECT max(version) FROM t3_schema_version`).Scan(&v); err != nil {
				t.Fatal(err)
			}
		}
		return v, tables
	}
	doctor := func(wantCode int, want ...string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := run([]string{"doctor"}, &out, &errb)
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("doctor's report lacks %q:\n%s", w, out.String())
			}
		}
		if code != wantCode {
			t.Errorf("exit %d, want %d:\n%s%s", code, wantCode, out.String(), errb.String())
		}
	}

	doctor(0, "  ok    database postgres://", "holds no connector schema yet: serve creates it at start ("+fmt.Sprint(latest)+" migrations)")
	if v, tables := version(); v != 0 || tables != 0 {
		t.Fatalf("doctor changed the empty database: schema %d, %d tables", v, tables)
	}

	s, err := pgstore.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	doctor(0, fmt.Sprintf(": schema %d (current)", latest), ": 0 threads tracked, 0 events pending")

	// One migration behind, as a database the previous release left says it is (its tables stay:
	// doctor reads the version, not them).
	exec(`DELETE FROM t3_schema_version WHERE version = $1`, latest)
	doctor(0, "  warn  database postgres://", fmt.Sprintf(": schema %d of %d; serve applies 1 pending migration at start: %04d_", latest-1, latest, latest),
		": 0 threads tracked")
	if v, _ := version(); v != latest-1 {
		t.Fatalf("doctor migrated the database to %d", v)
	}

	exec(`INSERT INTO t3_schema_version (version, name) VALUES ($1, 'future')`, latest+1)
	doctor(1, "  FAIL  database postgres://", fmt.Sprintf(": schema %d was migrated by a newer t3code-mcp (this binary knows %d", latest+1, latest))
}
