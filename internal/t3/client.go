// Package t3 talks to one T3 Code machine (`t3 serve`) through T3's own API,
// orchestration protocol 2: the descriptor handshake (refusing any other
// protocol), HTTP reads through gen/t3api with the bearer token and protocol
// header, the WebSocket ticket and dial, and commands with idempotent
// commandIds. Its errors name the machine and say what to do; they never
// contain the token.
package t3

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-faster/jx"
	"github.com/ogen-go/ogen/ogenerrors"

	"github.com/t3code-mcp/t3code-mcp/gen/t3api"
	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
	"github.com/t3code-mcp/t3code-mcp/internal/effectrpc"
	"github.com/t3code-mcp/t3code-mcp/internal/text"
)

// protocolVersion is the orchestration protocol this package speaks.
const protocolVersion = 2

// defaultTimeout bounds each HTTP exchange (and the WebSocket handshake).
const defaultTimeout = 15 * time.Second

// Options configure a Client. The zero value is usable.
type Options struct {
	// Timeout bounds each HTTP request and the WebSocket handshake. Default 15s.
	Timeout time.Duration
	// HTTPClient carries the HTTP requests and the upgrade. Default: a new
	// client with Go's default transport.
	HTTPClient *http.Client
	Logger     *slog.Logger
	// RPC tunes the sockets DialRPC opens (ping interval, read limit). Its
	// HTTPClient, Header, Logger and Label are set by the client.
	RPC effectrpc.Options
	// Compression is the machine's `compression` (config.Compression*):
	// "gzip" accepts gzipped answers, "none" asks for uncompressed ones, ""
	// or "auto" asks for uncompressed answers from a loopback host only.
	Compression string
}

// uncompressed reports whether a client with compression (Options) asks the
// machine at host for uncompressed answers.
func uncompressed(compression, host string) bool {
	switch compression {
	case "gzip":
		return false
	case "none":
		return true
	default: // "auto"
		return isLoopback(host)
	}
}

// Client is one T3 machine. It is safe for concurrent use.
type Client struct {
	name    string
	base    *url.URL
	token   string
	timeout time.Duration
	hc      *http.Client
	api     *t3api.Client
	log     *slog.Logger
	rpc     effectrpc.Options
	errs    *errs
	// noBoundedUntil is set (unix nanoseconds) when the machine answered that
	// /bounded does not exist: ThreadRecent reads the full thread until then.
	noBoundedUntil atomic.Int64
}

// Descriptor is what a machine says about itself (GET /.well-known/t3/environment).
type Descriptor struct {
	EnvironmentID string
	Label         string
	ServerVersion string
	// Protocol is the orchestration protocol; 1 when the server does not say.
	Protocol     int
	OS, Arch     string
	Capabilities t3api.EnvironmentDescriptorCapabilities
}

// Session is what T3 knows about the token (GET /api/auth/session).
type Session struct {
	Authenticated bool
	Scopes        []string
	ExpiresAt     string
	Method        string
}

// NewClient prepares a client for the machine called name at baseURL
// (http:// or https://, optionally with a path prefix). token is the bearer
// token; surrounding whitespace (a trailing newline from a file) is dropped.
func NewClient(name, baseURL, token string, opts Options) (*Client, error) {
	u, err := url.Parse(strings.TrimSpace(baseURL))
	if err != nil {
		return nil, fmt.Errorf("machine %q: url is not a valid URL", name)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("machine %q: url must look like http://host:port or https://host, not %q", name, safeURL(u))
	}
	if u.User != nil {
		// Never print the userinfo back: it may hold a password.
		return nil, fmt.Errorf("machine %q: url must not carry credentials; put the token in the variable named by token_env", name)
	}
	base := &url.URL{Scheme: u.Scheme, Host: u.Host, Path: strings.TrimRight(u.Path, "/")}

	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("machine", name)
	token = strings.TrimSpace(token)

	c := &Client{
		name: name, base: base, token: token, timeout: opts.Timeout,
		hc: hc, log: log, rpc: opts.RPC,
		errs: &errs{machine: name, where: base.String(), timeout: opts.Timeout, secrets: []string{token}},
	}
	api, err := t3api.NewClient(base.String(), bearer{c}, t3api.WithClient(recorder{hc: hc, identity: uncompressed(opts.Compression, base.Hostname())}))
	if err != nil {
		return nil, fmt.Errorf("machine %q: %w", name, err)
	}
	c.api = api
	return c, nil
}

