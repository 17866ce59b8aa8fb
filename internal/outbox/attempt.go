package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// The headers every request carries, shared by all of them (read only).
var (
	jsonType  = []string{"application/json"}
	userAgent = []string{"t3code-mcp-outbox"}
)

// result of one attempt.
type result struct {
	ok         bool
	network    bool          // no HTTP answer (dial, TLS, timeout, reset); else the receiver answered
	retryable  bool          // 408, 429, 5xx, or any network error
	retryAfter time.Duration // from Retry-After; < 0 when absent
	msg        string        // for LastError and logs, already redacted
	status     int
}

// attempt sends one event once: over the poster (post.go), or net/http's client when a proxy or
// Config.HTTPClient needs it.
func (o *Outbox) attempt(ctx context.Context, client *http.Client, e store.Event) result {
	if o.fast != nil {
		return o.attemptFast(ctx, e)
	}
	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(e.Body))
	if err != nil {
		return result{network: true, retryable: true, retryAfter: -1, msg: "network: cannot build the request"}
	}
	ts := o.cfg.Clock().Unix()
	// Set by their canonical keys (Header.Set canonicalised, and allocated, each one per
	// request); the constant values are shared: the client only reads them.
	h := req.Header
	h["Content-Type"] = jsonType
	h["User-Agent"] = userAgent
	h["Webhook-Id"] = []string{e.ID}
	h["Webhook-Timestamp"] = []string{strconv.FormatInt(ts, 10)}
	if o.signer != nil {
		h["Webhook-Signature"] = []string{o.signer.sign(e.ID, ts, e.Body)}
	}
	if o.auth != nil {
		h["Authorization"] = o.auth
	}

	resp, err := client.Do(req)
	if err != nil {
		return result{network: true, retryable: true, retryAfter: -1, msg: o.networkError(ctx, err)}
	}
	defer resp.Body.Close()
	r := result{status: resp.StatusCode, retryAfter: -1}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		// Read to the end (within drainBytes) so that the connection is reused; nothing of
		// it is kept.
		_, _ = io.CopyN(io.Discard, resp.Body, drainBytes)
		r.ok = true
		return r
	}
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, snippetBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))
	status := resp.Status
	if status == "" {
		status = strconv.Itoa(resp.StatusCode)
	}
	return o.failed(resp.StatusCode, status, resp.Header.Get("Retry-After"), snippet)
}

// failed classifies an answer that is not a 2xx: its code, its status line's code and reason
// ("503 Service Unavailable"), its Retry-After header and the start of its body.
func (o *Outbox) failed(code int, status, retryAfter string, snippet []byte) result {
	r := result{status: code, retryAfter: -1}
	r.retryable = code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500
	if r.retryable {
		if d, ok := parseRetryAfter(retryAfter, o.cfg.Clock()); ok {
			r.retryAfter = d
		}
	}
	r.msg = o.receiverMessage(code, status, snippet)
	return r
}

// receiverMessage describes a failure status: "receiver: HTTP 503 Service Unavailable: <body>".
func (o *Outbox) receiverMessage(code int, status string, body []byte) string {
	msg := "receiver: HTTP " + status
	if s := printable(string(body)); s != "" {
		msg += ": " + s
	}
	if code >= 300 && code < 400 {
		msg += " (redirects are not followed: set T3CODE_MCP_HOOK_URL to the final URL)"
	}
	// A receiver may echo request headers in its error page; the token and secret must not end
	// up in the store or the logs through it.
	return o.redact.Replace(msg)
}

// networkError describes a failure with no HTTP answer, without the URL (which may carry a
// credential in its query string).
func (o *Outbox) networkError(ctx context.Context, err error) string {
	// net.Error's and fasthttp.ErrTimeout's Timeout (the latter is no net.Error).
	var ne interface{ Timeout() bool }
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Sprintf("network: no response within %s", o.cfg.Timeout)
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return o.redact.Replace("network: " + err.Error())
}

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP date.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		// Clamp absurd values; MaxAge bounds the wait anyway.
		return time.Duration(min(secs, int64(365*24*time.Hour/time.Second))) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// printable keeps a response snippet to one readable line.
func printable(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) {
			return ' '
		}
		return r
	}, s)
	return strings.Join(strings.Fields(s), " ")
}
