package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/spf13/cobra"

	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
)

// The tests here run the real binary, built once with the flags the
// Dockerfile uses (static, -trimpath, version stamped with -X).
const testVersion = "v9.9.9-test"

var (
	binDir    string
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "t3code-mcp-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary builds cmd/t3code-mcp as the Dockerfile does and returns its path.
func binary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binPath = filepath.Join(binDir, "t3code-mcp")
		cmd := exec.Command("go", "build", "-trimpath",
			"-ldflags", "-s -w -X main.version="+testVersion,
			"-o", binPath, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// childAttr sets up the servers the tests start (see procattr_linux_test.go).
var childAttr = func() *syscall.SysProcAttr { return nil }

// baseEnv is a clean environment for the subprocess: nothing of the
// developer's T3CODE_MCP_* settings leaks in.
func baseEnv(t *testing.T, kv ...string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir()}
	return append(env, kv...)
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freePort finds a port on 127.0.0.1 that is free right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// served is a running `t3code-mcp serve` subprocess.
type served struct {
	cmd    *exec.Cmd
	stdout *syncBuffer // the banner
	stderr *syncBuffer // the logs
	mcpURL string
	exited chan struct{}
}

// startServe runs the binary with args in dir and waits for its banner.
func startServe(t *testing.T, dir string, env []string, args ...string) *served {
	t.Helper()
	s := &served{cmd: exec.Command(binary(t), args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	s.cmd.Dir, s.cmd.Env, s.cmd.Stderr, s.cmd.SysProcAttr = dir, env, s.stderr, childAttr()
	out, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urlc := make(chan string, 1)
	go func() {
		defer close(urlc)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(s.stdout, line)
			if u, ok := strings.CutPrefix(strings.TrimSpace(line), "MCP:"); ok {
				urlc <- strings.TrimSpace(u)
			}
		}
	}()
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.exited
	})
	select {
	case u, ok := <-urlc:
		if !ok {
			<-s.exited
			t.Fatalf("serve exited without a banner\nstdout:\n%s\nstderr:\n%s", s.stdout, s.stderr)
		}
		s.mcpURL = u
	case <-time.After(30 * time.Second):
		t.Fatalf("no banner from serve\nstdout:\n%s\nstderr:\n%s", s.stdout, s.stderr)
	}
	return s
}

// stop sends SIGTERM and returns the exit code.
func (s *served) stop(t *testing.T) int {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop on SIGTERM\nstderr:\n%s", s.stderr)
	}
	return s.cmd.ProcessState.ExitCode()
}

// client is one MCP client session.
type client struct {
	t *testing.T
	s *mcp.ClientSession
}

func connect(t *testing.T, tr mcp.Transport) *client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "cmd-test", Version: "1"}, nil).Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	return &client{t: t, s: s}
}

func (c *client) call(name string, args map[string]any) (map[string]any, string, bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := c.s.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		c.t.Fatalf("%s: protocol error: %v", name, err)
	}
	text := ""
	for _, ct := range res.Content {
		if tc, ok := ct.(*mcp.TextContent); ok {
			text += tc.Text
		}
	}
	var sc map[string]any
	if res.StructuredContent != nil {
		b, _ := json.Marshal(res.StructuredContent)
		_ = json.Unmarshal(b, &sc)
	}
	return sc, text, res.IsError
}

func (c *client) ok(name string, args map[string]any) (map[string]any, string) {
	c.t.Helper()
	sc, text, isErr := c.call(name, args)
	if isErr {
		c.t.Fatalf("%s(%v) failed: %s", name, args, text)
	}
	return sc, text
}

func str(m map[string]any, path ...string) string {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = mm[p]
	}
	s, _ := cur.(string)
	return s
}

