package outbox

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpproxy"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// poster sends the webhook requests over fasthttp's HostClient: the request is written and its
// answer read on the delivery worker's own goroutine, from pooled request and response buffers.
// net/http's client hands every request to the connection's write goroutine and takes the answer
// from its read goroutine (two goroutine hand-offs and wake-ups per event, the header map and URL
// cloned per request): 38 µs of client CPU per request against 16 here, measured with a local
// receiver ("Webhook POST on fasthttp" in docs/benchmarks.md).
//
// It is used when nothing needs net/http: no Config.HTTPClient, and no proxy from the
// environment for the hook URL (HTTP_PROXY, HTTPS_PROXY, NO_PROXY, which only net/http honours
// here); it speaks HTTP/1.1 (net/http could negotiate HTTP/2 over TLS). What the receiver sees is
// the same request: method, headers, body, Basic auth from the URL's user info when no token is
// set.
type poster struct {
	hc  *fasthttp.HostClient
	uri string // the hook URL without its user info (sent as Authorization instead)
	// conns are the connections dialled for the current Run: closed when it stops, so that a
	// request in flight ends at once (fasthttp takes no context) and the stop is not held up
	// by a slow receiver for up to Timeout.
	conns connSet
}

// proxyFor is the proxy the environment names for u (HTTP_PROXY, HTTPS_PROXY, NO_PROXY), read
// afresh: http.ProxyFromEnvironment reads the environment once per process.
func proxyFor(u *url.URL) (*url.URL, error) {
	return httpproxy.FromEnvironment().ProxyFunc()(u)
}

// idleConnFor is how long an idle kept-alive connection stays open. fasthttp notices that a
// receiver closed an idle connection only when it next uses it, so it is kept shorter than the
// common servers' idle timeouts (Node's 5 s, nginx's 75 s); a request that meets a connection
// closed meanwhile anyway is sent again on another one (retryClosed).
const idleConnFor = 4 * time.Second

// newPoster returns the poster for rawURL, or nil when net/http must carry the requests (a proxy
// applies to the URL).
func newPoster(rawURL string, cfg Config) (*poster, string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, "", err
	}
	if proxy, err := proxyFor(u); err != nil || proxy != nil {
		return nil, "", nil
	}
	var basic string
	if u.User != nil {
		pass, _ := u.User.Password()
		basic = "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User.Username()+":"+pass))
		u.User = nil
	}
	tls := u.Scheme == "https"
	addr := u.Host
	if u.Port() == "" {
		port := "80"
		if tls {
			port = "443"
		}
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	p := &poster{uri: u.String()}
	p.hc = &fasthttp.HostClient{
		Addr:  addr,
		IsTLS: tls,
		// One connection per request in flight at most (the loop never has more than
		// Concurrency deliveries running); a request waits for one only if that ever fails.
		MaxConns:            cfg.Concurrency,
		MaxConnWaitTimeout:  cfg.Timeout,
		MaxIdleConnDuration: idleConnFor,
		// The answer is read up to drainBytes: a longer one ends the request with
		// ErrBodyTooLarge once its status is known (answered like net/http's drained reply,
		// its connection closed).
		MaxResponseBodySize:      drainBytes,
		ReadBufferSize:           8 << 10,
		NoDefaultUserAgentHeader: true,
		DialTimeout:              p.conns.dial,
		RetryIfErr:               retryClosed,
	}
	return p, basic, nil
}

