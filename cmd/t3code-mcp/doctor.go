package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
)

func openStore(s app.Settings) (*store.Store, error) {
	st, err := store.Open(s.StateDir)
	if errors.Is(err, store.ErrInUse) {
		return nil, fmt.Errorf("%w: stop the running t3code-mcp first (it holds %s)", err, s.StateDir)
	}
	return st, err
}

// needed are the scopes t3code-mcp uses; more are not needed.
var needed = []string{"orchestration:read", "orchestration:operate"}

// report collects doctor lines; any failure makes the exit code non-zero.
type report struct {
	w      io.Writer
	failed bool
}

func (r *report) ok(format string, a ...any)   { fmt.Fprintf(r.w, "  ok    "+format+"\n", a...) }
func (r *report) warn(format string, a ...any) { fmt.Fprintf(r.w, "  warn  "+format+"\n", a...) }
func (r *report) fail(format string, a ...any) {
	r.failed = true
	fmt.Fprintf(r.w, "  FAIL  "+format+"\n", a...)
}

func doctor(ctx context.Context, stdout, stderr io.Writer) int {
	s, ok := settings(stderr)
	if !ok {
		return 2
	}
	r := &report{w: stdout}
	path := s.ConfigPath
	if path == "" {
		if _, err := os.Stat("t3code.toml"); err == nil {
			path = "t3code.toml"
		}
	}
	if path == "" {
		fmt.Fprintln(stdout, "config: none (T3CODE_MCP_CONFIG unset and no ./t3code.toml): `serve` would start the demo machine")
		fmt.Fprintln(stdout, "  create one from t3code.example.toml to use real machines")
		return 1
	}
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintf(stdout, "config: %s\n", path)
		r.fail("%v", err)
		return 1
	}
	fmt.Fprintf(stdout, "config: %s (%d machines)\n", path, len(cfg.Machines))
	for _, m := range cfg.Machines {
		fmt.Fprintf(stdout, "\nmachine %q (%s)\n", m.Name, m.URL)
		checkMachine(ctx, r, m, s.HTTPTimeout)
	}
	fmt.Fprintln(stdout, "\nevents")
	checkHook(ctx, r, s)
	if r.failed {
		fmt.Fprintln(stdout, "\ndoctor: problems found (FAIL lines above)")
		return 1
	}
	fmt.Fprintln(stdout, "\ndoctor: all good")
	return 0
}

func checkMachine(ctx context.Context, r *report, m config.Machine, timeout time.Duration) {
	token, err := m.Token()
	if err != nil {
		r.fail("%v", err)
		return
	}
	r.ok("token variable %s is set", m.TokenEnv)
	c, err := t3.NewClient(m.Name, m.URL, token, t3.Options{Timeout: timeout})
	if err != nil {
		r.fail("%v", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d, err := c.Handshake(cctx)
	if err != nil {
		r.fail("%v", err)
		return
	}
	r.ok("T3 Code %s answers (environment %q, orchestration protocol %d)", d.ServerVersion, d.Label, d.Protocol)
	sess, err := c.Session(cctx)
	if err != nil {
		r.fail("%v", err)
		return
	}
	if !sess.Authenticated {
		r.fail("the token in %s is not valid on this machine (expired or revoked?); issue a new one there: t3 auth session issue --scope orchestration:read --scope orchestration:operate --token-only --ttl 365d --label t3code-mcp", m.TokenEnv)
		return
	}
	var missing, extra []string
	for _, n := range needed {
		if !slices.Contains(sess.Scopes, n) {
			missing = append(missing, n)
		}
	}
	for _, sc := range sess.Scopes {
		if !slices.Contains(needed, sc) {
			extra = append(extra, sc)
		}
	}
	if len(missing) > 0 {
		r.fail("the token lacks scope %s; issue one with --scope orchestration:read --scope orchestration:operate", strings.Join(missing, " and "))
	} else {
		r.ok("the token has orchestration:read and orchestration:operate")
	}
	if len(extra) > 0 {
		r.warn("the token also has %s: only orchestration:read and orchestration:operate are needed; a narrower token limits what a leak could do", strings.Join(extra, ", "))
	}
	if len(missing) > 0 && !slices.Contains(sess.Scopes, "orchestration:read") {
		return
	}
	projects, err := c.Projects(cctx)
	if err != nil {
		r.fail("listing projects: %v", err)
		return
	}
	var admitted []string
	for _, p := range projects {
		if m.Allows(p.Title, p.WorkspaceRoot) {
			admitted = append(admitted, fmt.Sprintf("%s (%s)", p.Title, p.WorkspaceRoot))
		}
	}
	if len(admitted) == 0 {
		r.warn("the allowlist %q admits none of the %d projects on this machine", m.Projects, len(projects))
	} else {
		r.ok("the allowlist %q admits %d of %d projects: %s", m.Projects, len(admitted), len(projects), strings.Join(admitted, ", "))
	}
}

func checkHook(ctx context.Context, r *report, s app.Settings) {
	if s.HookURL == "" {
		r.warn("T3CODE_MCP_HOOK_URL is not set: no events are sent (t3_wait still works)")
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodHead, s.HookURL, nil)
	if err != nil {
		r.fail("T3CODE_MCP_HOOK_URL is not a valid URL")
		return
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.fail("the hook URL does not answer (T3CODE_MCP_HOOK_URL): %v", redactURL(err, s.HookURL))
		return
	}
	resp.Body.Close()
	r.ok("the hook URL answers (HTTP %d to HEAD)", resp.StatusCode)
	if s.HookSecret == "" {
		r.warn("T3CODE_MCP_HOOK_SECRET is not set: deliveries are not signed")
	}
}

// redactURL keeps a hook URL (which may carry a credential) out of messages.
func redactURL(err error, u string) string {
	return strings.ReplaceAll(err.Error(), u, "<hook url>")
}
