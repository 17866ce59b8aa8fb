// Command t3code-mcp is an MCP server that runs coding threads on T3 Code
// machines. Subcommands:
//
//	t3code-mcp [serve]            MCP over streamable HTTP at /mcp (default)
//	t3code-mcp stdio              the same tools over stdio, for local clients
//	t3code-mcp doctor             check the config, machines, tokens and hook
//	t3code-mcp dead-letters       list undeliverable events; `retry [id…]` requeues them
//	t3code-mcp healthcheck        exit 0 when the local serve answers /healthz (container HEALTHCHECK)
//	t3code-mcp version
//
// Settings come from the environment (docs/configuration.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func usage(w io.Writer) {
	fmt.Fprintf(w, `t3code-mcp %s — run coding threads on T3 Code machines over MCP

usage: t3code-mcp [flags] [serve | stdio | doctor | dead-letters [retry [id…]] | audit | healthcheck | version]

commands:
  serve             MCP over streamable HTTP at /mcp (the default)
  stdio             the same tools over stdin/stdout, for local clients
  doctor            check the config, each machine, the hook and the state file
  dead-letters      list events the hook never accepted; "dead-letters retry [id…]" requeues them
  audit             print the audit log of mutating calls; filters --machine M, --thread T, --since 2h; --json
  healthcheck       exit 0 when the serve on T3CODE_MCP_HOST/T3CODE_MCP_PORT answers /healthz
  version           print the version

flags:
  --log-json        log JSON lines instead of text (or T3CODE_MCP_LOG_FORMAT=json)
  --log-level L     debug, info (default), warn or error (or T3CODE_MCP_LOG_LEVEL)

Configuration: T3CODE_MCP_CONFIG (t3code.toml), T3CODE_MCP_HOST, T3CODE_MCP_PORT, T3CODE_MCP_STATE_DIR,
T3CODE_MCP_HOOK_URL/_TOKEN/_SECRET, T3CODE_MCP_TOKEN, … — see docs/configuration.md.
`, server.Version)
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("t3code-mcp", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { usage(stderr) }
	logJSON := fs.Bool("log-json", os.Getenv("T3CODE_MCP_LOG_FORMAT") == "json", "log JSON lines")
	logLevel := fs.String("log-level", envOr("T3CODE_MCP_LOG_LEVEL", "info"), "log level")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "--log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	// Logs go to stderr always: stdout is the MCP channel under stdio.
	hopts := &slog.HandlerOptions{Level: level}
	var h slog.Handler = slog.NewTextHandler(stderr, hopts)
	if *logJSON {
		h = slog.NewJSONHandler(stderr, hopts)
	}
	log := slog.New(h)
	slog.SetDefault(log)

	cmd, rest := "serve", []string(nil)
	if fs.NArg() > 0 {
		cmd, rest = fs.Arg(0), fs.Args()[1:]
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch cmd {
	case "serve":
		return serve(ctx, log, stdout, stderr)
	case "stdio":
		return stdio(ctx, log, stderr)
	case "doctor":
		return doctor(ctx, stdout)
	case "healthcheck":
		return healthcheck(ctx, stdout, stderr)
	case "dead-letters":
		return deadLetters(rest, stdout, stderr)
	case "audit":
		return auditLog(rest, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "t3code-mcp", server.Version)
		return 0
	case "help":
		usage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "unknown command %q\n\n", cmd)
	usage(stderr)
	return 2
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func settings(stderr io.Writer) (app.Settings, bool) {
	s, err := app.SettingsFromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(stderr, "configuration error:", err)
		return s, false
	}
	return s, true
}

// startApp reads the settings and builds the connector; a non-zero code means
// it could not (the reason is on stderr).
func startApp(log *slog.Logger, stderr io.Writer) (*app.App, app.Settings, int) {
	s, ok := settings(stderr)
	if !ok {
		return nil, s, 2
	}
	a, err := app.New(s, log)
	if err != nil {
		startupError(stderr, s, err)
		return nil, s, 1
	}
	return a, s, 0
}

func serve(ctx context.Context, log *slog.Logger, stdout, stderr io.Writer) int {
	a, s, code := startApp(log, stderr)
	if code != 0 {
		return code
	}
	defer a.Close()
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "t3code-mcp: cannot listen on %s (T3CODE_MCP_HOST/T3CODE_MCP_PORT): %v\n", addr, err)
		return 1
	}
	posts := &inflight{}
	srv := &http.Server{Handler: posts.track(a.Handler), ReadHeaderTimeout: 10 * time.Second}
	stopCalls := cancelOnStop(a.MCP)
	banner(stdout, a, ln.Addr().(*net.TCPAddr))

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	code = 0
	select {
	case <-ctx.Done():
	case err := <-errc:
		log.Error("http server stopped", "err", err)
		code = 1
	}
	log.Info("shutting down")
	shutdown(srv, a, posts, stopCalls)
	cancel()
	<-done
	return code
}

// shutdown stops serve without waiting on callers: in-flight calls (a
// t3_wait may block for an hour) end at once with an error result, which
// reaches the client before its session is closed (closing it ends the
// streams that Shutdown would otherwise wait for). Clients reconnect to the
// next instance; their threads go on in T3.
func shutdown(srv *http.Server, a *app.App, posts *inflight, stopCalls func()) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stopCalls()
	shut := make(chan struct{})
	go func() { defer close(shut); _ = srv.Shutdown(ctx) }() // no new requests from here on
	posts.wait(ctx)                                          // the answers of the ended calls are written
	for ss := range a.MCP.Sessions() {
		_ = ss.Close()
	}
	<-shut
}

// inflight counts POST requests being served (the MCP calls; a GET is a
// session's event stream, which lasts as long as the session).
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0
}