// Name is the machine's name from the configuration.
func (c *Client) Name() string { return c.name }

// URL is the machine's base URL.
func (c *Client) URL() string { return c.base.String() }

func safeURL(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path}).String()
}

// bearer is the security source of the generated client.
type bearer struct{ c *Client }

func (b bearer) Bearer(context.Context, t3api.OperationName) (t3api.Bearer, error) {
	if b.c.token == "" {
		return t3api.Bearer{}, ogenerrors.ErrSkipClientSecurity
	}
	return t3api.Bearer{Token: b.c.token}, nil
}

// exchange records T3's answer to one request. The generated client folds a
// non-JSON error answer (a 503 text page, a 400 with an empty body) into a
// decode error without its status; the recorder keeps status and body so the
// error can still say what T3 answered.
type exchange struct {
	status int
	body   []byte
	// keep, when set, trims a 200 answer of the bounded read to what it keeps
	// before the generated client decodes it (trimBounded); runs is then the
	// thread's number of runs in all, trimmed whether that worked.
	keep    *Keep
	runs    int
	trimmed bool
	// snapshot is the trimmed bounded answer, decoded by the recorder from
	// its pooled buffer (takeTrimmed); the generated client then gets
	// errDecoded instead of the response, and the caller takes snapshot.
	snapshot *t3api.BoundedThreadSnapshot
}

// errDecoded is what the recorder returns to the generated client for an
// answer it decoded itself (exchange.snapshot): no error of the exchange.
var errDecoded = errors.New("t3: answer decoded by the recorder")

type exchangeKey struct{}

type recorder struct {
	hc *http.Client
	// identity asks T3 for uncompressed answers (Accept-Encoding:
	// identity). T3 gzips what it sends when asked, and Go's transport asks
	// by default: on a loopback link that only costs CPU on both sides. The
	// bounded read of a 5,000-item thread is 1.4 MB, which T3 would deflate
	// and the connector inflate on every t3_thread call, at 3-5 ms of the
	// connector's CPU alone (docs/benchmarks.md, "t3_thread per byte").
	// Over a network the compressed answer is kept: there it saves far more
	// time than it costs. The machine's `compression` key overrides either
	// (a loopback URL that is an SSH tunnel to a distant machine: "gzip").
	identity bool
}

// isLoopback reports whether host (a URL's host name, no port) is this
// machine: localhost or a loopback address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (r recorder) Do(req *http.Request) (*http.Response, error) {
	if r.identity && req.Header.Get("Accept-Encoding") == "" {
		req.Header.Set("Accept-Encoding", "identity")
	}
	resp, err := r.hc.Do(req)
	if err != nil || resp == nil {
		return resp, err
	}
	if x, ok := req.Context().Value(exchangeKey{}).(*exchange); ok {
		x.status = resp.StatusCode
		if resp.StatusCode == http.StatusOK && x.keep != nil {
			buf := trimmedBufs.Get().(*[]byte)
			b, runs, err := trimBoundedFrom(resp.Body, *x.keep, 0, (*buf)[:0])
			_ = resp.Body.Close()
			switch {
			case err == nil:
				x.runs, x.trimmed = runs, true
				*buf = b
				if x.snapshot = decodeTrimmed(b); x.snapshot != nil {
					putTrimmed(buf)
					return nil, errDecoded
				}
				resp.Body, resp.ContentLength = &trimmedBody{Reader: bytes.NewReader(b), buf: buf}, int64(len(b))
				return resp, nil
			}
			trimmedBufs.Put(buf)
			switch {
			case errors.Is(err, errShape):
				// Not a bounded snapshot as the trimmer knows it, and what was
				// read of it is gone: read it again, whole, for the generated
				// decoder to decode or to say what is wrong with it.
				x.keep = nil
				return r.Do(req)
			default:
				return nil, err
			}
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			x.body = b
			resp.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(b), resp.Body), resp.Body}
		}
	}
	return resp, nil
}

