package app_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/server"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// Distinctive values, so that any appearance anywhere is unmistakable.
const (
	secretMachineToken = "t3tok-MACHINE-SECRET-4f1e9a7c5d"
	secretWrongToken   = "t3tok-WRONGTOKEN-SECRET-77aa21"
	secretInbound      = "mcp-INBOUND-SECRET-c0ffee4242"
	secretHookToken    = "hook-TOKEN-SECRET-9b8a6e"
	secretHookRaw      = "HOOKSECRET-RAWBYTES-0123" // 24 bytes: the signing key itself
)

var secretHookB64 = base64.StdEncoding.EncodeToString([]byte(secretHookRaw))

// secrets lists every form a secret could leak in.
func secrets() map[string]string {
	return map[string]string{
		"machine token":               secretMachineToken,
		"wrong machine token":         secretWrongToken,
		"T3CODE_MCP_TOKEN":            secretInbound,
		"hook token":                  secretHookToken,
		"hook secret":                 "whsec_" + secretHookB64,
		"hook secret (base64)":        secretHookB64,
		"hook secret (decoded)":       secretHookRaw,
		"machine token (JSON-quoted)": strings.Trim(mustJSON(secretMachineToken), `"`),
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// found lists the secrets in data, each with some context.
func found(data []byte) []string {
	s := string(data)
	var out []string
	for name, v := range secrets() {
		if i := strings.Index(s, v); i >= 0 {
			lo, hi := max(0, i-120), min(len(s), i+len(v)+60)
			out = append(out, fmt.Sprintf("the %s: …%s…", name, s[lo:hi]))
		}
	}
	return out
}

// leaks reports every secret found in data, naming where.
func leaks(t *testing.T, where string, data []byte) {
	t.Helper()
	for _, f := range found(data) {
		t.Errorf("%s leaks %s", where, f)
	}
}

// authClient is client() with an Authorization header.
func (h *harness) authClient(origin, token string) *client {
	h.t.Helper()
	c := &client{t: h.t, progress: make(chan *mcp.ProgressNotificationParams, 100)}
	mc := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, nil)
	hdr := http.Header{}
	if origin != "" {
		hdr.Set("X-Conversation-Origin", origin)
	}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	tr := &mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{Transport: headerRT{hdr, http.DefaultTransport}}}
	s, err := mc.Connect(context.Background(), tr, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	c.session = s
	h.t.Cleanup(func() { s.Close() })
	return c
}

// callRaw calls a tool and returns the whole result as JSON (text, structured
// content, everything), for scanning.
func (c *client) callRaw(name string, args any) (string, bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := c.session.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return "protocol error: " + err.Error(), true
	}
	b, _ := json.Marshal(res)
	return string(b), res.IsError
}