// writeConfig writes a t3code.toml with one machine "mac".
func writeConfig(t *testing.T, url, tokenEnv, extra string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t3code.toml")
	body := fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = %q\n%s", url, tokenEnv, extra)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// demoToken matches the demo machine's random token.
var demoToken = regexp.MustCompile(`t3fake-[A-Z2-7]{20,}`)

// The demo as `make run` starts it: the real binary with no config in its
// working directory serves the built-in demo machine; the banner says where
// /mcp is and how to add a real machine; every tool works over streamable
// HTTP; logs are JSON with --log-json, one line per tool call, with neither
// the token nor the prompt; `healthcheck` (the container HEALTHCHECK) passes
// against it; SIGTERM stops it cleanly.
func TestServeDemoThroughTheBinary(t *testing.T) {
	port := freePort(t)
	const marker = "zebra-prompt-marker-4711"
	realState := filepath.Join(t.TempDir(), "state")
	env := baseEnv(t, "T3CODE_MCP_PORT="+strconv.Itoa(port), "T3CODE_MCP_STATE_DIR="+realState)
	s := startServe(t, t.TempDir(), env, "--log-json", "serve")
	wantURL := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	if s.mcpURL != wantURL {
		t.Fatalf("banner MCP URL %q, want %q\n%s", s.mcpURL, wantURL, s.stdout)
	}

	c := connect(t, &mcp.StreamableClientTransport{Endpoint: s.mcpURL})
	defer c.s.Close()

	// The banner is printed before the listener serves; it is complete once
	// the client connected.
	banner := s.stdout.String()
	for _, want := range []string{
		"t3code-mcp " + testVersion,
		"MCP:     " + wantURL,
		fmt.Sprintf("health:  http://127.0.0.1:%d/healthz", port),
		`built-in DEMO machine "demo"`,
		"To add a real machine",
		"t3 auth session issue --scope orchestration:read --scope orchestration:operate",
		"copy t3code.example.toml to t3code.toml",
		"go run ./scripts/smoke " + wantURL + " demo demo",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}

	// t3_machines: one machine, plainly the demo — once its watcher connected (on a loaded
	// machine the first call can come before that, and would find it "not connected yet").
	waitOnline(t, c)
	sc, text := c.ok("t3_machines", nil)
	ms, _ := sc["machines"].([]any)
	if len(ms) != 1 {
		t.Fatalf("machines = %v", sc)
	}
	m := ms[0].(map[string]any)
	if m["name"] != "demo" || m["demo"] != true || m["online"] != true {
		t.Fatalf("machine = %v", m)
	}
	if !strings.Contains(text, "demo (built-in demo machine: a fake T3 server with scripted runs, not a real machine): online") {
		t.Errorf("t3_machines text %q does not label the demo", text)
	}

	// t3_projects
	sc, _ = c.ok("t3_projects", map[string]any{"machine": "demo"})
	if ps, _ := sc["projects"].([]any); len(ps) != 1 || str(ps[0].(map[string]any), "title") != "demo" {
		t.Fatalf("projects = %v", sc)
	}

	// t3_dispatch → t3_wait → t3_thread: the default script completes.
	sc, _ = c.ok("t3_dispatch", map[string]any{"machine": "demo", "project": "demo", "prompt": "say hello " + marker})
	done := str(sc, "thread_id")
	sc, _ = c.ok("t3_wait", map[string]any{"thread_id": done, "timeout": 60})
	if sc["reason"] != "completed" {
		t.Fatalf("wait = %v", sc)
	}
	if _, text := c.ok("t3_projects", map[string]any{"machine": "demo"}); !strings.Contains(text, ", 1 thread)") {
		t.Errorf("t3_projects after one dispatch: %q, want \"1 thread\"", text)
	}
	sc, _ = c.ok("t3_thread", map[string]any{"thread_id": done})
	if sc["status"] != "completed" {
		t.Fatalf("thread = %v", sc)
	}
	runs, _ := sc["runs"].([]any)
	if len(runs) == 0 || !strings.HasPrefix(str(runs[len(runs)-1].(map[string]any), "reply"), "Done: say hello") {
		t.Fatalf("thread runs = %v", runs)
	}

	// t3_answer: the question script asks two questions.
	sc, _ = c.ok("t3_dispatch", map[string]any{"machine": "demo", "project": "demo", "prompt": "question first"})
	asked := str(sc, "thread_id")
	sc, _ = c.ok("t3_wait", map[string]any{"thread_id": asked, "timeout": 60})
	if sc["reason"] != "question" {
		t.Fatalf("wait = %v", sc)
	}
	answers := map[string]any{}
	for _, q := range sc["state"].(map[string]any)["pending_question"].(map[string]any)["questions"].([]any) {
		qm := q.(map[string]any)
		first := qm["options"].([]any)[0]
		if qm["multi_select"] == true {
			answers[qm["id"].(string)] = []any{first}
		} else {
			answers[qm["id"].(string)] = first
		}
	}
	c.ok("t3_answer", map[string]any{"thread_id": asked, "answers": answers})
	if sc, _ = c.ok("t3_wait", map[string]any{"thread_id": asked, "timeout": 60}); sc["reason"] != "completed" {
		t.Fatalf("wait after the answer = %v", sc)
	}

	// t3_interrupt: the hang script runs until interrupted.
	sc, _ = c.ok("t3_dispatch", map[string]any{"machine": "demo", "project": "demo", "prompt": "hang on"})
	hung := str(sc, "thread_id")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if sc, _ = c.ok("t3_thread", map[string]any{"thread_id": hung}); sc["status"] == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hang run never ran: %v", sc)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.ok("t3_interrupt", map[string]any{"thread_id": hung})
	if sc, _ = c.ok("t3_wait", map[string]any{"thread_id": hung, "timeout": 60}); sc["reason"] != "interrupted" {
		t.Fatalf("wait after interrupt = %v", sc)
	}

	// t3_watch: the three threads are tracked; events for one switched off.
	sc, _ = c.ok("t3_watch", nil)
	if ths, _ := sc["threads"].([]any); len(ths) != 3 {
		t.Fatalf("tracked = %v", sc)
	}
	sc, _ = c.ok("t3_watch", map[string]any{"thread_id": done, "enabled": false})
	if sc["thread"].(map[string]any)["watching"] != false {
		t.Fatalf("watch off = %v", sc)
	}

	// The container HEALTHCHECK, against this very server.
	hc := exec.Command(binary(t), "healthcheck")
	hc.Env = baseEnv(t, "T3CODE_MCP_PORT="+strconv.Itoa(port), "T3CODE_MCP_HOST=0.0.0.0")
	if out, err := hc.CombinedOutput(); err != nil || !strings.Contains(string(out), "healthy: http://127.0.0.1:") {
		t.Fatalf("healthcheck: %v\n%s", err, out)
	}

	// The demo's threads live in a state directory of its own, which the
	// banner names, never in T3CODE_MCP_STATE_DIR.
	demoState := ""
	for line := range strings.SplitSeq(banner, "\n") {
		if rest, ok := strings.CutPrefix(line, "  state:   "); ok {
			demoState, _, _ = strings.Cut(rest, " (the demo's own, removed at exit)")
		}
	}
	if demoState == "" || strings.HasPrefix(demoState, realState) {
		t.Fatalf("the demo's state is %q (T3CODE_MCP_STATE_DIR is %s):\n%s", demoState, realState, banner)
	}
	if _, err := os.Stat(demoState); err != nil {
		t.Fatalf("the demo's state file: %v", err)
	}

	c.s.Close()
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit code %d after SIGTERM\nstderr:\n%s", code, s.stderr)
	}
	if _, err := os.Stat(filepath.Dir(demoState)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo's state directory %s outlived the demo: %v", filepath.Dir(demoState), err)
	}
	if entries, err := os.ReadDir(realState); err == nil && len(entries) > 0 {
		t.Errorf("the demo wrote into T3CODE_MCP_STATE_DIR: %v", entries)
	}

	// Logs: JSON lines, one per tool call, no token, no prompt.
	logs := s.stderr.String()
	calls := map[string]int{}
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON (--log-json): %q", line)
		}
		switch rec["msg"] {
		case "tool call":
			calls[str(rec, "tool")]++
			// Who, what, on which machine and thread, how it went, how long.
			if str(rec, "session") == "" || str(rec, "outcome") != "ok" || rec["ms"] == nil {
				t.Errorf("tool call line lacks session, outcome or ms: %s", line)
			}
			switch str(rec, "tool") {
			case "t3_dispatch", "t3_projects":
				if str(rec, "machine") != "demo" {
					t.Errorf("no machine in %s", line)
				}
			case "t3_wait", "t3_thread", "t3_answer", "t3_interrupt":
				if !strings.HasPrefix(str(rec, "thread"), "thread-") {
					t.Errorf("no thread in %s", line)
				}
			}
		case "server session connected", "server session disconnected", "session initialized", "server connecting":
			// The SDK's lifecycle lines are debug.
			t.Errorf("an MCP session lifecycle line at %v: %s", rec["level"], line)
		case "machine configured; connecting":
			if str(rec, "machine") != "demo" {
				t.Errorf("start-up line names no machine: %s", line)
			}
			calls["start-up"]++
		}
	}
	if calls["start-up"] != 1 {
		t.Errorf("%d start-up lines for the one machine", calls["start-up"])
	}
	for _, tool := range []string{"t3_machines", "t3_projects", "t3_dispatch", "t3_wait", "t3_thread", "t3_answer", "t3_interrupt", "t3_watch"} {
		if calls[tool] == 0 {
			t.Errorf("no \"tool call\" log line for %s; calls logged: %v", tool, calls)
		}
	}
	if calls["t3_dispatch"] != 3 {
		t.Errorf("%d t3_dispatch log lines, want one per call (3)", calls["t3_dispatch"])
	}
	if strings.Contains(logs, marker) {
		t.Errorf("the prompt appears in the logs:\n%s", logs)
	}
	if demoToken.MatchString(logs) || demoToken.MatchString(s.stdout.String()) {
		t.Errorf("the demo machine's token appears in the output")
	}
}

