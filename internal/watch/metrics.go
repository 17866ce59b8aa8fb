package watch

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/t3code-mcp/t3code-mcp/internal/stages"
)

// Metrics are the watchers' Prometheus metrics, shared by every machine's watcher: how long a
// chunk of T3's shell stream takes from its frame being read off the socket to being applied
// and to its part being durable (the Ack to T3 follows that). Together with the group commit's
// and the outbox's histograms they split an event's latency into stages (docs/troubleshooting.md).
type Metrics struct {
	wait      prometheus.Histogram
	appliedAt prometheus.Histogram
	durableAt prometheus.Histogram
	items     prometheus.Histogram
}

// NewMetrics creates the watcher metrics and registers them on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	h := stages.Histogram
	m := &Metrics{
		wait: h("t3code_mcp_watch_chunk_wait_seconds",
			"Time a shell-stream chunk waited from its frame being read off the socket to its handling starting (behind the machine's previous chunk)."),
		appliedAt: h("t3code_mcp_watch_chunk_applied_seconds",
			"Time from a shell-stream chunk's frame being read off the socket to the chunk applied to the machine's state (t3_wait callers woken)."),
		durableAt: h("t3code_mcp_watch_chunk_durable_seconds",
			"Time from a shell-stream chunk's frame being read off the socket to the events and detector state it produced being durable; the chunk's Ack to T3 follows."),
		items: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t3code_mcp_watch_chunk_items",
			Help:    "Items per shell-stream chunk (a machine that falls behind gets larger chunks).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096}}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.wait, m.appliedAt, m.durableAt, m.items} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// started notes a chunk of n items whose handling starts; applied, that it is applied to the
// machine's state; durable, that what it produced is durable. Each is measured from read, the
// chunk's frame read off the socket; nothing without metrics (a nil *Metrics) or a read time.
func (m *Metrics) started(read time.Time, n int) {
	if m != nil {
		m.items.Observe(float64(n))
		stages.ObserveSince(m.wait, read)
	}
}

func (m *Metrics) applied(read time.Time) {
	if m != nil {
		stages.ObserveSince(m.appliedAt, read)
	}
}

func (m *Metrics) durable(read time.Time) {
	if m != nil {
		stages.ObserveSince(m.durableAt, read)
	}
}
