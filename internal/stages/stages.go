// Package stages holds what the stage histograms of the event path share (the watchers' chunk
// times, the group commit's, the detector's and the outbox's): their buckets, so that the stages
// of one event's latency can be read side by side (docs/troubleshooting.md, "Where an event's
// time goes").
package stages

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Buckets are the stage histograms' buckets, in seconds: fine from half a millisecond, where the
// event-latency target (50 ms end to end) puts each stage, up to 30 s, where a machine that falls
// behind ends up.
var Buckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Histogram is a stage histogram named name.
func Histogram(name, help string) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: Buckets})
}

// ObserveSince observes the seconds from t to now on h; nothing for a zero t (no time known).
func ObserveSince(h prometheus.Histogram, t time.Time) {
	if !t.IsZero() {
		h.Observe(max(0, time.Since(t).Seconds()))
	}
}