// `t3code-mcp stdio`: the same tools over stdin/stdout, driven by a real MCP
// client through mcp.CommandTransport; calls carry no header, so the origin
// recorded for a dispatched thread is T3CODE_MCP_ORIGIN. Logs stay on stderr
// (text by default), with neither token nor prompt.
func TestStdioRecordsTheOriginFromTheEnvironment(t *testing.T) {
	fk := startFake(t)
	const tokenEnv, origin, marker = "T3_STDIO_TEST_TOKEN", "slack:C0123ABCD/1764406363.000100", "quokka-prompt-marker-99"
	cfg := writeConfig(t, fk.URL(), tokenEnv, `projects = ["api"]`+"\n")
	cmd := exec.Command(binary(t), "stdio")
	cmd.Dir, cmd.SysProcAttr = t.TempDir(), childAttr()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.Env = baseEnv(t,
		"T3CODE_MCP_CONFIG="+cfg,
		"T3CODE_MCP_STATE_DIR="+filepath.Join(t.TempDir(), "state"),
		"T3CODE_MCP_ORIGIN="+origin,
		"T3CODE_MCP_LOG_LEVEL=debug", // the most it ever says: still no token, no prompt
		tokenEnv+"="+fk.Token(),
	)
	c := connect(t, &mcp.CommandTransport{Command: cmd, TerminateDuration: time.Minute})
	closed := false
	t.Cleanup(func() {
		if !closed {
			c.s.Close()
		}
	})
	if got := c.s.InitializeResult().ServerInfo; got.Name != "t3code-mcp" || got.Version != testVersion {
		t.Fatalf("server info = %+v", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sc, _ := c.ok("t3_machines", nil)
		if ms, _ := sc["machines"].([]any); len(ms) == 1 && ms[0].(map[string]any)["online"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("machine never online: %v\nstderr:\n%s", sc, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sc, _ := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "write the changelog " + marker})
	tid := str(sc, "thread_id")
	if sc, _ = c.ok("t3_wait", map[string]any{"thread_id": tid, "timeout": 60}); sc["reason"] != "completed" {
		t.Fatalf("wait = %v", sc)
	}
	sc, _ = c.ok("t3_watch", nil)
	ths, _ := sc["threads"].([]any)
	if len(ths) != 1 {
		t.Fatalf("tracked = %v", sc)
	}
	th := ths[0].(map[string]any)
	if th["thread_id"] != tid || th["origin"] != origin {
		t.Fatalf("tracked thread = %v, want origin %q", th, origin)
	}

	// Closing stdin ends the server; it exits 0.
	closed = true
	if err := c.s.Close(); err != nil {
		t.Fatalf("stdio server did not exit cleanly: %v\nstderr:\n%s", err, stderr)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d", code)
	}
	logs := stderr.String()
	if !strings.Contains(logs, `msg="tool call" tool=t3_dispatch outcome=ok`) {
		t.Errorf("no text log line for the dispatch:\n%s", logs)
	}
	if strings.Contains(logs, marker) || strings.Contains(logs, fk.Token()) {
		t.Errorf("prompt or token in the logs:\n%s", logs)
	}
	// stdio runs the return of spare heap memory after busy spells too (no /metrics here).
	if !strings.Contains(logs, `msg="memory return: looking at the heap" every=10s`) {
		t.Errorf("stdio runs no memory return:\n%s", logs)
	}
}

// commandPaths lists every command of the tree, the root first.
func commandPaths() [][]string {
	var out [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		out = append(out, path)
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" {
				continue
			}
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk((&cli{}).rootCommand(), nil)
	return out
}

// exitOf runs the binary and returns its stdout, stderr and exit code; it
// never waits more than a minute (a --help that started serving would).
func exitOf(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	cmd.Env, cmd.Dir = env, t.TempDir()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v did not exit within a minute\nstdout:\n%s\nstderr:\n%s", args, out.String(), errb.String())
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), cmd.ProcessState.ExitCode()
}

// The command line, through the built binary: every command answers --help
// and -h with its usage on stdout and exit 0 (serve and stdio do not start,
// doctor does not check); --version and `version` print the stamped version;
// a wrong command, flag or value exits 2 with the reason on stderr.
func TestCommandLine(t *testing.T) {
	env := baseEnv(t, "T3CODE_MCP_STATE_DIR="+filepath.Join(t.TempDir(), "state"), "T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)))
	paths := commandPaths()
	if len(paths) < 10 { // root, serve, stdio, doctor, dead-letters, retry, audit, config-schema, healthcheck, version
		t.Fatalf("command tree %v", paths)
	}
	for _, path := range paths {
		for _, h := range []string{"--help", "-h"} {
			args := append(append([]string(nil), path...), h)
			out, errOut, code := exitOf(t, env, args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "Usage:\n  t3code-mcp "+strings.Join(path, " ")) {
				t.Errorf("%v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errOut)
			}
		}
	}
	out, _, _ := exitOf(t, env, "--help")
	for _, w := range []string{"serve", "stdio", "doctor", "dead-letters", "audit", "config-schema", "healthcheck", "version",
		"--config", "--host", "--port", "--state-dir", "--log-level", "--log-json", "--read-only", "--version",
		"T3CODE_MCP_CONFIG", "T3CODE_MCP_READ_ONLY"} {
		if !strings.Contains(out, w) {
			t.Errorf("--help does not mention %s:\n%s", w, out)
		}
	}
	for _, args := range [][]string{{"--version"}, {"version"}, {"--log-level", "debug", "version"}} {
		if out, errOut, code := exitOf(t, env, args...); code != 0 || out != "t3code-mcp "+testVersion+"\n" || errOut != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bogus"}, `unknown command "bogus"`},
		{[]string{"--bogus"}, "unknown flag: --bogus"},
		{[]string{"serve", "extra"}, `unknown command "extra" for "t3code-mcp serve"`},
		{[]string{"--log-level", "loud", "version"}, `--log-level / T3CODE_MCP_LOG_LEVEL "loud": want debug, info, warn or error`},
		{[]string{"--port", "many", "serve"}, `invalid argument "many" for "--port" flag`},
		{[]string{"--port", "70000", "healthcheck"}, "T3CODE_MCP_PORT=70000: not a port"},
		{[]string{"audit", "--since", "yesterday"}, "audit: "},
	} {
		out, errOut, code := exitOf(t, env, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) || strings.Contains(out, "MCP:") {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errOut, tc.want)
		}
	}
	// In-process, unstamped: "dev".
	var o, e bytes.Buffer
	if code := run([]string{"version"}, &o, &e); code != 0 || o.String() != "t3code-mcp dev\n" {
		t.Fatalf("version in-process: %d %q", code, o.String())
	}
}

// Each setting flag wins over its variable: the environment names a missing
// config, a bad log level, another port and state directory, and the flags
// put it right. --read-only offers the read tools only.
func TestFlagsWinOverTheEnvironment(t *testing.T) {
	fk := startFake(t)
	const tokenEnv = "T3_FLAGS_TEST_TOKEN"
	port, state := freePort(t), filepath.Join(t.TempDir(), "flag-state")
	env := baseEnv(t,
		"T3CODE_MCP_CONFIG=/nonexistent/t3code.toml",
		"T3CODE_MCP_HOST=256.0.0.1",
		"T3CODE_MCP_PORT=1",
		"T3CODE_MCP_STATE_DIR=/nonexistent/state",
		"T3CODE_MCP_LOG_LEVEL=loud",
		"T3CODE_MCP_LOG_FORMAT=text",
		"T3CODE_MCP_READ_ONLY=false",
		tokenEnv+"="+fk.Token(),
	)
	cfg := writeConfig(t, fk.URL(), tokenEnv, "")
	s := startServe(t, t.TempDir(), env, "--config", cfg, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--state-dir", state, "--log-level", "debug", "--log-json", "--read-only", "serve")
	if want := fmt.Sprintf("http://127.0.0.1:%d/mcp", port); s.mcpURL != want {
		t.Fatalf("MCP at %q, want %q", s.mcpURL, want)
	}
	c := connect(t, &mcp.StreamableClientTransport{Endpoint: s.mcpURL})
	defer c.s.Close()
	banner := s.stdout.String()
	for _, w := range []string{"  config:  " + cfg + " (1 machine)", "  state:   " + filepath.Join(state, "t3code-mcp.db"), "  tools:   read-only"} {
		if !strings.Contains(banner, w) {
			t.Errorf("banner lacks %q:\n%s", w, banner)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var names []string
	for tool, err := range c.s.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, tool.Name)
	}
	slices.Sort(names)
	if want := []string{"t3_machines", "t3_projects", "t3_thread", "t3_threads", "t3_wait", "t3_watch"}; !slices.Equal(names, want) {
		t.Errorf("read-only tools/list = %v, want %v", names, want)
	}
	if _, err := c.s.CallTool(ctx, &mcp.CallToolParams{Name: "t3_dispatch", Arguments: map[string]any{"machine": "mac", "project": "api", "prompt": "hi"}}); err == nil || !strings.Contains(err.Error(), `unknown tool "t3_dispatch"`) {
		t.Errorf("t3_dispatch on a read-only connector: %v", err)
	}
	c.s.Close()
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.stderr)
	}
	// --log-json and --log-level debug over T3CODE_MCP_LOG_FORMAT=text and a bad level.
	logs := strings.TrimSpace(s.stderr.String())
	if !strings.Contains(logs, `"level":"DEBUG"`) {
		t.Errorf("no debug line in the logs:\n%s", logs)
	}
	for line := range strings.SplitSeq(logs, "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("not a JSON line: %q", line)
		}
	}
}

