package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/config"
	"github.com/t3code-mcp/t3code-mcp/internal/demo"
	"github.com/t3code-mcp/t3code-mcp/internal/memreturn"
	"github.com/t3code-mcp/t3code-mcp/internal/plural"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// configPath is the machines file to use: T3CODE_MCP_CONFIG (--config), else
// ./t3code.toml when present, else "" (the demo machine).
func configPath(s app.Settings) string {
	if s.ConfigPath != "" {
		return s.ConfigPath
	}
	if _, err := os.Stat("t3code.toml"); err == nil {
		return "t3code.toml"
	}
	return ""
}

// connector is a built connector and, without a config, the demo machine it
// serves.
type connector struct {
	*app.App
	demo *demo.Demo
}

// run runs the connector until ctx ends, and beside it the return of the heap's spare memory to
// the OS when the process turns quiet after a busy spell (the snapshot gate does it after
// start-up), which keeps the process's warm reserve (memreturn.Process, set by start) and ends
// its tight goal when the process gets busy. Memory is the process's: one Returner per process,
// here, for serve and stdio alike; its counters are on the connector's /metrics.
func (k *connector) run(ctx context.Context, log *slog.Logger) {
	var wg sync.WaitGroup
	r := &memreturn.Returner{Log: log, Heap: memreturn.Process}
	if err := r.Register(k.Registry); err != nil {
		log.Warn("memory return: its counters are not on /metrics", "err", err)
	}
	wg.Go(func() { r.Run(ctx) })
	k.Run(ctx)
	wg.Wait()
}

// Close closes the connector, then the demo (its state directory goes).
func (k *connector) Close() {
	k.App.Close()
	if k.demo != nil {
		_ = k.demo.Close()
	}
}

// start reads the settings and the config (or starts the demo machine) and
// builds the connector; on failure the reason is on stderr.
func (c *cli) start() (*connector, error) {
	s, err := c.settings()
	if err != nil {
		return nil, err
	}
	c.setHeapReserve(s)
	o := app.Options{Logger: c.log, Version: Version()}
	k := &connector{}
	if path := configPath(s); path != "" {
		cfg, err := config.Load(path)
		if err != nil {
			c.startupError(s, err)
			return nil, exitFailed
		}
		o.Config = cfg
	} else {
		d, err := demo.Start()
		if err != nil {
			fmt.Fprintln(c.stderr, "t3code-mcp: starting the demo machine:", err)
			return nil, exitFailed
		}
		k.demo = d
		// Demo threads never reach the real state directory.
		s.StateDir = d.StateDir()
		o.Config, o.Tokens, o.DemoMachines = d.Config(), d.Tokens(), d.Machines()
		c.log.Info("no t3code.toml found: serving the built-in demo machine", "url", d.URL(), "state", d.StateDir())
	}
	a, err := app.New(s, o)
	if err != nil {
		if k.demo != nil {
			_ = k.demo.Close()
		}
		c.startupError(s, err)
		return nil, startError{err}
	}
	k.App = a
	return k, nil
}

// startError is a connector that could not start (the reason is printed):
// exit code 1, and the cause for callers that say more.
type startError struct{ cause error }

func (e startError) Error() string   { return e.cause.Error() }
func (e startError) Unwrap() []error { return []error{exitFailed, e.cause} }

// startupError prints why the connector could not start, with a hint for a
// config file that is not there (a container without its mount).
func (c *cli) startupError(s app.Settings, err error) {
	fmt.Fprintln(c.stderr, "t3code-mcp:", err)
	if s.ConfigPath != "" && errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(c.stderr, "  T3CODE_MCP_CONFIG (--config) names %s, which does not exist: create it from t3code.example.toml (in a container: mount it there), or unset T3CODE_MCP_CONFIG to try the built-in demo machine\n", s.ConfigPath)
	}
}

