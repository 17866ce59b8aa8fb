package app_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// The connector listens on loopback unless told otherwise, and the limits
// come from the environment with errors that name the variable.
func TestDefaultsAreLoopbackAndBounded(t *testing.T) {
	s, err := app.SettingsFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if s.Host != "127.0.0.1" {
		t.Fatalf("default host %q, want 127.0.0.1", s.Host)
	}
	if s.Token != "" || s.MaxBodyBytes != 4<<20 || s.Limits.MaxPromptChars != 100_000 || s.Limits.MaxAnswerBytes != 64<<10 ||
		s.Limits.MaxWaits != 2000 || s.Limits.MaxWaitsPerSession != 50 || s.Limits.CallTimeout != time.Minute || s.Limits.MaxWait != time.Hour {
		t.Fatalf("defaults = %+v", s)
	}
	env := map[string]string{
		"T3CODE_MCP_MAX_BODY_BYTES":        "1024",
		"T3CODE_MCP_MAX_PROMPT_CHARS":      "10",
		"T3CODE_MCP_MAX_ANSWER_BYTES":      "20",
		"T3CODE_MCP_MAX_WAITS":             "3",
		"T3CODE_MCP_MAX_WAITS_PER_SESSION": "2",
		"T3CODE_MCP_CALL_TIMEOUT":          "2s",
		"T3CODE_MCP_MAX_WAIT":              "5m",
	}
	s, err = app.SettingsFromEnv(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if s.MaxBodyBytes != 1024 || s.Limits.MaxPromptChars != 10 || s.Limits.MaxAnswerBytes != 20 || s.Limits.MaxWaits != 3 ||
		s.Limits.MaxWaitsPerSession != 2 || s.Limits.CallTimeout != 2*time.Second || s.Limits.MaxWait != 5*time.Minute {
		t.Fatalf("from env = %+v", s)
	}
	for k := range env {
		bad := map[string]string{k: "-1"}
		if _, err := app.SettingsFromEnv(func(k string) string { return bad[k] }); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=-1: error %v does not name the variable", k, err)
		}
	}
}

// The retention settings: delivered events (T3CODE_MCP_HOOK_RETENTION),
// unwatched tracked threads (T3CODE_MCP_THREAD_RETENTION) and how often both
// are pruned (T3CODE_MCP_PRUNE_INTERVAL) come from the environment; a bad
// value names its variable.
func TestRetentionSettings(t *testing.T) {
	s, err := app.SettingsFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	if s.HookRetention != 24*time.Hour || s.ThreadRetention != 72*time.Hour || s.PruneInterval != 0 {
		t.Fatalf("defaults: hook %s, threads %s, interval %s", s.HookRetention, s.ThreadRetention, s.PruneInterval)
	}
	env := map[string]string{"T3CODE_MCP_HOOK_RETENTION": "90s", "T3CODE_MCP_THREAD_RETENTION": "2m", "T3CODE_MCP_PRUNE_INTERVAL": "15s"}
	if s, err = app.SettingsFromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if s.HookRetention != 90*time.Second || s.ThreadRetention != 2*time.Minute || s.PruneInterval != 15*time.Second {
		t.Fatalf("from env: hook %s, threads %s, interval %s", s.HookRetention, s.ThreadRetention, s.PruneInterval)
	}
	for k := range env {
		for _, v := range []string{"0", "-1s", "soon"} {
			bad := map[string]string{k: v}
			if _, err := app.SettingsFromEnv(func(k string) string { return bad[k] }); err == nil || !strings.Contains(err.Error(), k) {
				t.Errorf("%s=%s: error %v does not name the variable", k, v, err)
			}
		}
	}
}