func TestHealthcheck(t *testing.T) {
	clearEnv(t)
	status := http.StatusOK
	var mu sync.Mutex
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)

	check := func(host string) (int, string) {
		t.Setenv("T3CODE_MCP_PORT", port)
		t.Setenv("T3CODE_MCP_HOST", host)
		var out, errb bytes.Buffer
		code := run([]string{"healthcheck"}, &out, &errb)
		return code, out.String() + errb.String()
	}
	for _, host := range []string{"", "0.0.0.0", "127.0.0.1"} {
		if code, msg := check(host); code != 0 || !strings.Contains(msg, "healthy: http://127.0.0.1:"+port+"/healthz answered HTTP 200") {
			t.Fatalf("host %q: %d %q", host, code, msg)
		}
	}
	mu.Lock()
	status = http.StatusServiceUnavailable
	mu.Unlock()
	if code, msg := check("0.0.0.0"); code != 1 || !strings.Contains(msg, "unhealthy") || !strings.Contains(msg, "503") {
		t.Fatalf("503: %d %q", code, msg)
	}
	_ = srv.Close()
	if code, msg := check("0.0.0.0"); code != 1 || !strings.Contains(msg, "does not answer") {
		t.Fatalf("closed: %d %q", code, msg)
	}
	t.Setenv("T3CODE_MCP_PORT", "nope")
	var out, errb bytes.Buffer
	if code := run([]string{"healthcheck"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "T3CODE_MCP_PORT") {
		t.Fatalf("bad port: %d %q", code, errb.String())
	}
}

