package outbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/t3code-mcp/t3code-mcp/internal/stages"
)

// Metrics are the outbox's Prometheus metrics. Receiver errors (the webhook endpoint answered with
// a failure status) and network errors (no answer: dial, TLS, timeout) are separate label values
// everywhere, because they call for different people: the receiver's owner or the network's.
type Metrics struct {
	pending prometheus.Gauge
	// inflightLimit is the delivery requests allowed in flight now (loop.adapt).
	inflightLimit prometheus.Gauge
	dead          prometheus.Gauge
	deliveries    *prometheus.CounterVec
	delivered     prometheus.Counter // deliveries{outcome="delivered"}, looked up once (the per-event path)
	retries       *prometheus.CounterVec
	deadLetters   *prometheus.CounterVec
	lag           prometheus.Histogram
	enrichments   *prometheus.CounterVec
	recordBatch   prometheus.Histogram
	// skipped counts queued events a replica found delivered (or given up) by another replica.
	skipped prometheus.Counter
	// firstAttempt and attempt: the last stages of an event's latency (internal/stages).
	firstAttempt prometheus.Histogram
	attempt      prometheus.Histogram
}

// Label values.
const (
	outcomeDelivered = "delivered"
	outcomeReceiver  = "receiver_error"
	outcomeNetwork   = "network_error"

	causeReceiver = "receiver"
	causeNetwork  = "network"

	reasonRejected = "rejected" // a non-retryable answer (4xx other than 408/429, 3xx)
	reasonExpired  = "expired"  // still failing after MaxAge

	enrichComplete = "complete" // the Enricher completed the body
	enrichRetry    = "retry"    // it failed; tried again later
	enrichPartial  = "partial"  // it kept failing for EnrichTimeout: the partial body is sent
)

// NewMetrics creates the outbox metrics and registers them on reg (nil: not registered, e.g. in
// tests that do not look at them).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "t3code_mcp_outbox_pending",
			Help: "Events waiting for delivery (outbox depth).",
		}),
		inflightLimit: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "t3code_mcp_outbox_inflight_limit",
			Help: "Delivery requests allowed in flight now: grows while events wait for a request slot and the receiver accepts, up to T3CODE_MCP_HOOK_CONCURRENCY; halved when the receiver fails (no answer, 408, 429, 5xx).",
		}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "t3code_mcp_outbox_dead",
			Help: "Dead letters waiting for an operator (retry-dead).",
		}),
		deliveries: labelled("t3code_mcp_outbox_deliveries_total",
			"Delivery attempts by outcome: delivered, receiver_error (the endpoint answered with a failure status), network_error (no answer).",
			"outcome", outcomeDelivered, outcomeReceiver, outcomeNetwork),
		retries: labelled("t3code_mcp_outbox_retries_total",
			"Failed attempts scheduled for a retry, by cause (receiver or network).",
			"cause", causeReceiver, causeNetwork),
		deadLetters: labelled("t3code_mcp_outbox_dead_letters_total",
			"Events given up on, by reason: rejected (non-retryable status) or expired (older than the maximum age).",
			"reason", reasonRejected, reasonExpired),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "t3code_mcp_outbox_event_lag_seconds",
			Help:    "Time from an event happening to its delivery.",
			Buckets: []float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 6 * 3600, 24 * 3600},
		}),
		enrichments: labelled("t3code_mcp_outbox_enrichments_total",
			"Completions of event bodies before their first attempt, by outcome: complete, retry (T3 could not be read), partial (gave up after the enrichment timeout).",
			"outcome", enrichComplete, enrichRetry, enrichPartial),
		recordBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "t3code_mcp_outbox_record_batch_events",
			Help:    "Delivery outcomes recorded per store transaction (group commit: one fsync per batch).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "t3code_mcp_outbox_skipped_total",
			Help: "Queued events this replica skipped because another replica delivered them or gave up on them (PostgreSQL replicas; 0 with bbolt).",
		}),
		firstAttempt: stages.Histogram("t3code_mcp_outbox_first_attempt_lag_seconds",
			"Time from a transition in T3 (its time, T3's clock) to its event's first delivery attempt starting (enrichment, when the event needed it, included)."),
		attempt: stages.Histogram("t3code_mcp_outbox_attempt_seconds",
			"Duration of one delivery attempt: the POST to the webhook receiver until its answer (or failure)."),
	}
	m.delivered = m.deliveries.WithLabelValues(outcomeDelivered)
	if reg != nil {
		for _, c := range []prometheus.Collector{m.pending, m.inflightLimit, m.dead, m.deliveries, m.retries, m.deadLetters, m.lag, m.enrichments, m.recordBatch, m.skipped, m.firstAttempt, m.attempt} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// labelled returns a counter with one label whose series for every value in values exist from
// the start, so dashboards and alerts see zeros, not gaps.
func labelled(name, help, label string, values ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})
	for _, v := range values {
		c.WithLabelValues(v)
	}
	return c
}