// trimmedBufs keeps the buffers trimmed bounded bodies are written to: the
// generated client copies the body (io.ReadAll) before it decodes it and
// closes it after, so the buffer is free again at Close.
var trimmedBufs = sync.Pool{New: func() any { b := make([]byte, 0, 32<<10); return &b }}

// maxKeptTrimmed is the largest trimmed-body buffer put back for reuse.
const maxKeptTrimmed = 1 << 20

// decodeTrimmed decodes a trimmed bounded body as the generated client does
// (the snapshot, nothing after it, its validation) straight from the pooled
// buffer it was trimmed into: the generated client first copied it
// (io.ReadAll, ≈ 25 kB for a 5,000-item thread's, in doubling steps). The
// decoded values do not point into b (jx copies strings and raw values). nil
// when it does not decode: the generated client then decodes it again and
// says what is wrong, as before.
func decodeTrimmed(b []byte) *t3api.BoundedThreadSnapshot {
	var snap t3api.BoundedThreadSnapshot
	d := jx.DecodeBytes(b)
	if snap.Decode(d) != nil || d.Skip() != io.EOF || snap.Validate() != nil {
		return nil
	}
	return &snap
}

func putTrimmed(buf *[]byte) {
	if cap(*buf) <= maxKeptTrimmed {
		*buf = (*buf)[:0]
		trimmedBufs.Put(buf)
	}
}

// trimmedBody is a trimmed bounded body; Close gives its buffer back.
type trimmedBody struct {
	*bytes.Reader
	buf *[]byte
}

func (t *trimmedBody) Close() error {
	if t.buf != nil {
		t.Reset(nil)
		putTrimmed(t.buf)
	}
	t.buf = nil
	return nil
}

// begin starts one HTTP exchange under the client's timeout.
func (c *Client) begin(ctx context.Context) (context.Context, *exchange, context.CancelFunc) {
	x := &exchange{}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	return context.WithValue(ctx, exchangeKey{}, x), x, cancel
}

// failed maps an error returned by the generated client.
func (c *Client) failed(parent context.Context, op string, err error, x *exchange, threadID string) error {
	if errors.Is(err, ogenerrors.ErrSecurityRequirementIsNotSatisfied) {
		return c.errs.finish(&Error{Op: op, Code: CodeNoToken, Err: err, Message: fmt.Sprintf(
			"no token%s; issue one on that machine with `%s` and put it in the variable named by token_env", forMachine(c.name), IssueCommand)})
	}
	if x.status == 0 {
		return c.errs.transport(parent, op, err)
	}
	if x.status != http.StatusOK {
		var body t3api.ErrorBody
		if json.Valid(x.body) && body.UnmarshalJSON(x.body) == nil {
			return c.errs.status(op, x.status, body, threadID, "")
		}
		return c.errs.status(op, x.status, t3api.ErrorBody{}, threadID, text.Snippet(string(x.body), 200))
	}
	return c.errs.finish(&Error{Op: op, Status: x.status, Code: CodeBadResponse, Err: err, Message: fmt.Sprintf(
		"machine %q sent a %s answer this t3code-mcp cannot read (%s); T3 Code and t3code-mcp may disagree on the protocol",
		c.name, op, text.Snippet(err.Error(), 300))})
}

// answer handles the typed result of a generated call: the success type, or
// the default *ErrorStatusCode.
func answer[T any](c *Client, op, threadID string, res any) (*T, error) {
	switch r := res.(type) {
	case *T:
		return r, nil
	case *t3api.ErrorStatusCode:
		return nil, c.errs.status(op, r.StatusCode, r.Response, threadID, "")
	}
	return nil, c.errs.finish(&Error{Op: op, Code: CodeBadResponse, Message: fmt.Sprintf("machine %q: %s: unexpected answer %T", c.name, op, res)})
}