// serve as the container runs it: every interface, a bearer on /mcp, a real
// config. The banner shows the loopback URL a local client uses and that a
// token is required; /mcp refuses a client without the bearer and serves one
// with it.
func TestServeOnEveryInterfaceWithAToken(t *testing.T) {
	fk := startFake(t)
	const tokenEnv, bearer = "T3_SERVE_TEST_TOKEN", "mcp-bearer-for-the-test-0123"
	port := freePort(t)
	env := baseEnv(t,
		"T3CODE_MCP_HOST=0.0.0.0",
		"T3CODE_MCP_PORT="+strconv.Itoa(port),
		"T3CODE_MCP_TOKEN="+bearer,
		"T3CODE_MCP_CONFIG="+writeConfig(t, fk.URL(), tokenEnv, ""),
		"T3CODE_MCP_STATE_DIR="+filepath.Join(t.TempDir(), "state"),
		tokenEnv+"="+fk.Token(),
	)
	s := startServe(t, t.TempDir(), env)
	want := fmt.Sprintf("http://127.0.0.1:%d/mcp", port)
	if s.mcpURL != want {
		t.Fatalf("banner MCP URL %q, want %q", s.mcpURL, want)
	}

	resp, err := http.Post(s.mcpURL, "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/mcp without the bearer: HTTP %d, want 401", resp.StatusCode)
	}

	hc := &http.Client{Transport: headerRT{http.Header{"Authorization": {"Bearer " + bearer}}}}
	c := connect(t, &mcp.StreamableClientTransport{Endpoint: s.mcpURL, HTTPClient: hc})
	sc, _ := c.ok("t3_machines", nil)
	if ms, _ := sc["machines"].([]any); len(ms) != 1 || ms[0].(map[string]any)["name"] != "mac" || ms[0].(map[string]any)["demo"] != false {
		t.Fatalf("machines = %v", sc)
	}
	c.s.Close()

	banner := s.stdout.String()
	for _, w := range []string{
		fmt.Sprintf("  listen:  every interface, port %d (T3CODE_MCP_HOST=0.0.0.0)", port),
		"  auth:    /mcp requires Authorization: Bearer <T3CODE_MCP_TOKEN>",
		"  config:  ",
	} {
		if !strings.Contains(banner, w) {
			t.Errorf("banner lacks %q:\n%s", w, banner)
		}
	}
	if strings.Contains(banner, "DEMO") {
		t.Errorf("a configured connector announces the demo:\n%s", banner)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.stderr)
	}
	if out := s.stdout.String() + s.stderr.String(); strings.Contains(out, bearer) || strings.Contains(out, fk.Token()) {
		t.Errorf("a token appears in the output:\n%s", out)
	}
}

