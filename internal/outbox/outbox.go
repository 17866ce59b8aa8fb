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
// order; a stream's next event starts only once the previous one's outcome (delivered or dead)
// is durable. Different streams are delivered in parallel, up to a limit of requests in flight
// that follows the backlog (from 32 up to Concurrency while events wait for a slot and the
// receiver accepts them; halved when it fails), so one slow or failing thread's events never hold
// back another thread's.
//
// Cost: the loop keeps every stream's queue of pending sequence numbers in memory (rebuilt from
// the store's stream index at start, extended by the events the group commit hands over, or by a
// cursor over the events committed since), so a turn touches only the streams it starts or
// finishes, never the whole backlog; a handed-over event is sent from memory, and only the others
// are read with their bodies (handover.go); an event of a thread with nothing pending is sent by
// the hand-over itself, by a waiting worker, without a turn of the loop (startHanded, handover.go);
// outcomes are recorded in batches, one fsync for many (recorder.go).
//
// Enrichment: events committed with only their facts (store.Event.Enrich) are completed from T3
// by the Enricher in a stage of their own (EnrichConcurrency slots, apart from the delivery
// slots): a head is completed before it is handed to a delivery worker, so a delivery worker
// never waits on T3; slots left over complete the events behind a thread's head (ahead of
// delivery, held in memory up to a budget), so that a backlog drains without reading T3 at its
// turn. A completed body is stored with (or before) the event's first attempt's record.
//
// Files: attempt.go (one request and its classification), post.go (the requests over fasthttp:
// no goroutine hand-off per request), sign.go (Standard Webhooks), loop.go
// (the scheduler), handover.go (events handed over by the group commit), worker.go (enrichment
// and one delivery), recorder.go (group commit), backoff.go (retry policy).
package outbox

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Defaults for Config's zero values.
const (
	DefaultMaxAge  = 24 * time.Hour
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency bounds the requests in flight; the outbox starts at startInFlight (32)
	// and goes up to it only while a backlog waits and the receiver keeps up (loop.adapt).
	DefaultConcurrency = 256
	// DefaultEnrichConcurrency is how many Enricher calls (reads of T3) may be in flight.
	DefaultEnrichConcurrency = 32
	DefaultRetention         = 24 * time.Hour
	DefaultPruneEvery        = 10 * time.Minute // how often delivered events past Retention are deleted
	// DefaultEnrichTimeout is how long, from an event's EnqueuedAt, the outbox keeps retrying
	// Enricher.Enrich before it delivers Enricher.Partial instead.
	DefaultEnrichTimeout = 2 * time.Minute
)

