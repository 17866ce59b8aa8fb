// Package outbox delivers the events in the store to one webhook endpoint, durably: an event
// stays in the store until the endpoint accepted it (2xx), rejected it (dead letter), or it
// failed for longer than MaxAge (dead letter). Delivery is at least once: a crash between the
// endpoint's 2xx and our record of it re-sends the event with the same webhook-id, which
// receivers use to drop duplicates.
//
// Requests follow Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature v1 with
// HMAC-SHA256) and optionally carry a bearer token.
//
// Order: events of one stream (one thread) are delivered strictly one after another, in insertion
// order; a stream's next event waits until the previous one is delivered or dead. Different
// streams are delivered concurrently by a bounded number of workers, so one slow or failing
// thread's events never hold back another thread's.
package outbox

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Defaults for Config's zero values.
const (
	DefaultMaxAge    = 24 * time.Hour
	DefaultTimeout   = 10 * time.Second
	DefaultWorkers   = 4
	DefaultRetention = 24 * time.Hour
	// DefaultEnrichTimeout is how long, from an event's EnqueuedAt, the outbox keeps retrying
	// Enricher.Enrich before it delivers Enricher.Partial instead.
	DefaultEnrichTimeout = 2 * time.Minute
)

// Enricher completes an event's body before delivery. Events committed in the watcher's Ack path
// carry only the facts known without reading T3 (store.Event.Enrich); the outbox asks the
// Enricher for the rest before the event's first attempt, off the Ack path. The completed body is
// persisted before or together with the first attempt's record, so every retry sends the same
// bytes.
type Enricher interface {
	// Enrich returns the complete body for e (e.Body holds the committed facts). An error means
	// "T3 could not be read; try again later": the outbox retries with backoff (these are not
	// delivery attempts) while the event's stream waits and other streams go on.
	Enrich(ctx context.Context, e store.Event) ([]byte, error)
	// Partial returns a body clearly marked partial (which fields are missing and why), used when
	// Enrich kept failing for EnrichTimeout.
	Partial(e store.Event, cause error) []byte
}

const (
	pruneEvery   = 10 * time.Minute // how often delivered events past Retention are deleted
	storePause   = time.Second      // wait after a store error before trying again
	snippetBytes = 256              // how much of a failing response body goes into LastError
	drainBytes   = 64 << 10         // read this much of a response so the connection is reused
)

// Backoff says how long to wait before retry number attempt (1 for the first retry).
type Backoff interface {
	Delay(attempt int) time.Duration
}

// ExponentialBackoff is exponential backoff with full jitter: a uniformly random delay between 0
// and min(Cap, Base·2^(attempt-1)). Full jitter spreads the retries of many failed events (after
// a receiver outage, every stream failed at about the same time) instead of having them arrive
// in synchronized waves.
type ExponentialBackoff struct {
	Base, Cap time.Duration
}

// Delay implements Backoff.
func (b ExponentialBackoff) Delay(attempt int) time.Duration {
	// Doubling in a loop rather than shifting: Base<<n silently overflows for large n.
	ceil := b.Base
	for i := 1; i < attempt && ceil < b.Cap; i++ {
		ceil *= 2
	}
	if ceil > b.Cap {
		ceil = b.Cap
	}
	if ceil <= 0 {
		return 0
	}
	return rand.N(ceil + 1)
}

// DefaultBackoff: base 1s, cap 5min.
var DefaultBackoff Backoff = ExponentialBackoff{Base: time.Second, Cap: 5 * time.Minute}

