package events

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/t3code-mcp/t3code-mcp/internal/stages"
	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// Metrics are the detector's Prometheus metrics.
type Metrics struct {
	durable prometheus.Histogram
	// prefetch counts what the outbox's Enrich found of the read started beside the commit
	// (Enricher.Prefetch): used, failed (read again), none (not started: too many in flight,
	// not running, an event committed before a restart); dropped counts results nobody took.
	prefetch *prometheus.CounterVec
}

// Prefetch outcomes (t3code_mcp_events_enrich_prefetch_total).
const (
	prefetchUsed    = "used"
	prefetchFailed  = "failed"
	prefetchNone    = "none"
	prefetchDropped = "dropped"
)

// NewMetrics creates the detector's metrics and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		durable: stages.Histogram("t3code_mcp_events_durable_lag_seconds",
			"Time from a transition in T3 (a run's completion time, a question's creation; T3's clock) to its event being durable in the outbox."),
		prefetch: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "t3code_mcp_events_enrich_prefetch_total",
			Help: "Event enrichments by what became of the thread read started beside the event's commit: used, failed (read again), none (no read started: at the limit, or the event was committed before a restart), dropped (a result nobody took within a minute)."},
			[]string{"outcome"}),
	}
	for _, o := range []string{prefetchUsed, prefetchFailed, prefetchNone, prefetchDropped} {
		m.prefetch.WithLabelValues(o)
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.durable, m.prefetch} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// prefetched counts n enrichments whose prefetch ended as outcome.
func (m *Metrics) prefetched(outcome string, n int) {
	if m == nil || n == 0 {
		return
	}
	m.prefetch.WithLabelValues(outcome).Add(float64(n))
}

// committed notes evs durable at now.
func (m *Metrics) committed(evs []store.Event, now time.Time) {
	if m == nil {
		return
	}
	for i := range evs {
		m.durable.Observe(max(0, now.Sub(evs[i].CreatedAt).Seconds()))
	}
}
