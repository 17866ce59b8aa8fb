package app_test

import (
	"net"
	neturl "net/url"
	"strings"
	"testing"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/pgtest"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
)

const secretDBPassword = "DB-PASSWORD-SECRET-5e6f7a"

// withDBPassword puts secretDBPassword into a database URL (the test server trusts loopback, so
// it is accepted and ignored).
func withDBPassword(t *testing.T, raw string) string {
	t.Helper()
	u, err := neturl.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.User = neturl.UserPassword(u.User.Username(), secretDBPassword)
	return u.String()
}

// TestDatabaseURLSelectsPostgreSQL: T3CODE_MCP_DATABASE_URL puts the state in PostgreSQL (the
// tools' tracked threads land in the database, not in a file), and the URL's password reaches
// neither the logs, /healthz, /metrics nor a tool result.
func TestDatabaseURLSelectsPostgreSQL(t *testing.T) {
	leakCheck(t)
	dbURL := withDBPassword(t, pgtest.New(t))
	h := newHarness(t, harnessOpts{hook: true, settings: func(s *appSettings) { s.DatabaseURL = dbURL }})
	pg, ok := h.app.Store.(*pgstore.Store)
	if !ok {
		t.Fatalf("the store is a %T, want *pgstore.Store", h.app.Store)
	}
	if strings.Contains(pg.Location(), secretDBPassword) {
		t.Fatalf("Location shows the password: %s", pg.Location())
	}
	h.waitOnline("mac")
	c := h.client("db-test")
	out, isErr := c.callRaw("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "hello"})
	if isErr {
		t.Fatalf("t3_dispatch: %s", out)
	}
	threads, err := pg.ListThreads()
	if err != nil || len(threads) != 1 || threads[0].Machine != "mac" {
		t.Fatalf("tracked threads in the database = %+v %v", threads, err)
	}
	results := []string{out}
	for _, tool := range []string{"t3_machines", "t3_threads"} {
		r, _ := c.callRaw(tool, map[string]any{"machine": "mac"})
		results = append(results, r)
	}
	for where, data := range map[string]string{
		"tool results": strings.Join(results, "\n"),
		"/healthz":     string(httpGet(t, h.http.URL+"/healthz")),
		"/metrics":     string(httpGet(t, h.http.URL+"/metrics")),
		"the logs":     h.logs.String(),
	} {
		if strings.Contains(data, secretDBPassword) {
			t.Errorf("%s show the database password", where)
		}
	}
}

// TestDatabaseURLErrorsHideThePassword: a malformed URL and an unreachable database fail with
// errors that name T3CODE_MCP_DATABASE_URL and never hold the password.
func TestDatabaseURLErrorsHideThePassword(t *testing.T) {
	_, err := app.SettingsFromEnv(func(k string) string {
		if k == "T3CODE_MCP_DATABASE_URL" {
			return "mysql://u:" + secretDBPassword + "@db/x"
		}
		return ""
	})
	if err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_DATABASE_URL") || strings.Contains(err.Error(), secretDBPassword) {
		t.Fatalf("a non-postgres URL: %v", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	s, err := app.SettingsFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	s.DatabaseURL = "postgres://app:" + secretDBPassword + "@" + addr + "/db?sslmode=disable&connect_timeout=5"
	_, err = app.OpenStore(s)
	if err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_DATABASE_URL") || strings.Contains(err.Error(), secretDBPassword) {
		t.Fatalf("an unreachable database: %v", err)
	}
}
