package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestNewGivesAnEmptyDatabaseOfItsOwn proves each call yields a distinct, empty, writable database
// and that it is gone after the test that created it.
func TestNewGivesAnEmptyDatabaseOfItsOwn(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		a, b := New(t), New(t)
		if a == b {
			t.Fatalf("two calls gave the same database %s", a)
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = conn.Close(ctx) }()
		var tables int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Fatalf("fresh database has %d tables", tables)
		}
		if _, err := conn.Exec(ctx, `CREATE TABLE x (id int)`); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&name); err != nil {
			t.Fatal(err)
		}
	})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, serverURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if name == "" || n != 0 {
		t.Fatalf("database %q still exists after its test ended (%d)", name, n)
	}
}

func TestWithDatabaseReplacesOnlyTheDatabase(t *testing.T) {
	got, err := withDatabase("postgres://u:p@127.0.0.1:5432/postgres?sslmode=disable", "t3test_x")
	if err != nil {
		t.Fatal(err)
	}
	if want := "postgres://u:p@127.0.0.1:5432/t3test_x?sslmode=disable"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if _, err := withDatabase("host=/tmp dbname=x", "y"); err == nil {
		t.Fatal("a keyword/value string was accepted")
	}
}

// TestAServerOfItsOwnRestarts: the test's own server answers, is cut off by a restart, and answers
// again on the same URL with its data.
func TestAServerOfItsOwnRestarts(t *testing.T) {
	s := StartServer(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, `CREATE TABLE kept (v int); INSERT INTO kept VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	if _, err := conn.Exec(ctx, `SELECT 1`); err == nil {
		t.Fatal("a connection from before the restart still works")
	}
	_ = conn.Close(ctx)
	conn, err = pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close(ctx) }()
	var v int
	if err := conn.QueryRow(ctx, `SELECT v FROM kept`).Scan(&v); err != nil || v != 42 {
		t.Fatalf("after the restart: %d %v", v, err)
	}
}
