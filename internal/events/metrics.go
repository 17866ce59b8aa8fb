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
}

// NewMetrics creates the detector's metrics and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		durable: stages.Histogram("t3code_mcp_events_durable_lag_seconds",
			"Time from a transition in T3 (a run's completion time, a question's creation; T3's clock) to its event being durable in the outbox."),
	}
	if reg != nil {
		if err := reg.Register(m.durable); err != nil {
			return nil, err
		}
	}
	return m, nil
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
