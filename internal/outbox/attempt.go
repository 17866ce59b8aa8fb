package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
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

// attempt sends one event once.
func (o *Outbox) attempt(ctx context.Context, client *http.Client, e store.Event) result {
	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.url, bytes.NewReader(e.Body))
	if err != nil {
		return result{network: true, retryable: true, retryAfter: -1, msg: "network: cannot build the request"}
	}
	ts := o.cfg.Clock().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "t3code-mcp-outbox")
	req.Header.Set("webhook-id", e.ID)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(ts, 10))
	if o.key != nil {
		req.Header.Set("webhook-signature", Sign(o.key, e.ID, ts, e.Body))
	}
	if o.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+o.cfg.Token)
	}

	resp, err := client.Do(req)
	if err != nil {
		return result{network: true, retryable: true, retryAfter: -1, msg: o.networkError(ctx, err)}
	}
	defer resp.Body.Close()
	snippet, _ := io.ReadAll(io.LimitReader(resp.Body, snippetBytes))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainBytes))

	r := result{status: resp.StatusCode, retryAfter: -1}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		r.ok = true
		return r
	}
	r.retryable = resp.StatusCode == http.StatusRequestTimeout || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	if r.retryable {
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), o.cfg.Clock()); ok {
			r.retryAfter = d
		}
	}
	r.msg = o.receiverError(resp, snippet)
	return r
}

// receiverError describes a failure status: "receiver: HTTP 503 Service Unavailable: <body>".
func (o *Outbox) receiverError(resp *http.Response, body []byte) string {
	msg := "receiver: HTTP " + resp.Status
	if resp.Status == "" {
		msg = fmt.Sprintf("receiver: HTTP %d", resp.StatusCode)
	}
	if s := printable(string(body)); s != "" {
		msg += ": " + s
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		msg += " (redirects are not followed: set T3CODE_MCP_HOOK_URL to the final URL)"
	}
	// A receiver may echo request headers in its error page; the token and secret must not end
	// up in the store or the logs through it.
	return o.redact.Replace(msg)
}

// networkError describes a failure with no HTTP answer, without the URL (which may carry a
// credential in its query string).
func (o *Outbox) networkError(ctx context.Context, err error) string {
	var ne net.Error
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
