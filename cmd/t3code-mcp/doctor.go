package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/outbox"
	"github.com/t3code-mcp/t3code-mcp/internal/plural"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/pgstore"
	"github.com/t3code-mcp/t3code-mcp/internal/t3"
)

func openStore(s app.Settings) (store.Store, error) {
	st, err := app.OpenStore(s)
	if errors.Is(err, store.ErrInUse) {
		return nil, fmt.Errorf("%w: stop the running t3code-mcp first (it holds %s)", err, s.StateDir)
	}
	return st, err
}

// Scopes of a T3 token.
const (
	scopeRead    = "orchestration:read"
	scopeOperate = "orchestration:operate"
)

// report collects doctor lines; any failure makes the exit code non-zero.
type report struct {
	w      io.Writer
	failed bool
	warns  int
}

func (r *report) section(format string, a ...any) { fmt.Fprintf(r.w, "\n"+format+"\n", a...) }
func (r *report) ok(format string, a ...any)      { fmt.Fprintf(r.w, "  ok    "+format+"\n", a...) }
func (r *report) warn(format string, a ...any) {
	r.warns++
	fmt.Fprintf(r.w, "  warn  "+format+"\n", a...)
}
func (r *report) fail(format string, a ...any) {
	r.failed = true
	fmt.Fprintf(r.w, "  FAIL  "+format+"\n", a...)
}

// doctor checks the settings, the config, every machine, the hook and the
// state file, printing one line per check. Exit code: 0 when nothing failed
// (warnings allowed), 1 otherwise. It reads the environment only; it never
// changes anything on a machine or at the hook.
func (c *cli) doctor(ctx context.Context) error {
	stdout := c.stdout
	r := &report{w: stdout}
	fmt.Fprintf(stdout, "t3code-mcp %s doctor\n", Version())
	s, err := app.SettingsFromEnv(c.getenv)
	if err != nil {
		// Report every bad variable; the checks below go on with the defaults.
		r.section("settings")
		for line := range strings.SplitSeq(err.Error(), "\n") {
			r.fail("%s", line)
		}
	}
	checkConfig(ctx, r, s)
	r.section("events")
	checkHook(ctx, r, s)
	r.section("server")
	checkServer(ctx, r, s)
	r.section("state")
	checkState(r, s)
	switch {
	case r.failed:
		fmt.Fprintln(stdout, "\ndoctor: problems found (FAIL lines above)")
		return exitFailed
	case r.warns > 0:
		fmt.Fprintf(stdout, "\ndoctor: all good, %s above\n", plural.Count(r.warns, "warning"))
	default:
		fmt.Fprintln(stdout, "\ndoctor: all good")
	}
	return nil
}

func checkConfig(ctx context.Context, r *report, s app.Settings) {
	path := configPath(s)
	if path == "" {
		r.section("config")
		r.warn("no config: T3CODE_MCP_CONFIG (--config) is unset and there is no ./t3code.toml, so `serve` will start the built-in demo machine (a fake T3 with scripted runs, its state removed at exit); to use real machines copy t3code.example.toml to t3code.toml and add them")
		return
	}
	cfg, err := config.Load(path)
	if err != nil {
		r.section("config: %s", path)
		r.fail("%v", err)
		return
	}
	r.section("config: %s (%s)", path, plural.Count(len(cfg.Machines), "machine"))
	if len(cfg.Machines) == 0 {
		r.fail("no [machines.NAME] table: add one (see t3code.example.toml)")
	}
	for _, m := range cfg.Machines {
		r.section("machine %q (%s)", m.Name, m.URL)
		checkMachine(ctx, r, m, s.HTTPTimeout)
	}
}

