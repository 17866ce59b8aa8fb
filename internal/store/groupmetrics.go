package store

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/t3code-mcp/t3code-mcp/internal/stages"
)

// GroupMetrics are the group committer's Prometheus metrics: how long a batch waits for its
// transaction (behind the one being written), how long a transaction takes (its writes and
// fsyncs) and how many batches share one.
type GroupMetrics struct {
	wait    prometheus.Histogram
	commit  prometheus.Histogram
	batches prometheus.Histogram
	// part is a bbolt transaction's time by part (CommitTiming): writes, sync, handover, release.
	part                         *prometheus.HistogramVec
	writes, sync, handover, free prometheus.Observer
}

// NewGroupMetrics creates the group committer's metrics and registers them on reg (nil: not
// registered).
func NewGroupMetrics(reg prometheus.Registerer) (*GroupMetrics, error) {
	m := &GroupMetrics{
		wait: stages.Histogram("t3code_mcp_store_commit_wait_seconds",
			"Time a batch (a chunk's events and detector state, or the outbox's delivery records) waited for the group transaction that writes it."),
		commit: stages.Histogram("t3code_mcp_store_commit_seconds",
			"Duration of one group transaction: its writes and fsyncs, until its batches are durable."),
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t3code_mcp_store_commit_batches",
			Help:    "Batches written by one group transaction (each machine's chunk is one; each part of the outbox's delivery records, up to 128 of them, one more).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}}),
		part: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t3code_mcp_store_commit_part_seconds",
			Help: "One group transaction of the bbolt store by part: writes (the writer took its batches → their puts done, CPU), " +
				"sync (bbolt's commit: pages spilled, written and fdatasynced twice), handover (the overlays applied and the events handed to the outbox), " +
				"release (every batch's caller released).",
			Buckets: stages.Buckets}, []string{"part"}),
	}
	m.writes, m.sync = m.part.WithLabelValues("writes"), m.part.WithLabelValues("sync")
	m.handover, m.free = m.part.WithLabelValues("handover"), m.part.WithLabelValues("release")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.wait, m.commit, m.batches, m.part} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// started notes a transaction of reqs starting at start.
func (m *GroupMetrics) started(reqs []*groupReq, start time.Time) {
	if m == nil {
		return
	}
	m.batches.Observe(float64(len(reqs)))
	for _, r := range reqs {
		m.wait.Observe(max(0, start.Sub(r.at).Seconds()))
	}
}

// committed notes a transaction that started at start ending now.
func (m *GroupMetrics) committed(start time.Time) {
	if m != nil {
		stages.ObserveSince(m.commit, start)
	}
}

// parts notes a bbolt transaction's parts.
func (m *GroupMetrics) parts(t CommitTiming) {
	if m == nil {
		return
	}
	m.writes.Observe(t.Writes.Seconds())
	m.sync.Observe(t.Commit.Seconds())
	m.handover.Observe(t.Durable.Seconds())
	m.free.Observe(t.Release.Seconds())
}
