package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// settingVars are every variable SettingsFromEnv reads; tests clear them so a
// developer's own settings never change a result.
var settingVars = []string{
	"T3CODE_MCP_CONFIG", "T3CODE_MCP_HOST", "T3CODE_MCP_PORT", "T3CODE_MCP_STATE_DIR", "T3CODE_MCP_TOKEN",
	"T3CODE_MCP_HOOK_URL", "T3CODE_MCP_HOOK_TOKEN", "T3CODE_MCP_HOOK_SECRET", "T3CODE_MCP_HOOK_MAX_AGE",
	"T3CODE_MCP_ORIGIN", "T3CODE_MCP_SESSION_TIMEOUT", "T3CODE_MCP_MAX_BODY_BYTES", "T3CODE_MCP_MAX_PROMPT_CHARS",
	"T3CODE_MCP_MAX_ANSWER_BYTES", "T3CODE_MCP_MAX_WAITS", "T3CODE_MCP_MAX_WAITS_PER_SESSION", "T3CODE_MCP_MAX_WAIT",
	"T3CODE_MCP_CALL_TIMEOUT", "T3CODE_MCP_T3_TIMEOUT", "T3CODE_MCP_LOG_FORMAT", "T3CODE_MCP_LOG_LEVEL",
	"T3CODE_MCP_READ_ONLY", "T3CODE_MCP_AUDIT_MAX_BYTES", "T3CODE_MCP_AUDIT_KEEP",
	"T3CODE_MCP_HOOK_ENRICH_TIMEOUT", "T3CODE_MCP_THREAD_RETENTION", "T3CODE_MCP_HOOK_RETENTION", "T3CODE_MCP_PRUNE_INTERVAL",
	"T3CODE_MCP_HEAP_RESERVE_MB",
}

func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range settingVars {
		t.Setenv(k, "")
	}
	t.Setenv("T3CODE_MCP_STATE_DIR", filepath.Join(t.TempDir(), "state"))
	// doctor tries the listen address: never the shared default 8000.
	t.Setenv("T3CODE_MCP_PORT", fmt.Sprint(freePort(t)))
}

// startFake is a protocol-2 fake T3 with two projects.
func startFake(t *testing.T) *t3fake.Server {
	return startFakeWith(t, t3fake.Options{Label: "doc-env", StepDelay: time.Millisecond})
}

func startFakeWith(t *testing.T, o t3fake.Options) *t3fake.Server {
	t.Helper()
	fk := t3fake.StartT(t, o)
	fk.AddProject("api", "/srv/api")
	fk.AddProject("secret", "/srv/secret")
	return fk
}

// scopeProxy fronts fk and adds scopes to what /api/auth/session reports, as
// T3 does for a token issued with more scopes than t3code-mcp needs. Every
// other request, the WebSocket upgrade included, passes through.
func scopeProxy(t *testing.T, fk *t3fake.Server, extra ...string) string {
	t.Helper()
	target, err := url.Parse(fk.URL())
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(r *http.Response) error {
		if r.Request.URL.Path != "/api/auth/session" {
			return nil
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			return err
		}
		r.Body.Close()
		scopes, _ := body["scopes"].([]any)
		for _, s := range extra {
			scopes = append(scopes, s)
		}
		body["scopes"] = scopes
		b, _ := json.Marshal(body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		r.Header.Set("Content-Length", fmt.Sprint(len(b)))
		return nil
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}

// closedURL is an http URL on 127.0.0.1 where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String()
	ln.Close()
	return u
}

// hookServer answers HEAD with status (and Location for a redirect).
func hookServer(t *testing.T, status int) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status >= 300 && status < 400 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/hook"
}

const docTokenEnv = "T3_DOC_TOKEN"

// useConfig writes a one-machine config and points T3CODE_MCP_CONFIG at it.
func useConfig(t *testing.T, url, extra string) {
	t.Helper()
	t.Setenv("T3CODE_MCP_CONFIG", writeConfig(t, url, docTokenEnv, extra))
}