// Every limit, exceeded through a real client, gives a clear error naming
// its variable, and the server goes on serving.
func TestLimits(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk, settings: func(s *appSettings) {
		s.MaxBodyBytes = 64 << 10
		s.Limits.MaxPromptChars = 1000
		s.Limits.MaxAnswerBytes = 512
		s.Limits.MaxWaits = 3
		s.Limits.MaxWaitsPerSession = 2
		s.Limits.CallTimeout = 2 * time.Second
		s.Limits.MaxWait = 10 * time.Minute
	}})
	h.waitOnline("mac")
	a := h.client("")

	t.Run("body", func(t *testing.T) {
		big := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t3_machines","arguments":{"pad":"` + strings.Repeat("x", 64<<10) + `"}}}`
		req, _ := http.NewRequest(http.MethodPost, h.http.URL+"/mcp", strings.NewReader(big))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "65536") {
			t.Fatalf("oversized body: %d %q", resp.StatusCode, b)
		}
		// Through a real client: the call fails with 413 (the SDK client then
		// closes that session); other sessions are unaffected.
		big2 := h.client("")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = big2.session.CallTool(ctx, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: map[string]any{"machine": "mac", "project": "api", "prompt": strings.Repeat("p", 70<<10)}})
		if err == nil || !strings.Contains(err.Error(), "Too Large") {
			t.Fatalf("oversized call: %v", err)
		}
		a.in(t).ok("t3_machines", nil)
	})

	t.Run("prompt", func(t *testing.T) {
		args := map[string]any{"machine": "mac", "project": "api", "prompt": strings.Repeat("é", 1001)}
		a := a.in(t)
		a.fails("t3_dispatch", args, "1001 characters", "limit of 1000", "T3CODE_MCP_MAX_PROMPT_CHARS")
		args["prompt"] = strings.Repeat("é", 1000) // 2000 bytes: characters count, not bytes
		a.ok("t3_dispatch", args)
	})

	hang := str(a.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": promptHang}), "thread_id")
	fk.StepAll()

	t.Run("answers", func(t *testing.T) {
		a.in(t).fails("t3_answer", map[string]any{"thread_id": hang, "answers": map[string]any{"q": strings.Repeat("a", 600)}},
			"more than the limit of 512", "T3CODE_MCP_MAX_ANSWER_BYTES")
	})

	t.Run("waits", func(t *testing.T) {
		a := a.in(t)
		b, c := h.client("").in(t), h.client("").in(t)
		type out struct {
			reason string
			err    error
		}
		results := make(chan out, 3)
		start := func(cl *client) {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				res, err := cl.session.CallTool(ctx, &mcp.CallToolParams{Name: "t3_wait", Arguments: map[string]any{"thread_id": hang, "timeout": 60}})
				o := out{err: err}
				if err == nil {
					var sc map[string]any
					raw, _ := json.Marshal(res.StructuredContent)
					_ = json.Unmarshal(raw, &sc)
					o.reason = str(sc, "reason")
					if res.IsError {
						o.reason = "error: " + resultText(res)
					}
				}
				results <- o
			}()
		}
		active := func(n int) {
			eventually(t, 10*time.Second, "waits running", func() bool { return h.app.Deps.ActiveWaits() == n }, nil)
		}
		start(a)
		start(a)
		active(2)
		a.fails("t3_wait", map[string]any{"thread_id": hang, "timeout": 60}, "this session already has 2 waits running", "T3CODE_MCP_MAX_WAITS_PER_SESSION")
		start(b)
		active(3)
		b.fails("t3_wait", map[string]any{"thread_id": hang, "timeout": 60}, "3 waits are already running", "T3CODE_MCP_MAX_WAITS")
		c.fails("t3_wait", map[string]any{"thread_id": hang, "timeout": 60}, "T3CODE_MCP_MAX_WAITS")
		// Everything else still works, and the waits end with the run.
		c.ok("t3_thread", map[string]any{"thread_id": hang})
		c.ok("t3_interrupt", map[string]any{"thread_id": hang})
		fk.StepAll()
		for range 3 {
			if o := <-results; o.err != nil || o.reason != "interrupted" {
				t.Fatalf("a wait ended with %+v", o)
			}
		}
		active(0)
		c.ok("t3_wait", map[string]any{"thread_id": hang, "timeout": 1})
		c.fails("t3_wait", map[string]any{"thread_id": hang, "timeout": 601}, "timeout must be between 1 and 600 seconds")
	})

	t.Run("call timeout", func(t *testing.T) {
		a := a.in(t)
		// With a diff, which t3_thread always reads (its default view may be
		// answered from the thread's subscription, without HTTP).
		fk.HTTPHang(true)
		a.fails("t3_thread", map[string]any{"thread_id": hang, "diff": true}, "t3_thread timed out after 2s", "did not answer in time")
		a.ok("t3_machines", nil)
		a.ok("t3_projects", map[string]any{"machine": "mac"})
		fk.HTTPHang(false)
		a.ok("t3_thread", map[string]any{"thread_id": hang})
	})

	if h.health()["ok"] != true {
		t.Fatalf("health after the limits: %v", h.health())
	}
}

