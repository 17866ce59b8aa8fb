// Package server is the connector's HTTP face: MCP (streamable HTTP) at /mcp,
// health at /healthz, Prometheus metrics at /metrics. /mcp can require a bearer
// (T3CODE_MCP_TOKEN, compared in constant time); the SDK's DNS-rebinding
// protection stays on for loopback.
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/t3code-mcp/t3code-mcp/internal/fleet"
	"github.com/t3code-mcp/t3code-mcp/internal/tools"
)

// instructions tell an agent how the tools fit together.
const instructions = `t3code-mcp runs coding threads on T3 Code machines. Start with t3_machines, then t3_projects(machine).
t3_dispatch starts a run and returns a thread_id at once; t3_wait(thread_id) blocks until the run completes,
fails, is interrupted or asks a question (answer with t3_answer); t3_thread reads the state without waiting.`

// NewMCPServer makes the MCP server with the tools; version is its
// serverInfo.version (the binary's, stamped at build time).
func NewMCPServer(d *tools.Deps, version string) *mcp.Server {
	o := &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       sdkLogger(d.Logger),
	}
	d.ServerOptions(o)
	s := mcp.NewServer(&mcp.Implementation{Name: "t3code-mcp", Title: "T3 Code threads", Version: version}, o)
	tools.Register(s, d)
	if d.Push != nil {
		tools.RegisterResources(s, d)
		d.Push.Bind(s)
	}
	return s
}

// Options for the HTTP handler.
type Options struct {
	// Version is shown on the / page.
	Version string
	// Token, when set, is required as `Authorization: Bearer <token>` on /mcp.
	Token string
	// SessionTimeout closes idle MCP sessions (the SDK's KeepAlive is not
	// used: it closes sessions of clients that never open a GET stream).
	SessionTimeout time.Duration
	// MaxBodyBytes bounds an MCP request body.
	MaxBodyBytes int64
	Logger       *slog.Logger
	// Registry serves /metrics.
	Registry *prometheus.Registry
	// Health adds fields to /healthz (events, outbox).
	Health func() map[string]any
	// OnSessionEnd, when set, is called with the session id of a DELETE /mcp
	// before the SDK closes the session (which waits for the session's calls
	// to return): tools end their long calls (t3_wait) there.
	OnSessionEnd func(sessionID string)
}

// Handler serves /mcp, /healthz and /metrics.
func Handler(srv *mcp.Server, f *fleet.Fleet, o Options) http.Handler {
	if o.SessionTimeout <= 0 {
		o.SessionTimeout = 30 * time.Minute
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = 4 << 20
	}
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		SessionTimeout:      o.SessionTimeout,
		MaxRequestBodyBytes: o.MaxBodyBytes,
		Logger:              sdkLogger(o.Logger),
	})
	var mcpEntry = abandonedCalls(mcpHandler, o.MaxBodyBytes)
	if o.OnSessionEnd != nil {
		inner := mcpEntry
		mcpEntry = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id := r.Header.Get("Mcp-Session-Id"); r.Method == http.MethodDelete && id != "" {
				o.OnSessionEnd(id)
			}
			inner.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/mcp", requireBearer(o.Token, mcpEntry))
	mux.Handle("/mcp/", requireBearer(o.Token, mcpEntry))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(healthBody(f, o.Health))
	})
	if o.Registry != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(o.Registry, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("t3code-mcp " + o.Version + ": MCP at /mcp, health at /healthz, metrics at /metrics\n"))
	})
	return mux
}

// sdkLogger is the logger handed to the MCP SDK: its per-session lifecycle
// lines ("server session connected", "session initialized", …), several per
// client call, are debug; its warnings and errors stay what they are. The
// connector's own line per tool call is at info.
func sdkLogger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return nil
	}
	return slog.New(demoted{l.Handler()})
}

// demoted turns info records into debug ones.
type demoted struct{ slog.Handler }

func (h demoted) Enabled(ctx context.Context, l slog.Level) bool {
	return h.Handler.Enabled(ctx, demote(l))
}

func (h demoted) Handle(ctx context.Context, r slog.Record) error {
	r.Level = demote(r.Level)
	return h.Handler.Handle(ctx, r)
}

func (h demoted) WithAttrs(as []slog.Attr) slog.Handler { return demoted{h.Handler.WithAttrs(as)} }
func (h demoted) WithGroup(name string) slog.Handler    { return demoted{h.Handler.WithGroup(name)} }

func demote(l slog.Level) slog.Level {
	if l < slog.LevelWarn {
		return min(l, slog.LevelDebug)
	}
	return l
}

// requireBearer rejects requests without the configured bearer.
func requireBearer(token string, next http.Handler) http.Handler {
	if token == "" {
		return next
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The scheme is case-insensitive (RFC 9110 §11.1): "bearer x" is the same credential.
		scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="t3code-mcp"`)
			http.Error(w, `{"error":"unauthorized","message":"send Authorization: Bearer <T3CODE_MCP_TOKEN>"}`, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// machineHealth is one machine in /healthz.
type machineHealth struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Online  bool   `json:"online"`
	Demo    bool   `json:"demo,omitempty"`
	Problem string `json:"problem,omitempty"`
}

// healthBody is the /healthz body: ok when every machine is online.
func healthBody(f *fleet.Fleet, extra func() map[string]any) map[string]any {
	ok := true
	ms := []machineHealth{}
	for _, m := range f.Machines() {
		in := m.Info()
		ms = append(ms, machineHealth{Name: in.Name, Status: in.Status, Online: in.Online, Demo: in.Demo, Problem: in.Problem})
		ok = ok && in.Online
	}
	out := map[string]any{"ok": ok, "machines": ms}
	if extra != nil {
		for k, v := range extra() {
			out[k] = v
		}
	}
	return out
}