// Config configures an Outbox. Only URL is required.
type Config struct {
	URL    string // T3CODE_MCP_HOOK_URL
	Token  string // T3CODE_MCP_HOOK_TOKEN: sent as "Authorization: Bearer <Token>" when set
	Secret string // T3CODE_MCP_HOOK_SECRET: "whsec_<base64>"; requests are signed when set

	MaxAge    time.Duration // give up on an event failing this long after it was queued (default 24h)
	Timeout   time.Duration // per request (default 10s)
	Workers   int           // streams delivered concurrently (default 4)
	Retention time.Duration // keep delivered events this long, then prune them (default 24h)

	// Enricher completes events stored with Enrich set before their first attempt; nil: events
	// are delivered as stored.
	Enricher Enricher
	// EnrichTimeout bounds, from the event's EnqueuedAt, how long Enrich is retried before the
	// Partial body is delivered (default DefaultEnrichTimeout).
	EnrichTimeout time.Duration

	Backoff    Backoff          // default DefaultBackoff
	Clock      func() time.Time // default time.Now
	HTTPClient *http.Client     // default a client of its own; redirects are never followed
	Logger     *slog.Logger     // default slog.Default()
	Metrics    *Metrics         // default unregistered metrics
}

// Outbox delivers the store's pending events. Create it with New, run it with Run.
type Outbox struct {
	st      *store.Store
	cfg     Config
	url     string
	key     []byte // decoded signing secret; nil: unsigned
	client  *http.Client
	log     *slog.Logger
	m       *Metrics
	redact  *strings.Replacer
	wake    chan struct{}
	running sync.Mutex // Run is not reentrant: two loops would deliver a stream's head twice
}

// New checks cfg and returns an outbox over st. The errors name the environment variable to fix
// and never contain the token or the secret.
func New(st *store.Store, cfg Config) (*Outbox, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL is not echoed: it may carry a credential in its query.
		return nil, errors.New("outbox: T3CODE_MCP_HOOK_URL must be an http:// or https:// URL")
	}
	o := &Outbox{st: st, url: cfg.URL, wake: make(chan struct{}, 1)}
	if cfg.Secret != "" {
		if o.key, err = DecodeSecret(cfg.Secret); err != nil {
			return nil, err
		}
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.EnrichTimeout <= 0 {
		cfg.EnrichTimeout = DefaultEnrichTimeout
	}
	if cfg.Backoff == nil {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics, _ = NewMetrics(nil)
	}
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient // a copy: the caller's client keeps its own redirect policy
		o.client = &c
	} else {
		o.client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	// A redirect is answered like any other non-2xx status (dead letter: fix the URL). Following
	// it would turn 301/302/303 into a GET without the body, and send the event to a host the
	// operator never configured.
	o.client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	var olds []string
	for _, s := range []string{cfg.Token, cfg.Secret, strings.TrimPrefix(cfg.Secret, "whsec_")} {
		if s != "" {
			olds = append(olds, s, "[redacted]")
		}
	}
	o.redact = strings.NewReplacer(olds...)
	o.cfg, o.log, o.m = cfg, cfg.Logger, cfg.Metrics
	return o, nil
}

// DecodeSecret decodes a Standard Webhooks signing secret: "whsec_" followed by base64 of 24 to
// 64 random bytes (the prefix may be left out).
func DecodeSecret(secret string) ([]byte, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return nil, errors.New("outbox: T3CODE_MCP_HOOK_SECRET is not a Standard Webhooks secret: want whsec_ followed by base64")
	}
	if len(key) < 24 || len(key) > 64 {
		return nil, fmt.Errorf("outbox: T3CODE_MCP_HOOK_SECRET decodes to %d bytes; Standard Webhooks secrets are 24 to 64 random bytes", len(key))
	}
	return key, nil
}