// in is the client for use in a subtest (its failures belong there).
func (c *client) in(t *testing.T) *client {
	cc := *c
	cc.t = t
	return &cc
}

// knownBugs are hostile cases that expose a bug this test cannot fix: they
// are skipped, with the bug named, until it is fixed. None are open.
var knownBugs = map[string]string{}

func nest(open, close string, depth int, inner string) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

// rawJSON passes a literal JSON value through the client's encoder.
type rawJSON string

func (r rawJSON) MarshalJSON() ([]byte, error) { return []byte(r), nil }

// Hostile input through a real MCP client: every case is a clear tool error
// (or, for JSON the SDK itself refuses, a protocol error), error texts hold no
// raw control characters, nothing hostile reaches T3, and the server stays
// healthy.
func TestHostileToolInput(t *testing.T) {
	leakCheck(t)
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	h := newHarness(t, harnessOpts{fake: fk})
	h.waitOnline("mac")
	c := h.client("")
	ok := str(c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "ask a question"}), "thread_id")
	fk.StepAll()
	huge := strings.Repeat("A", 1<<20)
	ctl := "\x1b[31mred\x1b[0m\x07\r\b\x7f"
	for _, tc := range []struct {
		name, tool string
		args       any
		want       []string
		protocolOK bool // the SDK may refuse it before the tool runs
	}{
		{"huge machine", "t3_projects", map[string]any{"machine": huge}, []string{"unknown machine"}, false},
		{"huge thread id", "t3_thread", map[string]any{"thread_id": huge}, []string{"not found"}, false},
		{"huge answers key", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{huge: "x"}}, []string{"T3CODE_MCP_MAX_ANSWER_BYTES"}, false},
		{"huge model", "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "model": huge}, []string{"model"}, false},
		{"huge model with slash", "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "model": "a/" + huge}, []string{"is not available"}, false},
		{"huge project", "t3_dispatch", map[string]any{"machine": "mac", "project": huge, "prompt": "x"}, []string{"not found"}, false},
		{"huge question id", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{strings.Repeat("q", 500): "x"}}, []string{"unknown question id"}, false},
		{"huge title", "t3_dispatch", map[string]any{"machine": "nope", "project": "api", "prompt": "x", "title": huge}, []string{"unknown machine"}, false},
		{"control chars in machine", "t3_dispatch", map[string]any{"machine": ctl, "project": "api", "prompt": "x"}, []string{"unknown machine"}, false},
		{"control chars in thread id", "t3_wait", map[string]any{"thread_id": ctl}, []string{"not found"}, false},
		{"control chars in question id", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{ctl: "x"}}, []string{"unknown question id"}, false},
		{"control chars in option", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{"scope": ctl, "checks": []any{"lint"}}}, []string{"is not an option"}, false},
		{"NUL in prompt", "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "a\x00b"}, []string{"NUL"}, false},
		{"NUL in machine", "t3_projects", map[string]any{"machine": "mac\x00"}, []string{"NUL"}, false},
		{"NUL in thread id", "t3_interrupt", map[string]any{"thread_id": "\x00"}, []string{"not found"}, false},
		{"blank prompt", "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "\t\n \u00a0"}, []string{"prompt is empty"}, false},
		{"number as thread id", "t3_thread", map[string]any{"thread_id": 42}, []string{`argument "thread_id" must be a string; got the number 42`}, false},
		{"null thread id", "t3_thread", map[string]any{"thread_id": nil}, []string{`argument "thread_id" must be a string; got null`}, false},
		{"object as machine", "t3_projects", map[string]any{"machine": map[string]any{"a": 1}}, []string{`argument "machine" must be a string; got an object`}, false},
		{"string as timeout", "t3_wait", map[string]any{"thread_id": ok, "timeout": "ten"}, []string{`argument "timeout" must be a whole number; got the string "ten"`}, false},
		{"negative timeout", "t3_wait", map[string]any{"thread_id": ok, "timeout": -1}, []string{"timeout"}, false},
		{"huge timeout", "t3_wait", map[string]any{"thread_id": ok, "timeout": 1e300}, []string{"timeout"}, false},
		{"fractional timeout", "t3_wait", map[string]any{"thread_id": ok, "timeout": 1.5}, []string{`argument "timeout" must be a whole number; got the number 1.5`}, false},
		{"turns out of range", "t3_thread", map[string]any{"thread_id": ok, "turns": 1000000}, []string{"invalid arguments"}, false},
		{"string as enabled", "t3_watch", map[string]any{"thread_id": ok, "enabled": "yes"}, []string{`argument "enabled" must be true or false; got the string "yes"`}, false},
		{"string as watch", "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "watch": "no"}, []string{`argument "watch" must be true or false; got the string "no"`}, false},
		{"answers as string", "t3_answer", map[string]any{"thread_id": ok, "answers": "scope=Workspace"}, []string{`argument "answers" must be an object; got the string "scope=Workspace"`}, false},
		{"answer as number", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{"scope": 5}}, []string{`argument "answers.scope" must be a string or an array of strings; got the number 5`}, false},
		{"answer as object", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{"scope": map[string]any{}}}, []string{`argument "answers.scope" must be a string or an array of strings; got an object`}, false},
		{"empty answers", "t3_answer", map[string]any{"thread_id": ok, "answers": map[string]any{}}, []string{"answers"}, false},
		{"arguments as array", "t3_thread", []any{"thread_id", ok}, []string{"the arguments must be a JSON object; got an array"}, true},
		{"arguments as string", "t3_thread", "thread_id=" + ok, []string{"the arguments must be a JSON object; got the string"}, true},
		{"missing required", "t3_dispatch", map[string]any{}, []string{`missing argument "`}, false},
		{"path in thread id", "t3_thread", map[string]any{"thread_id": "../../../etc/passwd"}, []string{"not found"}, false},
		{"escaped path in thread id", "t3_thread", map[string]any{"thread_id": "..%2F..%2Fapi%2Fauth%2Fsession"}, []string{"not found"}, false},
		{"slash in thread id", "t3_interrupt", map[string]any{"thread_id": ok + "/../x"}, []string{"not found"}, false},
		{"percent in machine", "t3_projects", map[string]any{"machine": "%00%2e%2e"}, []string{"unknown machine"}, false},
		{"dotdot project", "t3_dispatch", map[string]any{"machine": "mac", "project": "../secret", "prompt": "x"}, []string{"not found"}, false},
		{"glob project", "t3_dispatch", map[string]any{"machine": "mac", "project": "*", "prompt": "x"}, []string{"not found"}, false},
		{"hidden project by path", "t3_dispatch", map[string]any{"machine": "mac", "project": "/srv/api/../secret", "prompt": "x"}, []string{"not found"}, false},
		{"unicode machine", "t3_projects", map[string]any{"machine": "мак\u202e\u200b"}, []string{"unknown machine"}, false},
		{"invalid UTF-8 machine", "t3_projects", rawJSON(`{"machine":"\udc00\ud800"}`), []string{"unknown machine"}, true},
		{"unicode model", "t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x", "model": "кодекс/模型"}, []string{"is not available"}, false},
		{"nested answers (500)", "t3_answer", rawJSON(`{"thread_id":"` + ok + `","answers":{"scope":` + nest("[", "]", 500, `"x"`) + `}}`), []string{`argument "answers.scope" must be a string or an array of strings; got an array`}, false},
		{"nested unknown field (5000)", "t3_thread", rawJSON(`{"thread_id":"nope","x":` + nest(`{"a":`, "}", 5000, "1") + `}`), []string{"not found"}, true},
		{"duplicate keys", "t3_thread", rawJSON(`{"thread_id":"nope","thread_id":"` + ok + `"}`), nil, true},
		{"unknown tool", "t3_rm_rf", map[string]any{}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cl := c.in(t)
			if tc.protocolOK {
				cl = h.client("").in(t) // the SDK client may close its session over it
			}
			res, err := cl.session.CallTool(ctx, &mcp.CallToolParams{Name: tc.tool, Arguments: tc.args})
			if err != nil {
				if !tc.protocolOK {
					t.Fatalf("protocol error: %v", err)
				}
				t.Logf("refused by the SDK: %.200s", err)
				return
			}
			text := resultText(res)
			if tc.want == nil { // accepted or refused, but never a crash
				if strings.Contains(text, "internal error") {
					t.Fatalf("internal error: %s", text)
				}
				return
			}
			if !res.IsError {
				t.Fatalf("succeeded: %.300s", text)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Fatalf("error %.300q does not contain %q", text, w)
				}
			}
			if strings.Contains(text, "internal error") {
				t.Fatalf("internal error: %s", text)
			}
			for _, r := range text {
				if r != '\n' && r != '\t' && (unicode.IsControl(r) || r == '\u202e') {
					t.Fatalf("error text holds a raw control character %U: %.300q", r, text)
				}
			}
			if len(text) > 8<<10 {
				if bug := knownBugs[tc.name]; bug != "" {
					t.Skipf("KNOWN BUG (%s): error text is %d bytes", bug, len(text))
				}
				t.Errorf("error text is %d bytes: it echoes the input instead of naming it", len(text))
			}
		})
	}
	// What no client library sends: raw bodies in an initialized session.
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"t3_thread","arguments":{"thread_id":"nope","x":` + nest("[", "]", 20000, "1") + `}}}`,
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"t3_thread","arguments":{"thread_id":"` + "\xff\xfe\x00" + `"}}}`,
		"{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"t3_thread\",\"arguments\":{\"thread_id\":\"\xff\xfe\"}}}",
		`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"t3_thread","arguments":{"thread_id":`,
		`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"t3_wait","arguments":{"thread_id":"x","timeout":1e999999}}}`,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"t3_thread","arguments":null}}`,
		`[` + strings.Repeat(`{"jsonrpc":"2.0","method":"notifications/progress","params":{}},`, 200) + `{}]`,
	} {
		code, out := rawSessionCall(t, h, body)
		t.Logf("raw %.50q: %d %.160s", body, code, strings.ReplaceAll(out, "\n", " "))
		if code >= 500 || strings.Contains(out, "internal error") {
			t.Errorf("raw body %.80q: %d %.300s", body, code, out)
		}
	}
	// Nothing hostile reached T3: every request it got is on a known route.
	for route, n := range fk.Stats().HTTPRequests {
		if route == "/" && n > 0 {
			t.Errorf("T3 got %d requests on unknown paths", n)
		}
	}
	if h.health()["ok"] != true {
		t.Fatalf("health after hostile input: %v", h.health())
	}
	c.ok("t3_machines", nil)
	c.ok("t3_thread", map[string]any{"thread_id": ok})
	h.client("").ok("t3_projects", map[string]any{"machine": "mac"})
}

// rawSessionCall opens a session by hand (initialize, initialized) and posts
// body in it, returning the status and the response.
func rawSessionCall(t *testing.T, h *harness, body string) (int, string) {
	t.Helper()
	post := func(session, b string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, h.http.URL+"/mcp", strings.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return resp, string(out)
	}
	resp, out := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		t.Fatalf("raw initialize: %d %s", resp.StatusCode, out)
	}
	post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	resp, out = post(session, body)
	post(session, "") // nothing
	req, _ := http.NewRequest(http.MethodDelete, h.http.URL+"/mcp", nil)
	req.Header.Set("Mcp-Session-Id", session)
	if r, err := http.DefaultClient.Do(req); err == nil {
		r.Body.Close()
	}
	return resp.StatusCode, out
}