func checkMachine(ctx context.Context, r *report, m config.Machine, timeout time.Duration) {
	token, err := m.Token()
	if err != nil {
		r.fail("%v: export it with the machine's token (`%s` on the machine issues one)", err, t3.IssueCommand)
		return
	}
	r.ok("token variable %s is set", m.TokenEnv)
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	c, err := t3.NewClient(m.Name, m.URL, token, t3.Options{Timeout: timeout, HTTPClient: hc, Compression: m.Compression})
	if err != nil {
		r.fail("%v", err)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 4*timeout)
	defer cancel()
	d, err := c.Handshake(cctx)
	var te *t3.Error
	if errors.As(err, &te) && te.Status == http.StatusNotFound {
		r.fail("%s answers HTTP 404 at /.well-known/t3/environment, the descriptor every `t3 serve` answers: the url probably does not point at `t3 serve`; check the host and port (T3's default is 3773) and, behind a reverse proxy, that it passes every path to T3", m.URL)
		return
	}
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
		r.fail("the token in %s is not valid on this machine (wrong, expired or revoked); issue a new one there: %s", m.TokenEnv, t3.IssueCommand)
		return
	}
	needed := []string{scopeRead, scopeOperate}
	if m.ReadOnly() {
		needed = needed[:1]
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
		r.fail("the token lacks scope %s; issue one on the machine with: %s", strings.Join(missing, " and "), t3.IssueCommand)
	} else {
		r.ok("the token is valid and has %s", strings.Join(needed, " and "))
	}
	if len(extra) > 0 {
		why := "only " + strings.Join(needed, " and ") + " are needed"
		if m.ReadOnly() {
			why = `access = "read" needs only ` + scopeRead
		}
		r.warn("the token also has %s: %s; a narrower token limits what a leak could do", strings.Join(extra, ", "), why)
	}
	if !slices.Contains(sess.Scopes, scopeRead) {
		return
	}
	checkSocket(cctx, r, c, m)
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
		r.warn("the allowlist (projects = %q) admits none of the %s on this machine: agents will see no project there", m.Projects, plural.Count(len(projects), "project"))
	} else {
		r.ok("the allowlist (projects = %q) admits %d of %d projects: %s", m.Projects, len(admitted), len(projects), strings.Join(admitted, ", "))
	}
}

// checkSocket opens the Effect RPC WebSocket the connector runs on (a reverse
// proxy that does not pass WebSocket upgrades fails here), asks for the
// providers and checks the configured model against them.
func checkSocket(ctx context.Context, r *report, c *t3.Client, m config.Machine) {
	conn, err := c.DialRPC(ctx)
	if err != nil {
		r.fail("the WebSocket (/ws) does not open: %v", err)
		return
	}
	defer conn.Close()
	cfg, err := c.GetConfig(ctx, conn)
	if err != nil {
		r.fail("the WebSocket (/ws) opens but server.getConfig failed: %v", err)
		return
	}
	var ready []string
	for _, p := range cfg.Providers {
		if t3.ProviderUsable(p) {
			ready = append(ready, p.InstanceId)
		}
	}
	if len(ready) == 0 {
		r.warn("the WebSocket (/ws) works, but no provider is ready on this machine: runs will fail until one is enabled in T3 Code")
	} else {
		r.ok("the WebSocket (/ws) works; providers ready: %s", strings.Join(ready, ", "))
	}
	inst, slug, ok := m.ModelSelection()
	if !ok {
		return
	}
	var avail []string
	for _, p := range cfg.Providers {
		for _, md := range p.Models {
			if !t3.ProviderUsable(p) {
				continue
			}
			avail = append(avail, p.InstanceId+"/"+md.Slug)
			if p.InstanceId != inst || md.Slug != slug {
				continue
			}
			if bad := unknownOptions(md, m.Options); len(bad) > 0 {
				r.fail("model %s has no option %s (t3code.toml options); t3_dispatch would refuse every new thread", m.Model, strings.Join(bad, ", "))
				return
			}
			r.ok("model %s is available", m.Model)
			return
		}
	}
	if len(avail) == 0 {
		avail = []string{"none"}
	}
	r.fail("model %s (t3code.toml) is not available on this machine, so t3_dispatch would refuse every new thread; available: %s", m.Model, strings.Join(avail, ", "))
}

