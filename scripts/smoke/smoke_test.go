package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/demo"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// connector runs t3code-mcp in-process behind a real 127.0.0.1 listener and
// returns its MCP URL. With cfg "" it serves the built-in demo machine, as the binary
// does without a config.
func connector(t *testing.T, cfg string, edit func(*app.Settings)) string {
	t.Helper()
	t.Chdir(t.TempDir())
	s, err := app.SettingsFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	s.ConfigPath, s.StateDir = cfg, t.TempDir()
	if edit != nil {
		edit(&s)
	}
	o := app.Options{Logger: slog.New(slog.DiscardHandler)}
	if cfg == "" {
		// What the binary does without a config.
		d, err := demo.Start()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = d.Close() })
		o.Config, o.Tokens, o.DemoMachines, s.StateDir = d.Config(), d.Tokens(), d.Machines(), d.StateDir()
	}
	a, err := app.New(s, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	srv := httptest.NewServer(a.Handler)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		cancel()
		<-done
		a.Close()
	})
	return srv.URL + "/mcp"
}

func smokeRun(t *testing.T, env map[string]string, args ...string) (int, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := run(ctx, args, func(k string) string { return env[k] }, &out, &errb)
	return code, out.String() + errb.String()
}

// The smoke program against the demo machine, as a developer runs it after
// `make run`: every step is printed with its result and it exits 0.
func TestSmokeAgainstTheDemo(t *testing.T) {
	url := connector(t, "", nil)
	code, out := smokeRun(t, nil, url, "demo", "demo")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{
		"→ connect " + url,
		"    server t3code-mcp ",
		// The machine may still be connecting at the first look (a loaded
		// machine): smoke looks again, printing each answer.
		"→ t3_machines\n",
		"    demo (built-in demo machine: a fake T3 server with scripted runs, not a real machine): online",
		"→ t3_projects machine=demo\n    demo — /srv/demo",
		`→ t3_dispatch machine=demo project=demo prompt="say hello"`,
		"    started thread thread-",
		"→ t3_wait thread_id=thread-",
		"    completed: thread ",
		"reply: Done: say hello",
		"→ t3_thread thread_id=thread-",
		"smoke: ok: thread thread-",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}

// A fake T3 machine "mac" with project "api", fast steps.
func fakeConfig(t *testing.T) string {
	t.Helper()
	fk := t3fake.StartT(t, t3fake.Options{Label: "smoke", StepDelay: time.Millisecond})
	fk.AddProject("api", "/srv/api")
	t.Setenv("T3CODE_MCP_SMOKE_TEST_TOKEN", fk.Token())
	p := filepath.Join(t.TempDir(), "t3code.toml")
	body := fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = \"T3CODE_MCP_SMOKE_TEST_TOKEN\"\n", fk.URL())
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSmokeFailures(t *testing.T) {
	cfg := fakeConfig(t)
	const bearer = "mcp-bearer-0123456789"
	url := connector(t, cfg, func(s *app.Settings) { s.Token = bearer })
	withToken := map[string]string{"T3CODE_MCP_TOKEN": bearer}

	cases := []struct {
		name string
		env  map[string]string
		args []string
		code int
		want []string
	}{
		{"a completed run, with the bearer and a -prompt", withToken, []string{"-prompt", "write the changelog", "-origin", "ci:smoke", url, "mac", "/srv/api"}, 0,
			[]string{`prompt="write the changelog"`, "reply: Done: write the changelog", "smoke: ok"}},
		{"no bearer", nil, []string{url, "mac", "api"}, 1,
			[]string{"smoke: FAILED: " + url + " requires a bearer token (HTTP 401): set T3CODE_MCP_TOKEN"}},
		{"a wrong bearer", map[string]string{"T3CODE_MCP_TOKEN": "nope"}, []string{url, "mac", "api"}, 1,
			[]string{"refused the bearer token (HTTP 401)"}},
		{"an unknown machine", withToken, []string{url, "nope", "api"}, 1,
			[]string{`smoke: FAILED: machine "nope" is not in t3_machines (it lists: mac)`}},
		{"an unknown project", withToken, []string{url, "mac", "web"}, 1,
			[]string{`smoke: FAILED: project "web" is not among machine "mac"'s projects (allowed: api)`}},
		{"a failing run", withToken, []string{"-prompt", "this will fail", url, "mac", "api"}, 1,
			[]string{"Simulated provider failure", `did not complete: t3_wait returned "failed"`}},
		{"a run that outlasts the timeout", withToken, []string{"-prompt", "hang on", "-timeout", "1", url, "mac", "api"}, 1,
			[]string{`did not complete: t3_wait returned "timeout"`}},
		{"nothing listening", nil, []string{"http://127.0.0.1:1/mcp", "mac", "api"}, 1,
			[]string{"nothing answers at http://127.0.0.1:1/mcp"}},
		{"the wrong path", withToken, []string{strings.TrimSuffix(url, "/mcp") + "/nope", "mac", "api"}, 1,
			[]string{"answered HTTP 404: the MCP endpoint is /mcp"}},
		{"missing arguments", nil, []string{url, "mac"}, 2, []string{"usage: go run ./scripts/smoke"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out := smokeRun(t, tc.env, tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q", w)
				}
			}
			if strings.Contains(out, bearer) {
				t.Errorf("the bearer is printed")
			}
			if t.Failed() {
				t.Logf("output:\n%s", out)
			}
		})
	}
}