// A config path that does not exist (a container without its mount) stops
// serve with a message saying what to do.
func TestServeWithAMissingConfigFile(t *testing.T) {
	cmd := exec.Command(binary(t), "serve")
	cmd.Env = baseEnv(t, "T3CODE_MCP_CONFIG=/nonexistent/t3code.toml", "T3CODE_MCP_STATE_DIR="+t.TempDir(), "T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)))
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("exit: %v\n%s", err, out)
	}
	for _, w := range []string{"/nonexistent/t3code.toml", "create it from t3code.example.toml", "unset T3CODE_MCP_CONFIG to try the built-in demo machine"} {
		if !strings.Contains(string(out), w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}

// SIGTERM while a t3_wait blocks (its timeout is ten minutes): the call ends
// at once with an error result the client receives, and serve exits 0. The
// SDK waits for running handlers when a session closes, so without
// cancelOnStop the process would hang until the wait timed out.
func TestSIGTERMEndsAWaitInFlight(t *testing.T) {
	fk := startFake(t)
	const tokenEnv = "T3_SIGTERM_TEST_TOKEN"
	port := freePort(t)
	env := baseEnv(t,
		"T3CODE_MCP_PORT="+strconv.Itoa(port),
		"T3CODE_MCP_CONFIG="+writeConfig(t, fk.URL(), tokenEnv, ""),
		"T3CODE_MCP_STATE_DIR="+filepath.Join(t.TempDir(), "state"),
		tokenEnv+"="+fk.Token(),
	)
	s := startServe(t, t.TempDir(), env, "serve")
	c := connect(t, &mcp.StreamableClientTransport{Endpoint: s.mcpURL})
	// A client session closes only after its own calls ended: should serve
	// hang, end the call and the process first, then close.
	waitCtx, cancelWait := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancelWait()
		_ = s.cmd.Process.Kill()
		c.s.Close()
	})
	waitOnline(t, c)
	sc, _ := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "hang on"})
	tid := str(sc, "thread_id")

	type result struct {
		text  string
		isErr bool
		err   error
	}
	got := make(chan result, 1)
	go func() {
		res, err := c.s.CallTool(waitCtx, &mcp.CallToolParams{Name: "t3_wait", Arguments: map[string]any{"thread_id": tid, "timeout": 600}})
		r := result{err: err}
		if err == nil {
			r.isErr = res.IsError
			for _, ct := range res.Content {
				if tc, ok := ct.(*mcp.TextContent); ok {
					r.text += tc.Text
				}
			}
		}
		got <- r
	}()
	// The wait is running once the metrics say so.
	metrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", port)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(get(t, metrics), "\nt3code_mcp_active_waits 1\n") {
		if time.Now().After(deadline) {
			t.Fatal("the wait never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Beside the connector runs the return of spare heap memory after busy spells; it looks at
	// the heap first when it starts (internal/memreturn).
	for counter(t, get(t, metrics), "t3code_mcp_memory_return_looks_total") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("serve runs no memory return: t3code_mcp_memory_return_looks_total stays 0")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, s.stderr)
	}
	select {
	case r := <-got:
		if r.err != nil || !r.isErr || !strings.Contains(r.text, "t3_wait: thread \""+tid+"\": the connector is shutting down; the run goes on in T3: call t3_wait again") {
			t.Fatalf("the ended wait returned %+v, want an error result", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the client never heard back from its wait")
	}
}

func waitOnline(t *testing.T, c *client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		sc, _ := c.ok("t3_machines", nil)
		if ms, _ := sc["machines"].([]any); len(ms) == 1 && ms[0].(map[string]any)["online"] == true {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("machine never online: %v", sc)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// counter reads one unlabelled counter's value from a /metrics page (parsed by prometheus/common's
// expfmt, as the load harness does); a counter not there fails.
func counter(t *testing.T, page, name string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(page))
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	fam := families[name]
	if fam == nil || fam.GetType() != dto.MetricType_COUNTER || len(fam.GetMetric()) != 1 {
		t.Fatalf("/metrics has no unlabelled counter %s:\n%s", name, page)
	}
	return fam.GetMetric()[0].GetCounter().GetValue()
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := bufio.NewReader(resp.Body).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// Events through the real binary, logging at debug (the most it ever says):
// the hook receives the completed run with the client's origin, the bearer
// and a signature; the logs show the event recorded and delivered, and hold
// no token, no secret and no prompt.
func TestServeDeliversEventsAndKeepsSecretsOutOfLogs(t *testing.T) {
	fk := startFake(t)
	const (
		tokenEnv   = "T3_EVENTS_TEST_TOKEN"
		hookToken  = "hook-bearer-0123456789"
		hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		mcpToken   = "mcp-bearer-9876543210"
		origin     = "slack:C0123ABCD/1764406363.000100"
		marker     = "wombat-prompt-marker-31337"
	)
	type delivery struct {
		header http.Header
		event  map[string]any
	}
	got := make(chan delivery, 10)
	hook := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev map[string]any
		_ = json.NewDecoder(r.Body).Decode(&ev)
		got <- delivery{r.Header.Clone(), ev}
		w.WriteHeader(http.StatusNoContent)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hook.Serve(ln) }()
	t.Cleanup(func() { _ = hook.Close() })

	env := baseEnv(t,
		"T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)),
		"T3CODE_MCP_CONFIG="+writeConfig(t, fk.URL(), tokenEnv, ""),
		"T3CODE_MCP_STATE_DIR="+filepath.Join(t.TempDir(), "state"),
		"T3CODE_MCP_TOKEN="+mcpToken,
		"T3CODE_MCP_HOOK_URL=http://"+ln.Addr().String()+"/hook",
		"T3CODE_MCP_HOOK_TOKEN="+hookToken,
		"T3CODE_MCP_HOOK_SECRET="+hookSecret,
		tokenEnv+"="+fk.Token(),
	)
	s := startServe(t, t.TempDir(), env, "--log-level", "debug")
	hc := &http.Client{Transport: headerRT{http.Header{
		"Authorization":         {"Bearer " + mcpToken},
		"X-Conversation-Origin": {origin},
	}}}
	c := connect(t, &mcp.StreamableClientTransport{Endpoint: s.mcpURL, HTTPClient: hc})
	defer c.s.Close()
	waitOnline(t, c)
	sc, _ := c.ok("t3_dispatch", map[string]any{"machine": "mac", "project": "api", "prompt": "write the changelog " + marker})
	tid := str(sc, "thread_id")

	select {
	case d := <-got:
		if d.event["type"] != "thread.completed" || d.event["thread_id"] != tid || d.event["origin"] != origin {
			t.Fatalf("event = %v", d.event)
		}
		if d.header.Get("Authorization") != "Bearer "+hookToken || !strings.HasPrefix(d.header.Get("webhook-signature"), "v1,") {
			t.Fatalf("headers = %v", d.header)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no event delivered\nstderr:\n%s", s.stderr)
	}
	// The receiver has the event; the connector logs the delivery once the
	// receiver's answer is in and recorded, a moment later.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.stderr.String(), `msg="event delivered"`) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	c.s.Close()
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	logs := s.stderr.String()
	for _, want := range []string{`msg="event recorded"`, `msg="event delivered"`, `msg="tool call" tool=t3_dispatch outcome=ok`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s", want)
		}
	}
	for _, secret := range []string{fk.Token(), hookToken, hookSecret, strings.TrimPrefix(hookSecret, "whsec_"), mcpToken, marker} {
		if strings.Contains(logs+s.stdout.String(), secret) {
			t.Errorf("%q appears in the output", secret)
		}
	}
	if t.Failed() {
		t.Logf("logs:\n%s", logs)
	}
}

// headerRT adds fixed headers to every request.
type headerRT struct{ h http.Header }

func (r headerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range r.h {
		req.Header[k] = v
	}
	return http.DefaultTransport.RoundTrip(req)
}

// stdio while another process holds the state file (a serve on the same
// state directory): the client's initialize fails with the reason, stderr
// says it too, and the process exits 1.
func TestStdioWhenTheStateIsHeld(t *testing.T) {
	fk := startFake(t)
	const tokenEnv = "T3_HELD_TEST_TOKEN"
	state := filepath.Join(t.TempDir(), "state")
	env := baseEnv(t, "T3CODE_MCP_CONFIG="+writeConfig(t, fk.URL(), tokenEnv, ""), "T3CODE_MCP_STATE_DIR="+state,
		"T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)), tokenEnv+"="+fk.Token())
	s := startServe(t, t.TempDir(), env, "serve")

	cmd := exec.Command(binary(t), "stdio")
	cmd.Dir, cmd.SysProcAttr = t.TempDir(), childAttr()
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cmd.Env = env
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := mcp.NewClient(&mcp.Implementation{Name: "cmd-test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err == nil || !strings.Contains(err.Error(), "the store is in use by another process") || !strings.Contains(err.Error(), "connect this client to that serve over HTTP") {
		t.Fatalf("initialize: %v\nstderr:\n%s", err, stderr)
	}
	_ = cmd.Wait()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "the store is in use by another process") {
		t.Errorf("stderr does not say why:\n%s", stderr)
	}
	if code := s.stop(t); code != 0 {
		t.Errorf("the serve holding the state exited %d", code)
	}
}

// At start the log has one line per machine with its state: a token
// variable that is unset is a warning naming it; a machine that never
// connected says why it cannot, and never "link lost".
func TestStartupLogsSayWhatEachMachineIs(t *testing.T) {
	fk := startFake(t)
	cfg := filepath.Join(t.TempDir(), "t3code.toml")
	body := fmt.Sprintf("[machines.good]\nurl = %q\ntoken_env = \"T3_GOOD_TOKEN\"\n\n[machines.gone]\nurl = %q\ntoken_env = \"T3_GOOD_TOKEN\"\n\n[machines.notoken]\nurl = %q\ntoken_env = \"T3_UNSET_TOKEN\"\n",
		fk.URL(), closedURL(t), fk.URL())
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	env := baseEnv(t, "T3CODE_MCP_CONFIG="+cfg, "T3CODE_MCP_STATE_DIR="+filepath.Join(t.TempDir(), "state"),
		"T3CODE_MCP_PORT="+strconv.Itoa(freePort(t)), "T3_GOOD_TOKEN="+fk.Token())
	s := startServe(t, t.TempDir(), env, "serve")
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.stderr.String(), `msg="machine cannot connect; retrying" machine=gone`) {
		if time.Now().After(deadline) {
			t.Fatalf("no word on the unreachable machine:\n%s", s.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := s.stop(t); code != 0 {
		t.Fatalf("exit %d", code)
	}
	logs := s.stderr.String()
	for _, w := range []string{
		`level=INFO msg="machine configured; connecting" machine=good`,
		`level=INFO msg="machine configured; connecting" machine=gone`,
		`level=WARN msg="machine misconfigured: it stays unusable until fixed and restarted" machine=notoken`,
		`problem="machine \"notoken\" is misconfigured: environment variable T3_UNSET_TOKEN (token_env) is not set"`,
		"connection refused",
	} {
		if !strings.Contains(logs, w) {
			t.Errorf("logs lack %s", w)
		}
	}
	if strings.Contains(logs, "link lost") {
		t.Errorf("a machine that never connected is said to have lost its link:\n%s", logs)
	}
	if strings.Contains(logs, fk.Token()) {
		t.Errorf("the token is in the logs")
	}
	if t.Failed() {
		t.Logf("logs:\n%s", logs)
	}
}

// `config-schema` prints the committed JSON Schema of t3code.toml, byte for byte.
func TestConfigSchemaPrintsTheCommittedSchema(t *testing.T) {
	want, err := os.ReadFile("../../schema/config/t3code.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	var o, e bytes.Buffer
	if code := run([]string{"config-schema"}, &o, &e); code != 0 || e.Len() != 0 {
		t.Fatalf("config-schema: exit %d, stderr %q", code, e.String())
	}
	if !bytes.Equal(o.Bytes(), want) {
		t.Fatalf("config-schema printed\n%s\nwant schema/config/t3code.schema.json:\n%s", o.String(), want)
	}
}

// --claim-ttl mirrors T3CODE_MCP_CLAIM_TTL and wins over it; the default is outbox's, and a bad
// value names the variable.
func TestClaimTTLFlag(t *testing.T) {
	settings := func(env string, args ...string) (time.Duration, error) {
		t.Setenv("T3CODE_MCP_CLAIM_TTL", env)
		var stderr strings.Builder
		c := &cli{stdout: io.Discard, stderr: &stderr}
		root := c.rootCommand()
		if err := root.PersistentFlags().Parse(args); err != nil {
			t.Fatal(err)
		}
		s, err := c.settings()
		if err != nil {
			return 0, errors.New(stderr.String())
		}
		return s.ClaimTTL, nil
	}
	for _, tc := range []struct {
		env  string
		args []string
		want time.Duration
	}{
		{"", nil, outbox.DefaultClaimTTL},
		{"2m", nil, 2 * time.Minute},
		{"2m", []string{"--claim-ttl", "45s"}, 45 * time.Second},
	} {
		got, err := settings(tc.env, tc.args...)
		if err != nil || got != tc.want {
			t.Errorf("T3CODE_MCP_CLAIM_TTL=%q %v: %s, %v; want %s", tc.env, tc.args, got, err, tc.want)
		}
	}
	if _, err := settings("", "--claim-ttl", "soon"); err == nil || !strings.Contains(err.Error(), "T3CODE_MCP_CLAIM_TTL") {
		t.Errorf("--claim-ttl soon: %v, want an error naming T3CODE_MCP_CLAIM_TTL", err)
	}
}