// Sign returns the webhook-signature header value for one request: "v1," and the base64
// HMAC-SHA256, keyed with the decoded secret, of "<id>.<timestamp>.<body>".
func Sign(key []byte, id string, timestamp int64, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write([]byte(strconv.FormatInt(timestamp, 10)))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// Notify wakes the delivery loop: call it after committing events. It never blocks.
func (o *Outbox) Notify() {
	select {
	case o.wake <- struct{}{}:
	default: // a wake-up is already pending; one is enough
	}
}

// RetryDead moves dead letters back to the queue with a fresh MaxAge window and wakes the loop.
// With no ids it retries every dead letter. It returns how many were requeued.
func (o *Outbox) RetryDead(ids ...string) (int, error) {
	n, err := o.st.Requeue(o.cfg.Clock(), ids...)
	if err != nil {
		return 0, err
	}
	o.log.Info("outbox: dead letters requeued", "count", n)
	o.Notify()
	return n, nil
}

// Run delivers events until ctx is done, then cancels the requests in flight, waits for its
// workers and returns. An event whose request was cancelled by the shutdown is not counted as an
// attempt; it is sent again on the next Run.
func (o *Outbox) Run(ctx context.Context) {
	o.running.Lock()
	defer o.running.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
		o.client.CloseIdleConnections()
	}()

	// Buffered to the worker bound: a worker's final send never blocks, even after Run stopped
	// receiving, so wg.Wait cannot deadlock.
	done := make(chan retried, o.cfg.Workers)
	inflight := make(map[string]bool, o.cfg.Workers)
	// Retry times are stored as wall-clock times. When the wall clock steps back (NTP, a VM
	// restored), a retry scheduled before the step would lie that much further in the future and
	// stall its stream; for the retries this loop scheduled, the real time elapsed since then
	// (monotonic) decides instead.
	scheduled := map[string]retried{}
	var lastStarted string // round-robin over streams, so none starves when workers are scarce
	var lastPrune time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()

	for {
		now := o.cfg.Clock()

		if now.Sub(lastPrune) >= pruneEvery || now.Before(lastPrune) {
			// On an error too, the next try is pruneEvery later: pruning is housekeeping and
			// must not spin.
			lastPrune = now
			if n, err := o.st.Prune(now.Add(-o.cfg.Retention)); err != nil {
				o.log.Error("outbox: pruning delivered events", "err", err)
			} else if n > 0 {
				o.log.Debug("outbox: pruned delivered events", "count", n)
			}
		}
		// Sleep until woken (Notify, a worker done, shutdown) or the next due time: the next
		// prune at the latest, the earliest scheduled retry, or a pause after a store error.
		wait := max(0, lastPrune.Add(pruneEvery).Sub(now))

		heads, err := o.st.Heads(0)
		if err != nil {
			o.log.Error("outbox: reading the queue", "err", err)
			wait = storePause
		}
		for _, e := range rotate(heads, lastStarted) {
			if inflight[e.Stream] {
				continue
			}
			if e.NextAttempt.After(now) {
				left := e.NextAttempt.Sub(now)
				if r, ok := scheduled[e.Stream]; ok && r.next.Equal(e.NextAttempt) && now.Round(0).Before(r.at.Round(0)) {
					left = r.next.Sub(r.at) - time.Since(r.mono) // the clock went back since
				}
				if left > 0 {
					wait = minWait(wait, left)
					continue
				}
			}
			if len(inflight) >= o.cfg.Workers {
				continue // a worker's done wakes the loop
			}
			inflight[e.Stream] = true
			delete(scheduled, e.Stream)
			lastStarted = e.Stream
			wg.Add(1)
			go func(e store.Event) {
				defer wg.Done()
				r := o.deliver(ctx, e)
				r.stream = e.Stream
				done <- r
			}(e)
		}
		o.updateGauges()

		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case r := <-done:
			delete(inflight, r.stream)
			if !r.next.IsZero() {
				scheduled[r.stream] = r
			}
		case <-o.wake:
		case <-timer.C:
		}
	}
}

func minWait(cur, d time.Duration) time.Duration {
	return max(0, min(cur, d))
}

// rotate returns heads (sorted by stream) starting after the stream last started.
func rotate(heads []store.Event, last string) []store.Event {
	i := sort.Search(len(heads), func(i int) bool { return heads[i].Stream > last })
	return append(heads[i:len(heads):len(heads)], heads[:i]...)
}