// retryClosed sends a request again on another connection when the one it went out on turned
// out closed by the receiver before any answer came (a kept-alive connection the receiver had
// timed out: net/http learns that in the background, fasthttp only when it writes). The
// receiver may have read the request before closing: that makes a duplicate with the same
// webhook-id, which delivery at least once allows.
func retryClosed(_ *fasthttp.Request, attempts int, err error) (resetTimeout, retry bool) {
	if attempts >= 3 {
		return false, false
	}
	return false, errors.Is(err, fasthttp.ErrConnectionClosed) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// start opens the poster for a Run: connections are dialled until stop, which closes them all.
func (p *poster) start() {
	p.conns.mu.Lock()
	p.conns.stopped = false
	p.conns.mu.Unlock()
}

// stop closes every connection of the poster (those in use too: their requests fail at once) and
// refuses new ones until the next start.
func (p *poster) stop() {
	p.conns.closeAll()
	p.hc.CloseIdleConnections()
}

// errStopped is what a request gets when the outbox stops while it dials.
var errStopped = errors.New("the outbox is stopping")

// connSet tracks the poster's open connections, so that stop can close them.
type connSet struct {
	mu      sync.Mutex
	open    map[*trackedConn]struct{}
	stopped bool
}

type trackedConn struct {
	net.Conn
	set  *connSet
	once sync.Once
}

// Write marks the request written (markWritten) when a trace runs.
func (c *trackedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	markEvent(markWritten, "")
	return n, err
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.set.mu.Lock()
		delete(c.set.open, c)
		c.set.mu.Unlock()
	})
	return c.Conn.Close()
}

// dial opens a TCP connection to addr (fasthttp adds TLS), tracked for stop.
func (s *connSet) dial(addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: c, set: s}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		_ = c.Close()
		return nil, errStopped
	}
	if s.open == nil {
		s.open = map[*trackedConn]struct{}{}
	}
	s.open[tc] = struct{}{}
	return tc, nil
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	s.stopped = true
	open := s.open
	s.open = nil
	s.mu.Unlock()
	for c := range open {
		_ = c.Conn.Close()
	}
}

// The constant header values, shared by every request.
var (
	jsonTypeBytes  = []byte("application/json")
	userAgentBytes = []byte("t3code-mcp-outbox")
	webhookID      = []byte("Webhook-Id")
	webhookTS      = []byte("Webhook-Timestamp")
	webhookSig     = []byte("Webhook-Signature")
	authorization  = []byte("Authorization")
)

// attemptFast is attempt over the poster.
func (o *Outbox) attemptFast(ctx context.Context, e store.Event) result {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(o.fast.uri)
	req.Header.SetMethod(http.MethodPost)
	req.Header.SetContentTypeBytes(jsonTypeBytes)
	req.Header.SetUserAgentBytes(userAgentBytes)
	req.Header.SetBytesKV(webhookID, []byte(e.ID))
	ts := o.cfg.Clock().Unix()
	var tsBuf [20]byte
	req.Header.SetBytesKV(webhookTS, strconv.AppendInt(tsBuf[:0], ts, 10))
	if o.signer != nil {
		req.Header.SetBytesKV(webhookSig, []byte(o.signer.sign(e.ID, ts, e.Body)))
	}
	if o.authValue != nil {
		req.Header.SetBytesKV(authorization, o.authValue)
	}
	req.SetBodyRaw(e.Body) // sent as it is: not copied

	err := o.fast.hc.DoTimeout(req, resp, o.cfg.Timeout)
	if err != nil && !errors.Is(err, fasthttp.ErrBodyTooLarge) {
		return result{network: true, retryable: true, retryAfter: -1, msg: o.networkError(ctx, err)}
	}
	// Answered (with ErrBodyTooLarge: the status line and headers were read, the body was longer
	// than drainBytes and its connection is closed).
	status := resp.StatusCode()
	if status >= 200 && status < 300 {
		return result{ok: true, status: status, retryAfter: -1}
	}
	var snippet []byte
	if err == nil {
		snippet = resp.Body()
		if len(snippet) > snippetBytes {
			snippet = snippet[:snippetBytes]
		}
	}
	text := string(resp.Header.StatusMessage())
	if text == "" {
		text = http.StatusText(status)
	}
	return o.failed(status, strconv.Itoa(status)+" "+text, string(resp.Header.Peek("Retry-After")), snippet)
}