const (
	storePause   = time.Second // wait after a store error before trying again
	snippetBytes = 256         // how much of a failing response body goes into LastError
	drainBytes   = 64 << 10    // read this much of a response so the connection is reused
	scanLimit    = 4096        // newly committed events taken into the queues per loop turn
	maxBatch     = 2048        // outcomes recorded in one transaction at most
	// maxUnrecorded bounds the outcomes handed to the recorder and not yet back (their memory,
	// and the ops of the next transactions): past it no delivery starts until some come back.
	maxUnrecorded = 2 * maxBatch
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

// Queue is what the outbox needs from the store, kept small so that a second backend can
// provide it (store.Store is the bbolt one). Sequence numbers order events: they grow with every
// commit, and a stream's events are delivered in sequence order.
type Queue interface {
	// PendingIndex calls fn for every pending event's stream and sequence number, in sequence
	// order within each stream, and returns the highest sequence number assigned so far.
	PendingIndex(fn func(stream string, seq uint64)) (last uint64, err error)
	// PendingAfter returns up to limit pending events with a sequence number above after, in
	// sequence order, without bodies.
	PendingAfter(after uint64, limit int) ([]store.Event, error)
	// PendingEvent returns one pending event (store.ErrNotPending when it is not).
	PendingEvent(seq uint64, withBody bool) (store.Event, error)
	// Record applies delivery outcomes durably, all in one transaction; errs reports ops that
	// could not apply, err a failure of the whole batch.
	Record(ops []store.Op) (errs []error, err error)
	// Prune deletes delivered events delivered before the cutoff.
	Prune(deliveredBefore time.Time) (int, error)
	// Counts returns the number of events per state, cheaply (it backs /healthz and the gauges).
	Counts() (pending, dead, delivered int, err error)
}

// Config configures an Outbox. Only URL is required.
type Config struct {
	URL    string // T3CODE_MCP_HOOK_URL
	Token  string // T3CODE_MCP_HOOK_TOKEN: sent as "Authorization: Bearer <Token>" when set
	Secret string // T3CODE_MCP_HOOK_SECRET: "whsec_<base64>"; requests are signed when set

	MaxAge  time.Duration // give up on an event failing this long after it was queued (default 24h)
	Timeout time.Duration // per request, and per Enrich call (default 10s)
	// Concurrency bounds the streams delivered in parallel, the requests in flight
	// (T3CODE_MCP_HOOK_CONCURRENCY, default 256). Fewer are: up to 32 at first, more only
	// while events wait for a slot and the receiver accepts them, halved again when it fails.
	Concurrency int
	// EnrichConcurrency bounds the Enricher calls in flight (T3CODE_MCP_HOOK_ENRICH_CONCURRENCY,
	// default 32): heads being completed before delivery, and with the slots they leave, events
	// behind a head completed ahead of it.
	EnrichConcurrency int
	Retention         time.Duration // T3CODE_MCP_HOOK_RETENTION: keep delivered events this long, then prune them (default 24h)
	PruneEvery        time.Duration // T3CODE_MCP_PRUNE_INTERVAL: how often to prune (default DefaultPruneEvery)

	// Enricher completes events stored with Enrich set before their first attempt; nil: events
	// are delivered as stored.
	Enricher Enricher
	// EnrichTimeout bounds, from the event's EnqueuedAt, how long Enrich is retried before the
	// Partial body is delivered (default DefaultEnrichTimeout).
	EnrichTimeout time.Duration

	Backoff    Backoff          // retry delays, also of Enrich (default DefaultBackoff)
	Clock      func() time.Time // default time.Now
	HTTPClient *http.Client     // default a client of its own; redirects are never followed
	Logger     *slog.Logger     // default slog.Default()
	Metrics    *Metrics         // default unregistered metrics

	// Claimant names this outbox in delivery claims when the Queue is shared by replicas
	// (store.Claimer, PostgreSQL): the replica's id (internal/lease); default a random id.
	Claimant string
	// HandOver: every event is committed through a store.Group that hands it to Committed
	// (store.Group.OnDurable): the loop takes new events from the hand-over, and scans the store
	// for them only on a gap in the sequence numbers, after Notify, and once every handScanEvery
	// (handover.go). Ignored when replicas share the queue.
	HandOver bool

	// ClaimTTL is how long a delivery claim lasts unless renewed (T3CODE_MCP_CLAIM_TTL, default
	// DefaultClaimTTL): a replica that died holding a claim is taken over after it. It must
	// outlast one attempt (Timeout) and its record; see claim.go.
	ClaimTTL time.Duration
}

// Outbox delivers the store's pending events. Create it with New, run it with Run.
type Outbox struct {
	q      Queue
	cfg    Config
	url    string
	signer *signer  // the decoded signing secret's; nil: unsigned
	auth   []string // the Authorization header's value when a token is set (read only)
	// fast sends the requests (post.go) unless net/http must: a proxy from the environment
	// applies to the URL, or Config.HTTPClient is set (then nil); authValue is the
	// Authorization header it sends: the token's, or Basic from the URL's user info.
	fast      *poster
	authValue []byte
	client    *http.Client // net/http: the first baseRequests requests in flight
	burst     *http.Client // net/http: the others (the same client when Config.HTTPClient is set)
	log       *slog.Logger
	m         *Metrics
	redact    *strings.Replacer
	wake      chan struct{}
	running   sync.Mutex // Run is not reentrant: two loops would deliver a stream's head twice
	// hand takes the events the group commit made durable (Committed, handover.go), within
	// handBudget bytes of bodies and handMax events waiting, the store scanned every
	// handScanEvery (the constants; tests change them).
	hand                handover
	handBudget, handMax int
	handScanEvery       time.Duration
	// scanAsked: Notify asked the loop to look for new events in the store.
	scanAsked atomic.Bool
	// summaryEvery is how often the deliveries are summed up at Info (summaryEvery; tests set it
	// lower).
	summaryEvery time.Duration
	// idleLinger is how long the loop stays idle before it sheds its waiting workers and the
	// burst client's connections (idleLinger; tests change it).
	idleLinger time.Duration
	// onIdle, when set (tests), is called on the loop's goroutine at every turn that finds the
	// loop idle with workers or burst connections to shed, before it sheds them.
	onIdle func()
	// turns counts the loop's turns and slotWakes the loop's wake-ups by a finished request
	// (tests and benchmarks: the goroutine hand-offs per delivery).
	turns, slotWakes atomic.Int64
	// unrecordedMax is maxUnrecorded (tests change it).
	unrecordedMax int
	// handStarts counts the deliveries Committed started without the loop (startHanded),
	// workers the delivery workers alive and idleWorkers those of them waiting for a job (tests
	// and benchmarks).
	handStarts, workers, idleWorkers atomic.Int64
	// claimer is q when replicas share it: heads are claimed before they are worked on (claim.go).
	claimer store.Claimer
}

// New checks cfg and returns an outbox over st. The errors name the environment variable to fix
// and never contain the token or the secret.
func New(q Queue, cfg Config) (*Outbox, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		// The URL is not echoed: it may carry a credential in its query.
		return nil, errors.New("outbox: T3CODE_MCP_HOOK_URL must be an http:// or https:// URL")
	}
	o := &Outbox{q: q, url: cfg.URL, wake: make(chan struct{}, 1), summaryEvery: summaryEvery, handBudget: handBudget, handMax: handMax, handScanEvery: handScanEvery, idleLinger: idleLinger}
	o.hand.contiguous = true
	o.unrecordedMax = maxUnrecorded
	o.claimer, _ = q.(store.Claimer)
	if cfg.Claimant == "" {
		cfg.Claimant = "outbox-" + rand.Text()
	}
	if cfg.Secret != "" {
		key, err := DecodeSecret(cfg.Secret)
		if err != nil {
			return nil, err
		}
		o.signer = newSigner(key)
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultMaxAge
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.EnrichConcurrency <= 0 {
		cfg.EnrichConcurrency = DefaultEnrichConcurrency
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.PruneEvery <= 0 {
		cfg.PruneEvery = DefaultPruneEvery
	}
	if cfg.EnrichTimeout <= 0 {
		cfg.EnrichTimeout = DefaultEnrichTimeout
	}
	if cfg.ClaimTTL <= 0 {
		cfg.ClaimTTL = DefaultClaimTTL
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
	// A redirect is answered like any other non-2xx status (dead letter: fix the URL). Following
	// it would turn 301/302/303 into a GET without the body, and send the event to a host the
	// operator never configured.
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	if cfg.HTTPClient != nil {
		c := *cfg.HTTPClient // a copy: the caller's client keeps its own redirect policy
		c.CheckRedirect = noRedirect
		o.client, o.burst = &c, &c
	} else {
		// Two pools of kept-alive connections. Up to baseRequests requests in flight use the
		// base client, whose few idle connections stay open between events however sparse
		// they are (http.Transport's default of 2 per host). Requests beyond those, while a
		// backlog drains, use the burst client, which keeps one connection per request in
		// flight (2 would have most of them closed and dialled again after every request) and
		// drops them once the queue has been idle for idleLinger (loop.go), so a burst leaves no
		// pool of idle connections, while a steady stream of events keeps its connections.
		base := http.DefaultTransport.(*http.Transport).Clone()
		burst := http.DefaultTransport.(*http.Transport).Clone()
		base.Proxy = func(r *http.Request) (*url.URL, error) { return proxyFor(r.URL) } // the environment now, as newPoster read it
		burst.Proxy = base.Proxy
		burst.MaxIdleConnsPerHost = cfg.Concurrency
		burst.MaxIdleConns = max(burst.MaxIdleConns, cfg.Concurrency)
		o.client = &http.Client{Transport: base, CheckRedirect: noRedirect}
		o.burst = &http.Client{Transport: burst, CheckRedirect: noRedirect}
	}

	var olds []string
	for _, s := range []string{cfg.Token, cfg.Secret, strings.TrimPrefix(cfg.Secret, "whsec_")} {
		if s != "" {
			olds = append(olds, s, "[redacted]")
		}
	}
	o.redact = strings.NewReplacer(olds...)
	if cfg.Token != "" {
		o.auth = []string{"Bearer " + cfg.Token}
	}
	if cfg.HTTPClient == nil {
		p, basic, err := newPoster(cfg.URL, cfg)
		if err != nil {
			return nil, errors.New("outbox: T3CODE_MCP_HOOK_URL must be an http:// or https:// URL")
		}
		o.fast = p
		switch {
		case o.auth != nil:
			o.authValue = []byte(o.auth[0])
		case basic != "":
			o.authValue = []byte(basic)
		}
	}
	o.cfg, o.log, o.m = cfg, cfg.Logger, cfg.Metrics
	return o, nil
}

// Notify wakes the delivery loop to look for new events in the store: call it after committing
// events other than through a group commit that hands them over (Committed). It never blocks.
func (o *Outbox) Notify() {
	o.scanAsked.Store(true)
	select {
	case o.wake <- struct{}{}:
	default: // a wake-up is already pending; one is enough
	}
}
