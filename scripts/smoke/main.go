// Command smoke checks a running t3code-mcp end to end with a real MCP client
// over streamable HTTP: t3_machines, t3_projects, t3_dispatch, t3_wait and
// t3_thread, printing each step and its result. It exits 0 when the run
// completed, 1 on any failure, 2 on bad usage.
//
//	go run ./scripts/smoke [-prompt "say hello"] [-timeout 300] [-origin O] <mcp-url> <machine> <project>
//
// T3CODE_MCP_TOKEN, when set, is sent as `Authorization: Bearer …` (for a
// connector that requires it). Against the demo machine (`make run` without a
// config):
//
//	go run ./scripts/smoke http://127.0.0.1:8000/mcp demo demo
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: go run ./scripts/smoke [flags] <mcp-url> <machine> <project>

Runs t3_machines, t3_projects, t3_dispatch, t3_wait and t3_thread against a
running t3code-mcp and exits 0 when the dispatched run completed.
T3CODE_MCP_TOKEN, when set, is sent as the bearer token.

flags:
`

// run is the whole program; getenv supplies T3CODE_MCP_TOKEN.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("smoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	prompt := fs.String("prompt", "say hello", "the prompt of the dispatched thread")
	timeout := fs.Int("timeout", 300, "t3_wait timeout in seconds")
	origin := fs.String("origin", "", "X-Conversation-Origin header to send (recorded with the thread)")
	fs.Usage = func() {
		fmt.Fprint(stderr, usage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 3 {
		fs.Usage()
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintln(stderr, "smoke: -timeout must be a positive number of seconds")
		return 2
	}
	s := &smoke{out: stdout, url: fs.Arg(0), machine: fs.Arg(1), project: fs.Arg(2), prompt: *prompt, timeout: *timeout}
	if err := s.run(ctx, getenv("T3CODE_MCP_TOKEN"), *origin); err != nil {
		fmt.Fprintf(stdout, "\nsmoke: FAILED: %v\n", err)
		return 1
	}
	return 0
}

type smoke struct {
	out                   io.Writer
	url, machine, project string
	prompt                string
	timeout               int
	session               *mcp.ClientSession
}

// headers adds fixed headers to every request.
type headers struct {
	h    http.Header
	base http.RoundTripper
}

func (r headers) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range r.h {
		req.Header[k] = v
	}
	return r.base.RoundTrip(req)
}

func (s *smoke) step(format string, a ...any) { fmt.Fprintf(s.out, "→ "+format+"\n", a...) }

// show prints a tool's text result indented under its step.
func (s *smoke) show(text string) {
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		fmt.Fprintf(s.out, "    %s\n", line)
	}
}

func (s *smoke) run(ctx context.Context, token, origin string) error {
	start := time.Now()
	hdr := http.Header{}
	if token != "" {
		hdr.Set("Authorization", "Bearer "+token)
	}
	if origin != "" {
		hdr.Set("X-Conversation-Origin", origin)
	}
	hc := &http.Client{Transport: headers{hdr, http.DefaultTransport.(*http.Transport).Clone()}}
	defer hc.CloseIdleConnections()

	s.step("connect %s", s.url)
	if err := s.preflight(ctx, hc, token != ""); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "t3code-mcp-smoke", Version: "1"}, nil)
	session, err := client.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: s.url, HTTPClient: hc}, nil)
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", s.url, err)
	}
	defer session.Close()
	s.session = session
	info := session.InitializeResult()
	s.show(fmt.Sprintf("server %s %s, MCP protocol %s", info.ServerInfo.Name, info.ServerInfo.Version, info.ProtocolVersion))

	// t3_machines: the machine is there and online.
	s.step("t3_machines")
	var out json.RawMessage
	found := false
	var names []string
	// A connector that just started may still be connecting to the machine:
	// an offline machine gets a few more looks before it counts as a failure.
	for try := 0; ; try++ {
		if out, err = s.call(ctx, "t3_machines", nil); err != nil {
			return err
		}
		var machines struct {
			Machines []struct {
				Name    string `json:"name"`
				Online  bool   `json:"online"`
				Status  string `json:"status"`
				Problem string `json:"problem"`
			} `json:"machines"`
		}
		if err := json.Unmarshal(out, &machines); err != nil {
			return fmt.Errorf("t3_machines: %w", err)
		}
		found, names = false, nil
		connecting := false
		for _, m := range machines.Machines {
			names = append(names, m.Name)
			if m.Name != s.machine {
				continue
			}
			found = true
			if !m.Online {
				if m.Status == "offline" && try < 20 {
					connecting = true
					continue
				}
				return fmt.Errorf("machine %q is %s: %s (see docs/troubleshooting.md)", m.Name, m.Status, m.Problem)
			}
		}
		if !connecting {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	if !found {
		return fmt.Errorf("machine %q is not in t3_machines (it lists: %s)", s.machine, strings.Join(names, ", "))
	}

	// t3_projects: the project is there (by title, id or path).
	s.step("t3_projects machine=%s", s.machine)
	if out, err = s.call(ctx, "t3_projects", map[string]any{"machine": s.machine}); err != nil {
		return err
	}
	var projects struct {
		Projects []struct{ ID, Title, Path string } `json:"projects"`
	}
	if err := json.Unmarshal(out, &projects); err != nil {
		return fmt.Errorf("t3_projects: %w", err)
	}
	found, names = false, nil
	for _, p := range projects.Projects {
		names = append(names, p.Title)
		found = found || p.Title == s.project || p.ID == s.project || strings.TrimRight(p.Path, "/") == strings.TrimRight(s.project, "/")
	}
	if !found {
		return fmt.Errorf("project %q is not among machine %q's projects (allowed: %s)", s.project, s.machine, strings.Join(names, ", "))
	}

	// t3_dispatch
	s.step("t3_dispatch machine=%s project=%s prompt=%q", s.machine, s.project, s.prompt)
	if out, err = s.call(ctx, "t3_dispatch", map[string]any{"machine": s.machine, "project": s.project, "prompt": s.prompt}); err != nil {
		return err
	}
	var dispatched struct {
		ThreadID string `json:"thread_id"`
	}
	if err := json.Unmarshal(out, &dispatched); err != nil || dispatched.ThreadID == "" {
		return fmt.Errorf("t3_dispatch returned no thread_id: %s", out)
	}
	tid := dispatched.ThreadID

	// t3_wait: the run must complete.
	s.step("t3_wait thread_id=%s timeout=%d", tid, s.timeout)
	if out, err = s.call(ctx, "t3_wait", map[string]any{"thread_id": tid, "timeout": s.timeout}); err != nil {
		return err
	}
	var waited struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(out, &waited); err != nil {
		return fmt.Errorf("t3_wait: %w", err)
	}

	// t3_thread: the state as a reader sees it.
	s.step("t3_thread thread_id=%s", tid)
	if out, err = s.call(ctx, "t3_thread", map[string]any{"thread_id": tid}); err != nil {
		return err
	}
	var thread struct {
		Status string `json:"status"`
	}
	if err := json.Unmarshal(out, &thread); err != nil {
		return fmt.Errorf("t3_thread: %w", err)
	}
	if waited.Reason != "completed" {
		return fmt.Errorf("thread %s did not complete: t3_wait returned %q (thread status %q)", tid, waited.Reason, thread.Status)
	}
	if thread.Status != "completed" {
		return fmt.Errorf("t3_wait said completed but t3_thread says %q", thread.Status)
	}
	fmt.Fprintf(s.out, "\nsmoke: ok: thread %s on %s completed (%s)\n", tid, s.machine, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// preflight makes one plain request so that the usual setup faults get a
// message saying what to do, not an MCP transport error.
func (s *smoke) preflight(ctx context.Context, hc *http.Client, withToken bool) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	body := `{"jsonrpc":"2.0","id":0,"method":"ping"}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url, strings.NewReader(body))
	if err != nil {
		return fmt.Errorf("%q is not a URL: %w", s.url, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("nothing answers at %s: %w (is t3code-mcp serve running? the banner prints the MCP URL)", s.url, err)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		if withToken {
			return fmt.Errorf("%s refused the bearer token (HTTP 401): T3CODE_MCP_TOKEN here differs from the connector's", s.url)
		}
		return fmt.Errorf("%s requires a bearer token (HTTP 401): set T3CODE_MCP_TOKEN to the connector's T3CODE_MCP_TOKEN", s.url)
	case http.StatusForbidden:
		return fmt.Errorf("%s answered HTTP 403: %s (a reverse proxy must pass a loopback Host header; see docs/deploy.md)", s.url, strings.TrimSpace(string(msg)))
	case http.StatusNotFound:
		return fmt.Errorf("%s answered HTTP 404: the MCP endpoint is /mcp", s.url)
	}
	return nil
}

// call runs a tool, prints its text, and returns its structured content; a
// tool error is returned as the error.
func (s *smoke) call(ctx context.Context, name string, args map[string]any) (json.RawMessage, error) {
	res, err := s.session.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			text.WriteString(tc.Text)
		}
	}
	if res.IsError {
		return nil, fmt.Errorf("%s: %s", name, text.String())
	}
	s.show(text.String())
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return raw, nil
}