// unknownOptions lists configured option ids the model does not declare.
func unknownOptions(md t3rpc.ProviderModel, opts map[string]any) []string {
	known := map[string]bool{}
	if caps, ok := md.Capabilities.Get(); ok {
		for _, d := range caps.OptionDescriptors {
			known[d.ID] = true
		}
	}
	var bad []string
	for id := range opts {
		if !known[id] {
			bad = append(bad, strconv.Quote(id))
		}
	}
	slices.Sort(bad)
	return bad
}

func checkHook(ctx context.Context, r *report, s app.Settings) {
	if s.HookURL == "" {
		r.warn("T3CODE_MCP_HOOK_URL is not set: no events are sent (t3_wait still works)")
		return
	}
	u, err := url.Parse(s.HookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL is never echoed: it may carry a credential in its query.
		r.fail("T3CODE_MCP_HOOK_URL must be an http:// or https:// URL")
		return
	}
	if s.HookSecret != "" {
		if _, err := outbox.DecodeSecret(s.HookSecret); err != nil {
			r.fail("%s", strings.TrimPrefix(err.Error(), "outbox: "))
		} else {
			r.ok("T3CODE_MCP_HOOK_SECRET is a valid Standard Webhooks secret: deliveries are signed")
		}
	} else {
		r.warn("T3CODE_MCP_HOOK_SECRET is not set: deliveries are not signed (receivers can check T3CODE_MCP_HOOK_TOKEN only)")
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodHead, s.HookURL, nil)
	if err != nil {
		r.fail("T3CODE_MCP_HOOK_URL is not a valid URL")
		return
	}
	if s.HookToken != "" {
		req.Header.Set("Authorization", "Bearer "+s.HookToken)
	}
	// Deliveries never follow redirects; neither does this check.
	hc := &http.Client{
		Transport:     http.DefaultTransport.(*http.Transport).Clone(),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		r.fail("the hook URL (T3CODE_MCP_HOOK_URL) does not answer: %s; events queue up and are retried for T3CODE_MCP_HOOK_MAX_AGE (%s), then become dead letters", redact(netCause(err), s), s.HookMaxAge)
		return
	}
	resp.Body.Close()
	code := resp.StatusCode
	switch {
	case code >= 300 && code < 400:
		r.fail("the hook URL redirects (HTTP %d to HEAD): deliveries do not follow redirects and would become dead letters; set T3CODE_MCP_HOOK_URL to the final URL", code)
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		r.warn("the hook URL answers HTTP %d to HEAD: if the receiver checks the bearer, T3CODE_MCP_HOOK_TOKEN is wrong or unset (a refused delivery becomes a dead letter at once)", code)
	case code == http.StatusNotFound:
		r.warn("the hook URL answers HTTP 404 to HEAD: check its path (a delivery answered 404 becomes a dead letter at once)")
	case code >= 500:
		r.warn("the hook URL answers HTTP %d to HEAD: the receiver has a problem (deliveries answered 5xx are retried)", code)
	default:
		r.ok("the hook URL answers (HTTP %d to HEAD)", code)
	}
}

// netCause is the network error without the request line around it.
func netCause(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err.Error()
	}
	return err.Error()
}

// redact keeps the hook URL and its secrets (a URL may carry a credential)
// out of messages.
func redact(msg string, s app.Settings) string {
	for _, sec := range []string{s.HookURL, s.HookToken, s.HookSecret} {
		if sec != "" {
			msg = strings.ReplaceAll(msg, sec, "<redacted>")
		}
	}
	return msg
}

func checkServer(ctx context.Context, r *report, s app.Settings) {
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	checkListen(ctx, r, addr)
	ip := net.ParseIP(s.Host)
	loopback := s.Host == "localhost" || (ip != nil && ip.IsLoopback())
	switch {
	case s.Token != "":
		r.ok("serve listens on %s; /mcp requires the bearer in T3CODE_MCP_TOKEN", addr)
	case loopback:
		r.ok("serve listens on %s (this host only); /mcp needs no token", addr)
	default:
		r.warn("serve listens on %s and T3CODE_MCP_TOKEN is not set: anyone who can reach that port can start threads; set T3CODE_MCP_TOKEN", addr)
	}
}