func (c *cli) serve(ctx context.Context) error {
	c.setServeProcs()
	stopTrace, err := c.traceWindow()
	if err != nil {
		return err
	}
	defer stopTrace()
	k, err := c.start()
	if err != nil {
		return err
	}
	defer k.Close()
	s := k.Settings
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(c.stderr, "t3code-mcp: cannot listen on %s (T3CODE_MCP_HOST/T3CODE_MCP_PORT, --host/--port): %v\n", addr, err)
		return exitFailed
	}
	posts := &inflight{}
	srv := &http.Server{Handler: posts.track(k.Handler), ReadHeaderTimeout: 10 * time.Second}
	stopCalls := cancelOnStop(k.MCP)
	banner(c.stdout, k, ln.Addr().(*net.TCPAddr))

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.run(runCtx, c.log) }()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	var code error
	select {
	case <-ctx.Done():
	case err := <-errc:
		c.log.Error("http server stopped", "err", err)
		code = exitFailed
	}
	c.log.Info("shutting down")
	shutdown(srv, k.App, posts, stopCalls)
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
func banner(w io.Writer, k *connector, addr *net.TCPAddr) {
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	base := "http://" + net.JoinHostPort(host, strconv.Itoa(addr.Port))
	fmt.Fprintf(w, "t3code-mcp %s\n  MCP:     %s/mcp\n  health:  %s/healthz\n  metrics: %s/metrics\n", Version(), base, base, base)
	if addr.IP.IsUnspecified() {
		fmt.Fprintf(w, "  listen:  every interface, port %d (T3CODE_MCP_HOST=%s)\n", addr.Port, k.Settings.Host)
	}
	if k.Settings.Token != "" {
		fmt.Fprintln(w, "  auth:    /mcp requires Authorization: Bearer <T3CODE_MCP_TOKEN>")
	}
	if k.Settings.ReadOnly {
		fmt.Fprintln(w, "  tools:   read-only (t3_dispatch, t3_answer and t3_interrupt are not offered)")
	}
	if k.demo != nil {
		fmt.Fprintf(w, "  state:   %s (the demo's own, removed at exit)\n", k.Store.Location())
	} else {
		fmt.Fprintf(w, "  state:   %s\n", k.Store.Location())
	}
	if k.Settings.HookURL == "" {
		fmt.Fprintln(w, "  events:  off (set T3CODE_MCP_HOOK_URL to receive webhooks)")
	} else {
		fmt.Fprintln(w, "  events:  on")
	}
	if k.demo != nil {
		fmt.Fprintf(w, "\nNo t3code.toml found, so this is the built-in DEMO machine %q (a fake T3 server at %s).\n", demo.Name, k.demo.URL())
		fmt.Fprint(w, demo.Help())
		fmt.Fprintln(w, "\nTo add a real machine: on it run")
		fmt.Fprintln(w, "  t3 auth session issue --scope orchestration:read --scope orchestration:operate --token-only --ttl 365d --label t3code-mcp")
		fmt.Fprintln(w, "then copy t3code.example.toml to t3code.toml, set url and token_env, export the token, and restart.")
		fmt.Fprintf(w, "\nTry it: point an MCP client at %s/mcp (docs/clients.md), or in the repository run\n  go run ./scripts/smoke %s/mcp demo demo\n", base, base)
	} else {
		fmt.Fprintf(w, "  config:  %s (%s)\n", k.Config.Path, plural.Count(len(k.Config.Machines), "machine"))
	}
}

func (c *cli) stdio(ctx context.Context) error {
	k, err := c.start()
	if errors.Is(err, store.ErrInUse) {
		// The client may not show stderr: its initialize fails with the reason.
		refuseStdio(os.Stdin, c.stdout, "t3code-mcp cannot start: "+err.Error()+
			"; a t3code-mcp serve (or another stdio server) holds this state directory: connect this client to that serve over HTTP (docs/clients.md), or give this stdio server its own T3CODE_MCP_STATE_DIR")
		return err
	}
	if err != nil {
		return err
	}
	defer k.Close()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); k.run(runCtx, c.log) }()
	defer context.AfterFunc(ctx, cancelOnStop(k.MCP))()
	err = k.MCP.Run(ctx, &mcp.StdioTransport{})
	cancel()
	<-done
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) {
		fmt.Fprintln(c.stderr, "t3code-mcp:", err)
		return exitFailed
	}
	return nil
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
			defer context.AfterFunc(stopped, func() { cancel(tools.ErrShuttingDown) })()
			return next(ctx, method, req)
		}
	})
	return stop
}

// refuseStdio answers every JSON-RPC request on in (the first is the
// client's initialize) with an error carrying msg until the client closes
// stdin: a stdio server that cannot start says why to the client, which may
// not show its stderr. Exiting right after the answer could race the client
// reading it.
func refuseStdio(in io.Reader, out io.Writer, msg string) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		if json.Unmarshal(sc.Bytes(), &req) != nil || len(req.ID) == 0 || req.Method == "" {
			continue // a notification or a response: nothing to answer
		}
		resp, _ := json.Marshal(map[string]any{
			"jsonrpc": "2.0", "id": req.ID,
			"error": map[string]any{"code": -32603, "message": msg},
		})
		if _, err := out.Write(append(resp, '\n')); err != nil {
			return
		}
	}
}