// Handshake reads the machine's descriptor (no credential needed) and refuses
// any machine that does not speak orchestration protocol 2 with
// *IncompatibleError.
func (c *Client) Handshake(ctx context.Context) (*Descriptor, error) {
	const op = "handshake"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.GetEnvironment(rctx)
	if err != nil {
		return nil, c.failed(ctx, op, err, x, "")
	}
	d := &Descriptor{
		EnvironmentID: res.EnvironmentId,
		Label:         res.Label,
		ServerVersion: res.ServerVersion,
		Protocol:      protocolOf(res),
	}
	if p, ok := res.Platform.Get(); ok {
		d.OS, d.Arch = p.Os.Or(""), p.Arch.Or("")
	}
	if caps, ok := res.Capabilities.Get(); ok {
		d.Capabilities = caps
	}
	if d.Protocol != protocolVersion {
		return nil, &IncompatibleError{Machine: c.name, ServerVersion: d.ServerVersion, Protocol: d.Protocol}
	}
	c.log.Debug("t3: handshake", "server_version", d.ServerVersion, "environment", d.EnvironmentID)
	return d, nil
}

// protocolOf reads orchestrationProtocolVersion: top level first, then inside
// capabilities (one variant put it there); absent means protocol 1, exactly as
// T3's own client decides.
func protocolOf(d *t3api.EnvironmentDescriptor) int {
	if v, ok := d.OrchestrationProtocolVersion.Get(); ok {
		return v
	}
	if caps, ok := d.Capabilities.Get(); ok {
		if raw, ok := caps["orchestrationProtocolVersion"]; ok {
			if n, err := jx.DecodeBytes(raw).Int(); err == nil {
				return n
			}
		}
	}
	return 1
}

// Session asks T3 what it knows about the token. T3 never answers 401 here:
// an unknown token gives Authenticated false.
func (c *Client) Session(ctx context.Context) (*Session, error) {
	const op = "session"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.GetAuthSession(rctx)
	if err != nil {
		return nil, c.failed(ctx, op, err, x, "")
	}
	st, err := answer[t3api.AuthSessionState](c, op, "", res)
	if err != nil {
		return nil, err
	}
	return &Session{Authenticated: st.Authenticated, Scopes: st.Scopes, ExpiresAt: st.ExpiresAt.Or(""), Method: st.SessionMethod.Or("")}, nil
}

// Shell reads every project and thread row.
func (c *Client) Shell(ctx context.Context) (*t3api.ShellSnapshot, error) {
	const op = "shell"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.GetShell(rctx, t3api.GetShellParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2})
	if err != nil {
		return nil, c.failed(ctx, op, err, x, "")
	}
	return answer[t3api.ShellSnapshot](c, op, "", res)
}

// Thread reads the full projection of one thread.
func (c *Client) Thread(ctx context.Context, threadID string) (*t3api.ThreadSnapshot, error) {
	const op = "thread"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.GetThread(rctx, t3api.GetThreadParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2, ThreadId: threadID})
	if err != nil {
		return nil, c.failed(ctx, op, err, x, threadID)
	}
	return answer[t3api.ThreadSnapshot](c, op, threadID, res)
}

// threadBounded reads a thread with every control-plane array but only a
// recent window of timeline rows (older rows come from ThreadHistory), trimmed
// to keep when not nil (runs is then the thread's number of runs in all; -1
// when not trimmed). ThreadRecent and ThreadRecentKeep are its callers.
func (c *Client) threadBounded(ctx context.Context, threadID string, keep *Keep) (*t3api.BoundedThreadSnapshot, int, error) {
	const op = "thread (bounded)"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	x.keep = keep
	res, err := c.api.GetThreadBounded(rctx, t3api.GetThreadBoundedParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2, ThreadId: threadID})
	if x.snapshot != nil && errors.Is(err, errDecoded) { // the trimmed answer, decoded by the recorder
		return x.snapshot, x.runs, nil
	}
	if err != nil {
		return nil, 0, c.failed(ctx, op, err, x, threadID)
	}
	b, err := answer[t3api.BoundedThreadSnapshot](c, op, threadID, res)
	if err != nil {
		return nil, 0, err
	}
	if !x.trimmed {
		return b, -1, nil
	}
	return b, x.runs, nil
}

