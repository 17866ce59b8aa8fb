package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/t3code-mcp/t3code-mcp/internal/app"
	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// fasthttpCleaner is the outbox's webhook client's housekeeping goroutine: it closes idle
// connections and ends by itself within a few seconds of the last one closing (the outbox closes
// them all when it stops), longer than goleak's retries wait.
const fasthttpCleaner = "github.com/valyala/fasthttp.(*HostClient).connsCleaner"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(fasthttpCleaner)) }

// harness runs the whole connector in-process: app.New over a real state
// directory, its HTTP handler on a real 127.0.0.1 listener, fake T3 machines
// speaking the wire protocol, an optional real webhook receiver, and go-sdk
// MCP clients.
type harness struct {
	t        *testing.T
	fake     *t3fake.Server
	app      *app.App
	http     *httptest.Server
	cancel   context.CancelFunc
	done     chan struct{}
	logs     *syncBuffer
	hook     *receiver
	stateDir string
	cfgPath  string
}

type harnessOpts struct {
	projects  string // TOML array for machine "mac"
	extraTOML string
	hook      bool
	stateDir  string
	settings  func(*app.Settings)
	fake      *t3fake.Server
}

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

const macTokenEnv = "T3CODE_MCP_TEST_MAC_TOKEN"

func newHarness(t *testing.T, o harnessOpts) *harness {
	t.Helper()
	h := &harness{t: t, logs: &syncBuffer{}, done: make(chan struct{})}
	h.fake = o.fake
	if h.fake == nil {
		h.fake = t3fake.StartT(t, t3fake.Options{Label: "mac-env", StepDelay: time.Millisecond})
		h.fake.AddProject("api", "/srv/api")
		h.fake.AddProject("secret", "/srv/secret")
	}
	t.Setenv(macTokenEnv, h.fake.Token())
	if o.projects == "" {
		o.projects = `["api"]`
	}
	h.stateDir = o.stateDir
	if h.stateDir == "" {
		h.stateDir = t.TempDir()
	}
	h.cfgPath = filepath.Join(t.TempDir(), "t3code.toml")
	cfg := fmt.Sprintf("[machines.mac]\nurl = %q\ntoken_env = %q\nprojects = %s\n%s", h.fake.URL(), macTokenEnv, o.projects, o.extraTOML)
	if err := os.WriteFile(h.cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := app.SettingsFromEnv(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	s.ConfigPath, s.StateDir = h.cfgPath, h.stateDir
	if o.hook {
		h.hook = newReceiver(t)
		s.HookURL, s.HookToken, s.HookSecret = h.hook.srv.URL, "hook-token-7f3a", "whsec_"+"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	}
	if o.settings != nil {
		o.settings(&s)
	}
	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	a, err := app.New(s, app.Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	h.app = a
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() { defer close(h.done); a.Run(ctx) }()
	h.http = httptest.NewServer(a.Handler)
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.http == nil {
		return
	}
	h.http.CloseClientConnections()
	h.http.Close()
	h.cancel()
	<-h.done
	h.app.Close()
	h.http = nil
}

// waitOnline blocks until /healthz says the machine is online.
func (h *harness) waitOnline(machine string) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, m := range h.health()["machines"].([]any) {
			mm := m.(map[string]any)
			if mm["name"] == machine && mm["online"] == true {
				return
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	h.t.Fatalf("machine %q not online; health: %v\nlogs:\n%s", machine, h.health(), h.logs.String())
}

func (h *harness) health() map[string]any {
	h.t.Helper()
	resp, err := http.Get(h.http.URL + "/healthz")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// client is one MCP client session; origin is sent as X-Conversation-Origin.
type client struct {
	t        *testing.T
	session  *mcp.ClientSession
	progress chan *mcp.ProgressNotificationParams
}

type headerRT struct {
	h    http.Header
	base http.RoundTripper
}

func (r headerRT) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range r.h {
		req.Header[k] = v
	}
	return r.base.RoundTrip(req)
}

func (h *harness) client(origin string) *client {
	h.t.Helper()
	return h.clientVersion(origin, "")
}

// clientVersion connects a client that speaks one MCP protocol version.
func (h *harness) clientVersion(origin, version string) *client {
	h.t.Helper()
	c := &client{t: h.t, progress: make(chan *mcp.ProgressNotificationParams, 100)}
	mc := mcp.NewClient(&mcp.Implementation{Name: "test-agent", Version: "1"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			select {
			case c.progress <- r.Params:
			default:
			}
		},
	})
	hdr := http.Header{}
	if origin != "" {
		hdr.Set("X-Conversation-Origin", origin)
	}
	tr := &mcp.StreamableClientTransport{Endpoint: h.http.URL + "/mcp", HTTPClient: &http.Client{Transport: headerRT{hdr, http.DefaultTransport}}}
	var opts *mcp.ClientSessionOptions
	if version != "" {
		opts = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	s, err := mc.Connect(context.Background(), tr, opts)
	if err != nil {
		h.t.Fatal(err)
	}
	c.session = s
	h.t.Cleanup(func() { s.Close() })
	return c
}

// call runs a tool and returns its structured content and text; isError is
// reported, not fatal.
func (c *client) call(name string, args map[string]any) (map[string]any, string, bool) {
	c.t.Helper()
	return c.callProgress(name, args, nil)
}

func (c *client) callProgress(name string, args map[string]any, token any) (map[string]any, string, bool) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if token != nil {
		p.SetProgressToken(token)
	}
	res, err := c.session.CallTool(ctx, p)
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

// ok calls a tool that must succeed.
func (c *client) ok(name string, args map[string]any) map[string]any {
	c.t.Helper()
	sc, text, isErr := c.call(name, args)
	if isErr {
		c.t.Fatalf("%s(%v) failed: %s", name, args, text)
	}
	return sc
}

// fails calls a tool that must fail with a message containing every want.
func (c *client) fails(name string, args map[string]any, want ...string) string {
	c.t.Helper()
	_, text, isErr := c.call(name, args)
	if !isErr {
		c.t.Fatalf("%s(%v) succeeded, want an error containing %q", name, args, want)
	}
	for _, w := range want {
		if !strings.Contains(text, w) {
			c.t.Fatalf("%s(%v) error %q does not contain %q", name, args, text, w)
		}
	}
	return text
}

// receiver is a real webhook receiver on 127.0.0.1.
type receiver struct {
	srv *httptest.Server
	mu  sync.Mutex
	got []delivery
	ch  chan delivery
}

type delivery struct {
	header http.Header
	body   []byte
	event  map[string]any
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{ch: make(chan delivery, 1000)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		d := delivery{header: req.Header.Clone(), body: b}
		_ = json.Unmarshal(b, &d.event)
		r.mu.Lock()
		r.got = append(r.got, d)
		r.mu.Unlock()
		r.ch <- d
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) next(t *testing.T) delivery {
	t.Helper()
	select {
	case d := <-r.ch:
		return d
	case <-time.After(15 * time.Second):
		t.Fatal("no webhook delivery arrived")
	}
	return delivery{}
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

type appSettings = app.Settings
