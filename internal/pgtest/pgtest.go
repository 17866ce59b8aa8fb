// Package pgtest gives tests a fresh PostgreSQL database of their own on the server that
// T3CODE_MCP_TEST_DATABASE_URL names (scripts/pg starts a throwaway one; `make check` and .ci/run
// do that for you).
//
// Without the variable, or when the server does not answer, a test that asks for a database is
// skipped with a message saying how to get one, except under CI=true, where it fails: CI starts
// the server itself, so a skipped PostgreSQL test there would hide a broken setup.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// envURL names the variable holding the URL of a PostgreSQL server the tests may create and drop
// databases on (a superuser, or a role with CREATEDB).
const envURL = "T3CODE_MCP_TEST_DATABASE_URL"

const howTo = "set " + envURL + " to a PostgreSQL server's URL, or run `make check` (it starts a throwaway server with scripts/pg when PostgreSQL is installed)"

// serverURL is the URL of the test server, or the test is skipped (failed under CI=true) when
// there is none or it does not answer.
func serverURL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(envURL)
	if u == "" {
		unavailable(tb, envURL+" is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		unavailable(tb, fmt.Sprintf("PostgreSQL at %s does not answer: %v", redact(u), err))
	}
	_ = conn.Close(ctx)
	return u
}

// New creates an empty database for this test and returns its URL; the database is dropped when
// the test ends (connections still open to it are ended). Skips or fails as ServerURL does.
func New(tb testing.TB) string {
	tb.Helper()
	server := serverURL(tb)
	name := "t3test_" + randomHex()
	// FILE_COPY: copying the template's files is much faster than WAL-logging them (PostgreSQL
	// 15's default) and a test database needs no crash safety.
	admin(tb, server, "CREATE DATABASE "+name+" STRATEGY FILE_COPY")
	tb.Cleanup(func() { admin(tb, server, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)") })
	u, err := withDatabase(server, name)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

// withDatabase returns the server URL with its database replaced by name.
func withDatabase(serverURL, name string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("pgtest: %s must be a postgres:// URL", envURL)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func admin(tb testing.TB, server, sql string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		tb.Fatalf("pgtest: connect to %s: %v", redact(server), err)
	}
	defer func() { _ = conn.Close(ctx) }()
	if _, err := conn.Exec(ctx, sql); err != nil {
		tb.Fatalf("pgtest: %s: %v", sql, err)
	}
}

func unavailable(tb testing.TB, why string) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("pgtest: %s; CI must provide PostgreSQL (.ci/run starts one with scripts/pg)", why)
	}
	tb.Skipf("pgtest: %s; %s", why, howTo)
}

// redact drops a password from a URL before it is printed.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Server is a PostgreSQL server of one test's own, started with scripts/pg, for tests that must
// stop or restart the database under load. It is stopped and removed when the test ends.
type Server struct {
	URL    string // the postgres database on it (create your own with CREATE DATABASE, or use it)
	dir    string
	script string
}

// StartServer starts a throwaway server. It is skipped (failed under CI=true) when PostgreSQL is
// not installed.
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	script, err := scriptPath()
	if err != nil {
		tb.Fatal(err)
	}
	if err := exec.Command(script, "bindir").Run(); err != nil {
		unavailable(tb, "PostgreSQL is not installed (scripts/pg install)")
	}
	// Not t.TempDir: as root the server runs as the postgres user, which must reach the directory.
	dir, err := os.MkdirTemp("", "t3code-pgtest-")
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{dir: dir, script: script}
	tb.Cleanup(func() { _ = exec.Command(script, "stop", dir).Run() })
	out, err := exec.Command(script, "start", dir).Output()
	if err != nil {
		tb.Fatalf("pgtest: scripts/pg start: %v", err)
	}
	s.URL = strings.TrimSpace(string(out))
	return s
}

// Restart stops the server (fast shutdown: every connection is cut) and starts it again on the
// same port with the same data.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if out, err := exec.Command(s.script, "restart", s.dir).CombinedOutput(); err != nil {
		tb.Fatalf("pgtest: scripts/pg restart: %v\n%s", err, out)
	}
}

// scriptPath finds scripts/pg from the module root above the working directory.
func scriptPath() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "scripts", "pg"), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("pgtest: no go.mod above the working directory")
		}
		dir = parent
	}
}