// Recent is a thread as ThreadRecent read it.
type Recent struct {
	Projection *t3api.ThreadProjection
	// Bounded is true when it came from /bounded: every run, request and
	// checkpoint, but only the newest timeline rows and the messages they or
	// the latest and active runs name; HasMoreHistory says whether older
	// rows were left out.
	Bounded        bool
	HasMoreHistory bool
	// RunCount is how many runs the thread has: more than Projection.Runs
	// holds when the read kept only some (ThreadRecentKeep).
	RunCount int
	// Sequence is the read's snapshotSequence: the projection holds every
	// event of the thread up to it (a subscription with afterSequence
	// Sequence goes on from the read, threadfeed).
	Sequence int64
}

// boundedRetry is how long ThreadRecent keeps reading whole threads after a
// machine answered that /bounded does not exist (an older build), before it
// tries /bounded again (the machine may have been updated).
const boundedRetry = 10 * time.Minute

// ThreadRecent reads a thread for showing its recent runs: /bounded, whose
// size does not grow with the thread's history, falling back to the whole
// thread only when the machine answers that the route does not exist (older
// builds answer 404 or 503 there, without T3's error body). A thread that
// does not exist is an error either way.
func (c *Client) ThreadRecent(ctx context.Context, threadID string) (Recent, error) {
	return c.threadRecent(ctx, threadID, nil)
}

// ThreadRecentKeep is ThreadRecent decoding only the part of the bounded read
// that keep names (Keep): its cost no longer grows with the runs, messages
// and checkpoints of the thread's history. The whole-thread fallback keeps
// everything.
func (c *Client) ThreadRecentKeep(ctx context.Context, threadID string, keep Keep) (Recent, error) {
	return c.threadRecent(ctx, threadID, &keep)
}

func (c *Client) threadRecent(ctx context.Context, threadID string, keep *Keep) (Recent, error) {
	if time.Now().UnixNano() >= c.noBoundedUntil.Load() {
		b, runs, err := c.threadBounded(ctx, threadID, keep)
		if err == nil {
			if runs < 0 {
				runs = len(b.Projection.Runs)
			}
			return Recent{Projection: &b.Projection, Bounded: true, HasMoreHistory: b.HasMoreHistory.Or(false), RunCount: runs, Sequence: b.SnapshotSequence}, nil
		}
		if !routeMissing(err) {
			return Recent{}, err
		}
		c.noBoundedUntil.Store(time.Now().Add(boundedRetry).UnixNano())
		c.log.Info("t3: machine has no bounded thread route; reading whole threads", "err", err)
	}
	s, err := c.Thread(ctx, threadID)
	if err != nil {
		return Recent{}, err
	}
	return Recent{Projection: &s.Projection, RunCount: len(s.Projection.Runs), Sequence: s.SnapshotSequence}, nil
}

// routeMissing reports whether err is a machine saying that the route does
// not exist: 404 or 503 without T3's error body (a missing thread is a 404
// with one, reason thread_not_found).
func routeMissing(err error) bool {
	var e *Error
	if !errors.As(err, &e) || e.Tag != "" || e.Reason != "" || e.Code != "" {
		return false
	}
	return e.Status == http.StatusNotFound || e.Status == http.StatusServiceUnavailable
}

// ThreadHistory reads the timeline rows before cursor (a bounded read's
// historyCursor or a previous page's). No tool pages older rows yet; it stays
// as the client of T3's /history route, the only test of that recorded route
// and of its invalid_history_cursor error through the client
// (TestReads, TestHTTPErrors in client_test.go).
func (c *Client) ThreadHistory(ctx context.Context, threadID, cursor string) (*t3api.ThreadHistoryPage, error) {
	const op = "thread history"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.GetThreadHistory(rctx, t3api.GetThreadHistoryParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2, ThreadId: threadID, Cursor: cursor})
	if err != nil {
		return nil, c.failed(ctx, op, err, x, threadID)
	}
	return answer[t3api.ThreadHistoryPage](c, op, threadID, res)
}

// Projects lists the machine's projects.
func (c *Client) Projects(ctx context.Context) ([]t3api.Project, error) {
	const op = "projects"
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.ListProjects(rctx, t3api.ListProjectsParams{XT3OrchestrationProtocol: t3api.ProtocolHeader2})
	if err != nil {
		return nil, c.failed(ctx, op, err, x, "")
	}
	pl, err := answer[t3api.ProjectList](c, op, "", res)
	if err != nil {
		return nil, err
	}
	return pl.Projects, nil
}