func (f *inflight) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			f.mu.Lock()
			if f.n == 0 {
				f.idle = make(chan struct{})
			}
			f.n++
			f.mu.Unlock()
			defer func() {
				f.mu.Lock()
				if f.n--; f.n == 0 {
					close(f.idle)
				}
				f.mu.Unlock()
			}()
		}
		next.ServeHTTP(w, r)
	})
}

// wait returns when no POST is being served, or when ctx ends.
func (f *inflight) wait(ctx context.Context) {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
}

// banner tells where the connector listens and, for the demo, how to add a
// real machine. A wildcard listen address is shown as loopback, the address
// a local client uses.
func banner(w io.Writer, a *app.App, addr *net.TCPAddr) {
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	base := "http://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
	fmt.Fprintf(w, "t3code-mcp %s\n  MCP:     %s/mcp\n  health:  %s/healthz\n  metrics: %s/metrics\n", server.Version, base, base, base)
	if addr.IP.IsUnspecified() {
		fmt.Fprintf(w, "  listen:  every interface, port %d (T3CODE_MCP_HOST=%s)\n", addr.Port, a.Settings.Host)
	}
	if a.Settings.Token != "" {
		fmt.Fprintln(w, "  auth:    /mcp requires Authorization: Bearer <T3CODE_MCP_TOKEN>")
	}
	fmt.Fprintf(w, "  state:   %s\n", a.Store.Path())
	if a.Settings.HookURL == "" {
		fmt.Fprintln(w, "  events:  off (set T3CODE_MCP_HOOK_URL to receive webhooks)")
	} else {
		fmt.Fprintln(w, "  events:  on")
	}
	if a.Demo != nil {
		fmt.Fprintf(w, "\nNo t3code.toml found, so this is the built-in DEMO machine %q (a fake T3 server at %s).\n", "demo", a.Demo.URL())
		fmt.Fprint(w, app.DemoHelp())
		fmt.Fprintln(w, "\nTo add a real machine: on it run")
		fmt.Fprintln(w, "  t3 auth session issue --scope orchestration:read --scope orchestration:operate --token-only --ttl 365d --label t3code-mcp")
		fmt.Fprintln(w, "then copy t3code.example.toml to t3code.toml, set url and token_env, export the token, and restart.")
		fmt.Fprintf(w, "\nTry it: point an MCP client at %s/mcp (docs/clients.md), or in the repository run\n  go run ./scripts/smoke %s/mcp demo demo\n", base, base)
	} else {
		fmt.Fprintf(w, "  config:  %s (%d machines)\n", a.Config.Path, len(a.Config.Machines))
	}
}

func stdio(ctx context.Context, log *slog.Logger, stderr io.Writer) int {
	a, _, code := startApp(log, stderr)
	if code != 0 {
		return code
	}
	defer a.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(runCtx) }()
	defer context.AfterFunc(ctx, cancelOnStop(a.MCP))()
	err := a.MCP.Run(ctx, &mcp.StdioTransport{})
	cancel()
	<-done
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
		fmt.Fprintln(stderr, "t3code-mcp:", err)
		return 1
	}
	return 0
}

// cancelOnStop makes the context of every MCP request end when the returned
// stop is called. The SDK never cancels a running handler when a session
// closes, it waits for it: without this a t3_wait in flight would hold a
// SIGTERM for up to T3CODE_MCP_MAX_WAIT.
func cancelOnStop(srv *mcp.Server) (stop func()) {
	stopped, stop := context.WithCancel(context.Background())
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			ctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			defer context.AfterFunc(stopped, func() { cancel(errShuttingDown) })()
			return next(ctx, method, req)
		}
	})
	return stop
}

// errShuttingDown is the cause of calls ended by a shutdown.
var errShuttingDown = errors.New("t3code-mcp is shutting down; the thread goes on in T3: call again once the connector is back")

// startupError prints why the connector could not start, with a hint for a
// config file that is not there (a container without its mount).
func startupError(stderr io.Writer, s app.Settings, err error) {
	fmt.Fprintln(stderr, "t3code-mcp:", err)
	if s.ConfigPath != "" && errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "  T3CODE_MCP_CONFIG names %s, which does not exist: create it from t3code.example.toml (in a container: mount it there), or unset T3CODE_MCP_CONFIG to try the built-in demo machine\n", s.ConfigPath)
	}
}

func deadLetters(args []string, stdout, stderr io.Writer) int {
	s, ok := settings(stderr)
	if !ok {
		return 2
	}
	st, err := openStore(s)
	if err != nil {
		fmt.Fprintln(stderr, "t3code-mcp:", err)
		return 1
	}
	defer st.Close()
	if len(args) > 0 && args[0] == "retry" {
		n, err := st.Requeue(time.Now(), args[1:]...)
		if err != nil {
			fmt.Fprintln(stderr, "t3code-mcp:", err)
			return 1
		}
		fmt.Fprintf(stdout, "requeued %d dead letters; a running connector delivers them on its next pass\n", n)
		return 0
	}
	if len(args) > 0 {
		fmt.Fprintf(stderr, "unknown dead-letters command %q: use `dead-letters` to list or `dead-letters retry [id…]`\n", args[0])
		return 2
	}
	dead, err := st.Dead()
	if err != nil {
		fmt.Fprintln(stderr, "t3code-mcp:", err)
		return 1
	}
	for _, e := range dead {
		fmt.Fprintf(stdout, "%s\t%s\t%s\tattempts=%d\t%s\n", e.ID, e.Stream, e.DeadAt.Format(time.RFC3339), e.Attempts, strings.ReplaceAll(e.LastError, "\n", " "))
	}
	fmt.Fprintf(stdout, "%d dead letters\n", len(dead))
	return 0
}