// checkListen tries the listen address serve will use: a port another
// process holds makes serve stop with "address already in use".
func checkListen(ctx context.Context, r *report, addr string) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		ln.Close()
		r.ok("the listen address %s is free", addr)
		return
	}
	if isConnector(ctx, addr) {
		r.warn("a t3code-mcp already serves on %s: a second serve there would stop with \"address already in use\"; use it, stop it, or pick another T3CODE_MCP_PORT (--port)", addr)
		return
	}
	r.fail("serve cannot listen on %s (T3CODE_MCP_HOST/T3CODE_MCP_PORT, --host/--port): %v; another process has it: stop that one or pick another T3CODE_MCP_PORT (--port)", addr, err)
}

// isConnector reports whether what listens on addr is a t3code-mcp (its /
// page says so).
func isConnector(ctx context.Context, addr string) bool {
	host, port, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+"/", nil)
	if err != nil {
		return false
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	head := make([]byte, len("t3code-mcp "))
	n, _ := io.ReadFull(resp.Body, head)
	return string(head[:n]) == "t3code-mcp "
}

func checkState(r *report, s app.Settings) {
	if s.DatabaseURL != "" {
		checkDatabase(r, s)
		return
	}
	path := filepath.Join(s.StateDir, store.FileName)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		r.ok("no state file yet at %s (T3CODE_MCP_STATE_DIR): serve creates it", path)
		return
	}
	st, err := store.Open(s.StateDir)
	if errors.Is(err, store.ErrInUse) {
		r.ok("%s is in use by a running t3code-mcp", path)
		return
	}
	if err != nil {
		r.fail("%v", err)
		return
	}
	defer st.Close()
	reportState(r, st, path)
}

// checkDatabase reports the database's schema version against this binary's migrations and
// what it holds, changing nothing: it connects without migrating (serve migrates at start).
func checkDatabase(r *report, s app.Settings) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db, err := pgstore.Connect(ctx, s.DatabaseURL)
	if err != nil {
		r.fail("database (T3CODE_MCP_DATABASE_URL): %v", err)
		return
	}
	defer db.Close()
	sc, err := db.Schema(ctx)
	if err != nil {
		r.fail("database %s: reading its schema version: %v", db.Location(), err)
		return
	}
	switch {
	case sc.Version > sc.Latest:
		r.fail("database %s: schema %d was migrated by a newer t3code-mcp (this binary knows %d and refuses it): upgrade this binary", db.Location(), sc.Version, sc.Latest)
		return
	case sc.Version == 0:
		r.ok("database %s answers and holds no connector schema yet: serve creates it at start (%s)", db.Location(), plural.Count(len(sc.Pending), "migration"))
		return
	case len(sc.Pending) > 0:
		r.warn("database %s: schema %d of %d; serve applies %s at start: %s", db.Location(), sc.Version, sc.Latest,
			plural.Count(len(sc.Pending), "pending migration"), strings.Join(sc.Pending, ", "))
	default:
		r.ok("database %s: schema %d (current)", db.Location(), sc.Version)
	}
	reportState(r, db, db.Location())
}

// reportState reports what the store holds: where names it (a file, or the database URL
// without its password).
func reportState(r *report, st store.Store, where string) {
	threads, err := st.ListThreads()
	if err != nil {
		r.fail("reading %s: %v", where, err)
		return
	}
	pending, dead, _, err := st.Counts()
	if err != nil {
		r.fail("reading %s: %v", where, err)
		return
	}
	r.ok("%s: %s tracked, %s pending", where, plural.Count(len(threads), "thread"), plural.Count(pending, "event"))
	if dead > 0 {
		r.warn("%s (events the hook never accepted): `t3code-mcp dead-letters` lists them, `t3code-mcp dead-letters retry` requeues them", plural.Count(dead, "dead letter"))
	}
}