// DialRPC opens a WebSocket to the machine: it mints a fresh single-use
// ticket (POST /api/auth/websocket-ticket) for every connection, so the token
// itself never travels in a URL, then dials /ws?wsTicket=…&orchestrationProtocol=2.
// The caller owns the returned connection.
func (c *Client) DialRPC(ctx context.Context) (*effectrpc.Conn, error) {
	rctx, x, cancel := c.begin(ctx)
	defer cancel()
	res, err := c.api.IssueWebSocketTicket(rctx)
	if err != nil {
		return nil, c.failed(ctx, "websocket ticket", err, x, "")
	}
	tk, err := answer[t3api.WebSocketTicket](c, "websocket ticket", "", res)
	if err != nil {
		return nil, err
	}
	if tk.Ticket == "" {
		return nil, c.errs.finish(&Error{Op: "websocket ticket", Code: CodeBadResponse, Message: fmt.Sprintf("machine %q issued an empty WebSocket ticket", c.name)})
	}

	ws := *c.base
	ws.Scheme = map[string]string{"http": "ws", "https": "wss"}[c.base.Scheme]
	ws.Path = c.base.Path + "/ws"
	ws.RawQuery = url.Values{"wsTicket": {tk.Ticket}, "orchestrationProtocol": {strconv.Itoa(protocolVersion)}}.Encode()

	opts := c.rpc
	opts.HTTPClient, opts.Header, opts.Logger, opts.Label = c.hc, nil, c.log, c.name
	conn, err := effectrpc.Dial(rctx, ws.String(), opts)
	if err != nil {
		return nil, c.dialFailed(ctx, err, tk.Ticket)
	}
	c.log.Debug("t3: socket open")
	return conn, nil
}

func (c *Client) dialFailed(parent context.Context, err error, ticket string) error {
	const op = "websocket"
	var ue *effectrpc.UpgradeError
	if !errors.As(err, &ue) {
		e := c.errs.transport(parent, op, err)
		e.Message = strings.ReplaceAll(e.Message, ticket, "REDACTED")
		return e
	}
	var body t3api.ErrorBody
	if !json.Valid(ue.Body) || body.UnmarshalJSON(ue.Body) != nil {
		body = t3api.ErrorBody{}
	}
	if ue.Status == http.StatusUpgradeRequired {
		// T3 checks the protocol before the credential: 426 means it wants a
		// protocol other than the 2 this client asked for.
		want := "a different one"
		if v, ok := upgradeProtocol(ue.Body); ok {
			want = "protocol " + strconv.Itoa(v)
		}
		return c.errs.finish(&Error{Op: op, Status: ue.Status, Code: body.Code.Or(""), Err: err, Message: fmt.Sprintf(
			"machine %q refused orchestration protocol %d on /ws and asks for %s (T3: %s); update t3code-mcp or run a T3 Code that speaks protocol %d",
			c.name, protocolVersion, want, orUnknown(body.Message.Or("")), protocolVersion)})
	}
	e := c.errs.status(op, ue.Status, body, "", text.Snippet(string(ue.Body), 200))
	e.Err = err
	return e
}

// upgradeProtocol reads orchestrationProtocolVersion from a 426 body.
func upgradeProtocol(body []byte) (int, bool) {
	v, found := 0, false
	d := jx.DecodeBytes(body)
	if d.Next() != jx.Object {
		return 0, false
	}
	_ = d.ObjBytes(func(d *jx.Decoder, k []byte) error {
		if string(k) == "orchestrationProtocolVersion" && d.Next() == jx.Number {
			n, err := d.Int()
			v, found = n, err == nil
			return err
		}
		return d.Skip()
	})
	return v, found
}

// GetConfig calls server.getConfig on conn: providers, models and their
// option descriptors (there is no HTTP equivalent).
func (c *Client) GetConfig(ctx context.Context, conn *effectrpc.Conn) (*t3rpc.ServerConfig, error) {
	var cfg t3rpc.ServerConfig
	if err := conn.Call(ctx, "server.getConfig", json.RawMessage(`{}`), &cfg); err != nil {
		return nil, rpcError(c.name, "server.getConfig", err, c.errs.scrub)
	}
	return &cfg, nil
}