func httpGet(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// TestSecretsNeverLeak runs every tool through its success and error paths,
// a webhook delivery cycle (with a receiver that echoes credentials in its
// error pages), T3 faults and a recovered panic, all with distinctive
// credentials; then looks for them everywhere the connector writes: tool
// results (text and structured), debug logs, /healthz, /metrics, every file
// in the state directory, and the webhooks (whose Authorization header is
// the only place the hook token may be).
func TestSecretsNeverLeak(t *testing.T) {
	leakCheck(t)
	for _, v := range secrets() {
		if len(found([]byte("x"+v+"y"))) == 0 {
			t.Fatalf("the scanner misses %q", v)
		}
	}
	fk := t3fake.StartT(t, t3fake.Options{Label: "mac-env", Token: secretMachineToken, ManualSteps: true})
	fk.AddProject("api", "/srv/api")
	t.Setenv("T3CODE_MCP_TEST_WRONG_TOKEN", secretWrongToken)
	extra := fmt.Sprintf("[machines.bad]\nurl = %q\ntoken_env = \"T3CODE_MCP_TEST_WRONG_TOKEN\"\n", fk.URL()) +
		fmt.Sprintf("[machines.ro]\nurl = %q\ntoken_env = %q\naccess = \"read\"\n", fk.URL(), macTokenEnv) +
		fmt.Sprintf("[machines.gated]\nurl = %q\ntoken_env = %q\nprojects = [\"api\"]\napprove = [\"dispatch\", \"interrupt\", \"answer\"]\n", fk.URL(), macTokenEnv) +
		"[machines.nokey]\nurl = \"http://127.0.0.1:1\"\ntoken_env = \"T3CODE_MCP_TEST_UNSET_VAR\"\n"

	// The receiver rejects the first deliveries with pages echoing what it got.
	hl := newHookLogWith(t, secretHookToken, "whsec_"+secretHookB64, func(n int, d delivery) int {
		if n <= 3 {
			return -1 // echo
		}
		return 0
	})
	h := newHarness(t, harnessOpts{fake: fk, extraTOML: extra, settings: func(s *appSettings) {
		hl.settings(s)
		s.Token = secretInbound
		s.Limits.MaxPromptChars = 200
		s.Limits.CallTimeout = 3 * time.Second
		s.HTTPTimeout = time.Second
	}})
	h.waitOnline("mac")
	h.waitOnline("ro")
	h.waitOnline("gated")

	// Without the inbound token: refused, and the refusal holds no secret.
	resp, err := http.Post(h.http.URL+"/mcp", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/mcp without the token: %d", resp.StatusCode)
	}
	leaks(t, "the 401 page", body)

	c := h.authClient("secret-test", secretInbound)
	var results []string
	call := func(name string, args any) (string, bool) {
		out, isErr := c.callRaw(name, args)
		results = append(results, name+": "+out)
		return out, isErr
	}
	mustOK := func(name string, args any) map[string]any {
		t.Helper()
		out, isErr := call(name, args)
		if isErr {
			t.Fatalf("%s: %s", name, out)
		}
		var r mcp.CallToolResult
		_ = json.Unmarshal([]byte(out), &r)
		var sc map[string]any
		b, _ := json.Marshal(r.StructuredContent)
		_ = json.Unmarshal(b, &sc)
		return sc
	}

	// Reads and their errors, every machine state.
	mustOK("t3_machines", nil)
	mustOK("t3_projects", map[string]any{"machine": "mac"})
	for _, m := range []string{"bad", "nokey", "nope", ""} {
		call("t3_projects", map[string]any{"machine": m})
	}
	call("t3_projects", map[string]any{"machine": 5})

	// Dispatches: one per script, and every refusal.
	tids := map[string]string{}
	for _, p := range []string{promptDone, promptFail, promptQuestion, promptHang} {
		tids[p] = str(mustOK("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": p}), "thread_id")
	}
	base := map[string]any{"machine": "mac", "project": "api", "prompt": "x"}
	for _, change := range []map[string]any{
		{"machine": "bad"}, {"machine": "nokey"}, {"machine": "ro"}, {"machine": "gated"}, {"machine": "nope"},
		{"project": "nope"}, {"prompt": "  "}, {"prompt": strings.Repeat("p", 201)}, {"prompt": "a\x00b"},
		{"model": "codex/nope"}, {"model": "nomodel"}, {"thread_id": "thread-nope"}, {"watch": "yes"},
	} {
		args := map[string]any{}
		for k, v := range base {
			args[k] = v
		}
		for k, v := range change {
			args[k] = v
		}
		if _, isErr := call("t3_dispatch", args); !isErr {
			t.Errorf("t3_dispatch %v succeeded", change)
		}
	}
	fk.StepAll()

	// Every thread tool, on each thread and on bad ids.
	for _, tid := range tids {
		mustOK("t3_thread", map[string]any{"thread_id": tid})
		call("t3_wait", map[string]any{"thread_id": tid, "timeout": 1})
	}
	for _, bad := range []any{"thread-nope", "", 42, "../../etc/passwd"} {
		for _, tool := range []string{"t3_thread", "t3_wait", "t3_interrupt"} {
			call(tool, map[string]any{"thread_id": bad})
		}
		call("t3_answer", map[string]any{"thread_id": bad, "answers": map[string]any{"a": "b"}})
		call("t3_watch", map[string]any{"thread_id": bad, "enabled": true})
	}
	call("t3_wait", map[string]any{"thread_id": tids[promptDone], "timeout": 999999})
	q := tids[promptQuestion]
	call("t3_answer", map[string]any{"thread_id": q, "answers": map[string]any{"nope": "x"}})
	call("t3_answer", map[string]any{"thread_id": q, "answers": map[string]any{"scope": "Bogus", "checks": []any{"lint"}}})
	call("t3_answer", map[string]any{"thread_id": q, "answers": map[string]any{"scope": []any{"Workspace"}}})
	call("t3_answer", map[string]any{"thread_id": q, "answers": map[string]any{"scope": "Workspace"}})
	mustOK("t3_answer", map[string]any{"thread_id": q, "answers": map[string]any{"scope": "Workspace", "checks": []any{"lint"}}})
	mustOK("t3_interrupt", map[string]any{"thread_id": tids[promptHang]})
	call("t3_interrupt", map[string]any{"thread_id": tids[promptDone]})
	fk.StepAll()
	mustOK("t3_watch", nil)
	mustOK("t3_watch", map[string]any{"thread_id": tids[promptDone], "enabled": false})
	mustOK("t3_watch", map[string]any{"thread_id": tids[promptDone], "enabled": true})
	call("t3_watch", map[string]any{"thread_id": tids[promptDone]})
	for _, tid := range tids {
		mustOK("t3_wait", map[string]any{"thread_id": tid, "timeout": 20})
	}

	// T3 faults: errors from 500s, hangs and a revoked token.
	fk.HTTPFail(500)
	call("t3_thread", map[string]any{"thread_id": tids[promptDone]})
	fk.HTTPFail(0)
	fk.HTTPHang(true)
	call("t3_thread", map[string]any{"thread_id": tids[promptDone]})
	fk.HTTPHang(false)
	fk.SetUnauthorized(true)
	call("t3_thread", map[string]any{"thread_id": tids[promptDone]})
	fk.DropConnections()
	eventually(t, 20*time.Second, "machine reported unauthorized", func() bool {
		out, _ := call("t3_machines", nil)
		return strings.Contains(out, `unauthorized`)
	}, nil)
	call("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "x"})
	fk.SetUnauthorized(false)
	h.waitOnline("mac")

	// A recovered panic: the same tools on a server whose store is missing.
	srv := server.NewMCPServer(&tools.Deps{Fleet: h.app.Fleet, Logger: h.app.Log, Limits: h.app.Settings.Limits}, "test")
	ct, st := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(context.Background(), st, nil)
	if err != nil {
		t.Fatal(err)
	}
	pc, err := mcp.NewClient(&mcp.Implementation{Name: "panic", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := pc.CallTool(context.Background(), &mcp.CallToolParams{Name: "t3_watch", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "internal error") {
		t.Fatalf("t3_watch without a store: %v %+v", err, res)
	}
	b, _ := json.Marshal(res)
	results = append(results, "panic: "+string(b))
	pc.Close()
	ss.Close()
	if !strings.Contains(h.logs.String(), "tool panicked") {
		t.Fatal("the recovered panic was not logged")
	}

	// Events: every run's transitions delivered, after the echoing rejections.
	w := want{}
	w.add(tids[promptDone], "thread.completed")
	w.add(tids[promptFail], "thread.failed")
	w.add(tids[promptQuestion], "thread.question", "thread.completed")
	w.add(tids[promptHang], "thread.interrupted")
	hl.settle(t, h, w)

	// Now look everywhere.
	for _, r := range results {
		leaks(t, "a tool result", []byte(r))
	}
	leaks(t, "the debug log", []byte(h.logs.String()))
	leaks(t, "/healthz", httpGet(t, h.http.URL+"/healthz"))
	leaks(t, "/metrics", httpGet(t, h.http.URL+"/metrics"))
	hl.mu.Lock()
	for i, d := range hl.all {
		hdr := d.header.Clone()
		if got := hdr.Get("Authorization"); got != "Bearer "+secretHookToken {
			t.Errorf("delivery %d: Authorization %q", i, got)
		}
		hdr.Del("Authorization")
		hb, _ := json.Marshal(hdr)
		leaks(t, fmt.Sprintf("webhook %d headers", i), hb)
		leaks(t, fmt.Sprintf("webhook %d body", i), d.body)
	}
	n := len(hl.all)
	hl.mu.Unlock()
	if n < 6 {
		t.Errorf("only %d webhook requests: the echo cycle did not run", n)
	}
	h.stop()
	files := 0
	_ = filepath.Walk(h.stateDir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			t.Error(err)
			return nil
		}
		files++
		leaks(t, "state file "+filepath.Base(p), b)
		if filepath.Base(p) == store.FileName && !strings.Contains(string(b), "[redacted]") {
			t.Errorf("the state file holds no redacted receiver page: the echo was not recorded")
		}
		return nil
	})
	if files == 0 {
		t.Fatal("no state file to scan")
	}
	t.Logf("SECRETS: %d tool results, %d log bytes, %d webhook requests, %d state files scanned", len(results), len(h.logs.String()), n, files)
}