func (o *Outbox) updateGauges() {
	p, d, _, err := o.st.Counts()
	if err != nil {
		return
	}
	o.m.pending.Set(float64(p))
	o.m.dead.Set(float64(d))
}

// result of one attempt.
type result struct {
	ok         bool
	network    bool          // no HTTP answer (dial, TLS, timeout, reset); else the receiver answered
	retryable  bool          // 408, 429, 5xx, or any network error
	retryAfter time.Duration // from Retry-After; < 0 when absent
	msg        string        // for LastError and logs, already redacted
	status     int
}

// retried is a retry deliver scheduled: for next, decided at wall time at (monotonic mono).
type retried struct {
	stream         string
	at, next, mono time.Time
}

func (o *Outbox) deliver(ctx context.Context, e store.Event) (sched retried) {
	r := o.attempt(ctx, e)
	if !r.ok && r.network && ctx.Err() != nil {
		return sched // shutting down: not the receiver's fault, not an attempt
	}
	now := o.cfg.Clock()
	attempt := e.Attempts + 1
	log := o.log.With("id", e.ID, "stream", e.Stream, "attempt", attempt)

	var err error
	switch {
	case r.ok:
		o.m.deliveries.WithLabelValues(outcomeDelivered).Inc()
		o.m.lag.Observe(max(0, now.Sub(e.CreatedAt).Seconds()))
		err = o.st.MarkDelivered(e.ID, now)
		log.Info("event delivered", "status", r.status, "lag_ms", max(0, now.Sub(e.CreatedAt).Milliseconds()))

	case !r.retryable:
		o.m.deliveries.WithLabelValues(outcomeLabel(r)).Inc()
		o.m.deadLetters.WithLabelValues(reasonRejected).Inc()
		err = o.st.MarkDead(e.ID, now, r.msg)
		log.Error("outbox: rejected by the receiver; dead letter", "error", r.msg)

	default:
		o.m.deliveries.WithLabelValues(outcomeLabel(r)).Inc()
		deadline := e.EnqueuedAt.Add(o.cfg.MaxAge)
		if !now.Before(deadline) {
			o.m.deadLetters.WithLabelValues(reasonExpired).Inc()
			reason := fmt.Sprintf("expired: not delivered within %s (%d attempts); last error: %s", o.cfg.MaxAge, attempt, r.msg)
			err = o.st.MarkDead(e.ID, now, reason)
			log.Error("outbox: giving up; dead letter", "error", reason)
			break
		}
		delay := r.retryAfter
		if delay < 0 {
			delay = o.cfg.Backoff.Delay(attempt)
		}
		next := now.Add(delay)
		// One last try at the deadline rather than none: a retry scheduled past it would only
		// find the event expired.
		if next.After(deadline) {
			next = deadline
		}
		cause := causeReceiver
		if r.network {
			cause = causeNetwork
		}
		o.m.retries.WithLabelValues(cause).Inc()
		err = o.st.MarkRetry(e.ID, next, r.msg)
		if err == nil {
			sched = retried{at: now, next: next, mono: time.Now()}
		}
		log.Warn("outbox: delivery failed; will retry", "error", r.msg, "retry_in", next.Sub(now).String())
	}
	if err != nil {
		// The event stays pending as it was and is attempted again: at least once, never lost.
		// Not at once, though: a store that cannot record the outcome (a full disk) would have
		// the loop send the same event to the receiver again and again without a pause.
		log.Error("outbox: recording the attempt", "err", err)
		t := time.NewTimer(storePause)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	return sched
}

func outcomeLabel(r result) string {
	if r.network {
		return outcomeNetwork
	}
	return outcomeReceiver
}

// attempt sends one event once.
func (o *Outbox) attempt(ctx context.Context, e store.Event) result {
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

	resp, err := o.client.Do(req)
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