func TestDoctor(t *testing.T) {
	good := startFake(t)
	const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	cases := []struct {
		name  string
		setup func(t *testing.T)
		code  int
		want  []string
		never []string
	}{{
		name: "a good machine, hook unset",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), `projects = ["api"]`)
			t.Setenv(docTokenEnv, good.Token())
		},
		want: []string{
			"config: ", "(1 machine)",
			fmt.Sprintf("machine \"mac\" (%s)", good.URL()),
			"  ok    token variable T3_DOC_TOKEN is set",
			`  ok    T3 Code 0.1.0 answers (environment "doc-env", orchestration protocol 2)`,
			"  ok    the token is valid and has orchestration:read and orchestration:operate",
			"  ok    the WebSocket (/ws) works; providers ready: codex",
			`  ok    the allowlist (projects = ["api"]) admits 1 of 2 projects: api (/srv/api)`,
			"  warn  T3CODE_MCP_HOOK_URL is not set: no events are sent (t3_wait still works)",
			"  ok    serve listens on 127.0.0.1:", " (this host only); /mcp needs no token", "  ok    the listen address 127.0.0.1:",
			"  ok    no state file yet at ",
			"doctor: all good, 1 warning above",
		},
		never: []string{"FAIL"},
	}, {
		name:  "the token variable is unset",
		setup: func(t *testing.T) { useConfig(t, good.URL(), "") },
		code:  1,
		want: []string{
			`  FAIL  machine "mac": environment variable T3_DOC_TOKEN (token_env) is not set: export it with the machine's token (` + "`t3 auth session issue",
			"doctor: problems found",
		},
	}, {
		name: "a wrong token",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, "wrong-token-value-0123456789")
		},
		code: 1,
		want: []string{
			"  ok    T3 Code 0.1.0 answers",
			"  FAIL  the token in T3_DOC_TOKEN is not valid on this machine (wrong, expired or revoked); issue a new one there: t3 auth session issue --scope orchestration:read --scope orchestration:operate --token-only --ttl 365d --label t3code-mcp",
		},
		never: []string{"wrong-token-value-0123456789"},
	}, {
		name: "a revoked token (T3 refuses every credential)",
		setup: func(t *testing.T) {
			fk := startFake(t)
			fk.SetUnauthorized(true)
			useConfig(t, fk.URL(), "")
			t.Setenv(docTokenEnv, fk.Token())
		},
		code: 1,
		want: []string{"  FAIL  the token in T3_DOC_TOKEN is not valid on this machine"},
	}, {
		name: "an old protocol-1 machine",
		setup: func(t *testing.T) {
			fk := startFakeWith(t, t3fake.Options{Label: "old", Protocol: 1})
			useConfig(t, fk.URL(), "")
			t.Setenv(docTokenEnv, fk.Token())
		},
		code: 1,
		want: []string{`  FAIL  machine "mac" runs T3 Code 0.0.45 (orchestration protocol 1); t3code-mcp needs T3 Code 0.1.0 or later (protocol 2)`},
	}, {
		name: "an unreachable machine",
		setup: func(t *testing.T) {
			u := closedURL(t)
			useConfig(t, u, "")
			t.Setenv(docTokenEnv, "some-token-value-0123456789")
		},
		code: 1,
		want: []string{`  FAIL  machine "mac" at http://127.0.0.1:`, "is unreachable (", "connection refused)"},
	}, {
		name: "a token with extra scopes",
		setup: func(t *testing.T) {
			useConfig(t, scopeProxy(t, good, "terminal:operate", "access:write"), `projects = ["api"]`)
			t.Setenv(docTokenEnv, good.Token())
		},
		want: []string{
			"  ok    the token is valid and has orchestration:read and orchestration:operate",
			"  warn  the token also has terminal:operate, access:write: only orchestration:read and orchestration:operate are needed; a narrower token limits what a leak could do",
			"  ok    the WebSocket (/ws) works",
			"doctor: all good, 2 warnings above",
		},
	}, {
		name: "a read-only token on an operate machine",
		setup: func(t *testing.T) {
			fk := startFakeWith(t, t3fake.Options{Label: "ro", ReadOnlyToken: "read-only-token-0123456789"})
			useConfig(t, fk.URL(), "")
			t.Setenv(docTokenEnv, fk.ReadOnlyToken())
		},
		code: 1,
		want: []string{"  FAIL  the token lacks scope orchestration:operate; issue one on the machine with: t3 auth session issue"},
	}, {
		name: "a read-only token on a read-only machine",
		setup: func(t *testing.T) {
			fk := startFakeWith(t, t3fake.Options{Label: "ro", ReadOnlyToken: "read-only-token-0123456789"})
			useConfig(t, fk.URL(), `access = "read"`)
			t.Setenv(docTokenEnv, fk.ReadOnlyToken())
		},
		want:  []string{"  ok    the token is valid and has orchestration:read\n", "doctor: all good"},
		never: []string{"FAIL", "also has"},
	}, {
		name: "an allowlist admitting nothing",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), `projects = ["nothing-*"]`)
			t.Setenv(docTokenEnv, good.Token())
		},
		want: []string{`  warn  the allowlist (projects = ["nothing-*"]) admits none of the 2 projects on this machine: agents will see no project there`},
	}, {
		name: "a configured model that is available",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), `model = "codex/gpt-5.6-sol"`+"\n"+`options = { reasoningEffort = "high" }`)
			t.Setenv(docTokenEnv, good.Token())
		},
		want: []string{"  ok    model codex/gpt-5.6-sol is available"},
	}, {
		name: "a configured model that is switched off",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), `model = "claudeAgent/claude-opus-5"`)
			t.Setenv(docTokenEnv, good.Token())
		},
		code: 1,
		want: []string{"  FAIL  model claudeAgent/claude-opus-5 (t3code.toml) is not available on this machine, so t3_dispatch would refuse every new thread; available: codex/gpt-5.6-sol, codex/gpt-5.6-mini"},
	}, {
		name: "a model option the model does not have",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), `model = "codex/gpt-5.6-sol"`+"\n"+`options = { bogus = "x" }`)
			t.Setenv(docTokenEnv, good.Token())
		},
		code: 1,
		want: []string{`  FAIL  model codex/gpt-5.6-sol has no option "bogus"`},
	}, {
		name: "the WebSocket is refused",
		setup: func(t *testing.T) {
			fk := startFake(t)
			fk.RefuseTickets(true)
			useConfig(t, fk.URL(), "")
			t.Setenv(docTokenEnv, fk.Token())
		},
		code: 1,
		want: []string{"  ok    the token is valid", "  FAIL  the WebSocket (/ws) does not open: "},
	}, {
		name: "a hook that answers, signed",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOOK_URL", hookServer(t, http.StatusNoContent))
			t.Setenv("T3CODE_MCP_HOOK_SECRET", hookSecret)
		},
		want: []string{
			"  ok    T3CODE_MCP_HOOK_SECRET is a valid Standard Webhooks secret: deliveries are signed",
			"  ok    the hook URL answers (HTTP 204 to HEAD)",
			"doctor: all good\n",
		},
		never: []string{hookSecret, "warn"},
	}, {
		name: "a hook that does not answer",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOOK_URL", closedURL(t)+"/hook?key=hook-url-credential")
		},
		code: 1,
		want: []string{
			"  warn  T3CODE_MCP_HOOK_SECRET is not set",
			"  FAIL  the hook URL (T3CODE_MCP_HOOK_URL) does not answer: ", "connection refused; events queue up and are retried for T3CODE_MCP_HOOK_MAX_AGE (24h0m0s), then become dead letters",
		},
		never: []string{"hook-url-credential"},
	}, {
		name: "a hook that redirects",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOOK_URL", hookServer(t, http.StatusFound))
		},
		code: 1,
		want: []string{"  FAIL  the hook URL redirects (HTTP 302 to HEAD): deliveries do not follow redirects and would become dead letters; set T3CODE_MCP_HOOK_URL to the final URL"},
	}, {
		name: "a hook that refuses the token",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOOK_URL", hookServer(t, http.StatusUnauthorized))
		},
		want: []string{"  warn  the hook URL answers HTTP 401 to HEAD: if the receiver checks the bearer, T3CODE_MCP_HOOK_TOKEN is wrong or unset"},
	}, {
		name: "a malformed hook secret",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOOK_URL", hookServer(t, http.StatusOK))
			t.Setenv("T3CODE_MCP_HOOK_SECRET", "whsec_c2hvcnQ=")
		},
		code:  1,
		want:  []string{"  FAIL  T3CODE_MCP_HOOK_SECRET decodes to 5 bytes; Standard Webhooks secrets are 24 to 64 random bytes"},
		never: []string{"c2hvcnQ"},
	}, {
		name: "no config at all: serve will start the demo",
		setup: func(t *testing.T) {
			t.Chdir(t.TempDir())
		},
		want: []string{"  warn  no config: T3CODE_MCP_CONFIG (--config) is unset and there is no ./t3code.toml, so `serve` will start the built-in demo machine", "doctor: all good, 2 warnings above"},
	}, {
		name: "a URL that is not t3 serve (404 at the descriptor)",
		setup: func(t *testing.T) {
			srv := httptest.NewServer(http.NotFoundHandler())
			t.Cleanup(srv.Close)
			useConfig(t, srv.URL, "")
			t.Setenv(docTokenEnv, good.Token())
		},
		code: 1,
		want: []string{"answers HTTP 404 at /.well-known/t3/environment, the descriptor every `t3 serve` answers: the url probably does not point at `t3 serve`; check the host and port"},
	}, {
		name: "the listen address is taken",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			t.Setenv("T3CODE_MCP_PORT", fmt.Sprint(ln.Addr().(*net.TCPAddr).Port))
		},
		code: 1,
		want: []string{"  FAIL  serve cannot listen on 127.0.0.1:", "address already in use; another process has it: stop that one or pick another T3CODE_MCP_PORT (--port)"},
	}, {
		name: "the listen address is a running t3code-mcp",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = w.Write([]byte("t3code-mcp v1: MCP at /mcp, health at /healthz, metrics at /metrics\n"))
			}))
			t.Cleanup(srv.Close)
			t.Setenv("T3CODE_MCP_PORT", fmt.Sprint(srv.Listener.Addr().(*net.TCPAddr).Port))
		},
		want: []string{"  warn  a t3code-mcp already serves on 127.0.0.1:"},
	}, {
		name: "a config with an unknown key",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), `colour = "blue"`)
		},
		code: 1,
		want: []string{"  FAIL  ", "colour"},
	}, {
		name: "a bad setting",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_PORT", "abc")
		},
		code: 1,
		want: []string{"settings\n", `  FAIL  T3CODE_MCP_PORT="abc": want a positive whole number`, "  ok    T3 Code 0.1.0 answers"},
	}, {
		name: "listening on every interface without a token",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOST", "0.0.0.0")
		},
		want: []string{"  warn  serve listens on 0.0.0.0:", " and T3CODE_MCP_TOKEN is not set: anyone who can reach that port can start threads"},
	}, {
		name: "listening on every interface with a token",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			t.Setenv("T3CODE_MCP_HOST", "0.0.0.0")
			t.Setenv("T3CODE_MCP_TOKEN", "mcp-bearer-0123456789")
		},
		want:  []string{"  ok    serve listens on 0.0.0.0:", "; /mcp requires the bearer in T3CODE_MCP_TOKEN"},
		never: []string{"mcp-bearer-0123456789"},
	}, {
		name: "a state file with a dead letter",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			st, err := store.Open(os.Getenv("T3CODE_MCP_STATE_DIR"))
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if err := st.Commit(store.Batch{Events: []store.Event{{ID: "evt_1", Stream: "mac/thread-1", Body: []byte(`{}`), CreatedAt: now, EnqueuedAt: now}}}); err != nil {
				t.Fatal(err)
			}
			if errs, err := st.Record([]store.Op{{ID: "evt_1", Kind: store.OpDead, At: now, Error: "HTTP 401"}}); err != nil || errs[0] != nil {
				t.Fatal(err, errs)
			}
			st.Close()
		},
		want: []string{
			"t3code-mcp.db: 0 threads tracked, 0 events pending",
			"  warn  1 dead letter (events the hook never accepted): `t3code-mcp dead-letters` lists them, `t3code-mcp dead-letters retry` requeues them",
		},
	}, {
		name: "a state file held by a running connector",
		setup: func(t *testing.T) {
			useConfig(t, good.URL(), "")
			t.Setenv(docTokenEnv, good.Token())
			st, err := store.Open(os.Getenv("T3CODE_MCP_STATE_DIR"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
		},
		want: []string{"t3code-mcp.db is in use by a running t3code-mcp"},
	}, {
		name: "two machines, one of them down",
		setup: func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "t3code.toml")
			body := fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = %q\n\n[machines.box]\nurl = %q\ntoken_env = %q\n", good.URL(), docTokenEnv, closedURL(t), docTokenEnv)
			if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
				t.Fatal(err)
			}
			t.Setenv("T3CODE_MCP_CONFIG", p)
			t.Setenv(docTokenEnv, good.Token())
		},
		code: 1,
		want: []string{"(2 machines)", `machine "box" (http://127.0.0.1:`, `  FAIL  machine "box" at `, `machine "mac" (`, "  ok    the WebSocket (/ws) works"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clearEnv(t)
			tc.setup(t)
			var out, errb bytes.Buffer
			code := run([]string{"doctor"}, &out, &errb)
			report := out.String()
			if code != tc.code {
				t.Errorf("exit code %d, want %d", code, tc.code)
			}
			for _, w := range tc.want {
				if !strings.Contains(report, w) {
					t.Errorf("report lacks %q", w)
				}
			}
			for _, n := range append(tc.never, good.Token()) {
				if strings.Contains(report+errb.String(), n) {
					t.Errorf("report contains %q", n)
				}
			}
			if failed := strings.Contains(report, "  FAIL  "); failed != (code != 0) {
				t.Errorf("FAIL lines %v but exit code %d", failed, code)
			}
			if t.Failed() {
				t.Logf("report:\n%s\nstderr:\n%s", report, errb.String())
			}
		})
	}
}
