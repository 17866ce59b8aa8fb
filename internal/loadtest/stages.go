package loadtest

import (
	"context"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// This file: the connector's stage histograms over a phase (where an event's and a wake-up's
// time goes: docs/troubleshooting.md "Where an event's time goes"), taken from its /metrics at
// the start and the end of the phase and summarized from the difference.

// Stage is one of the connector's duration histograms (a *_seconds series, with its labels)
// over a phase: how many observations it gained, their mean, and p50/p99 estimated from the
// buckets as Prometheus' histogram_quantile does (linear within a bucket; an estimate in the
// +Inf bucket is the highest finite bound).
type Stage struct {
	Name string        `json:"name"` // series name and labels, without le: t3code_mcp_wait_result_seconds{stage="read"}
	N    int64         `json:"n"`
	Mean time.Duration `json:"mean_ns"`
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
}

// histogram is one series' cumulative buckets (upper bound → count), sum and count.
type histogram struct {
	buckets map[float64]float64
	sum     float64
	count   float64
}

// parseHistograms reads the *_seconds histograms of a Prometheus text exposition (the
// connector's /metrics, parsed by prometheus/common's expfmt), by series: the name and its
// labels other than le, as in t3code_mcp_wait_result_seconds{stage="read"}. Other metric types
// (a summary such as go_gc_duration_seconds, gauges, counters) are left out.
func parseHistograms(r io.Reader) (map[string]*histogram, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]*histogram{}
	for name, fam := range families {
		if fam.GetType() != dto.MetricType_HISTOGRAM || !strings.HasSuffix(name, "_seconds") {
			continue
		}
		for _, m := range fam.GetMetric() {
			ph := m.GetHistogram()
			h := &histogram{buckets: map[float64]float64{}, sum: ph.GetSampleSum(), count: float64(ph.GetSampleCount())}
			for _, b := range ph.GetBucket() {
				h.buckets[b.GetUpperBound()] = float64(b.GetCumulativeCount())
			}
			h.buckets[math.Inf(1)] = h.count
			out[seriesKey(name, m.GetLabel())] = h
		}
	}
	return out, nil
}

// seriesKey names a series as the exposition writes it: name{k="v",…} (labels sorted by name).
func seriesKey(name string, labels []*dto.LabelPair) string {
	if len(labels) == 0 {
		return name
	}
	pairs := make([]string, len(labels))
	for i, l := range labels {
		pairs[i] = l.GetName() + "=" + strconv.Quote(l.GetValue())
	}
	return name + "{" + strings.Join(pairs, ",") + "}"
}

// stagesBetween summarizes what each series gained from before to after, those with
// observations only, by name.
func stagesBetween(before, after map[string]*histogram) []Stage {
	var out []Stage
	for key, a := range after {
		b := before[key]
		if b == nil {
			b = &histogram{buckets: map[float64]float64{}}
		}
		n := a.count - b.count
		if n <= 0 { // no observations in the phase
			continue
		}
		bounds := make([]float64, 0, len(a.buckets))
		for ub := range a.buckets {
			bounds = append(bounds, ub)
		}
		slices.Sort(bounds)
		cum := make([]float64, len(bounds))
		for i, ub := range bounds {
			cum[i] = a.buckets[ub] - b.buckets[ub]
		}
		q := func(p float64) time.Duration { return secs(bucketQuantile(p, bounds, cum)) }
		out = append(out, Stage{Name: key, N: int64(n), Mean: secs((a.sum - b.sum) / n), P50: q(0.50), P99: q(0.99)})
	}
	slices.SortFunc(out, func(x, y Stage) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// bucketQuantile is histogram_quantile over cumulative counts cum at upper bounds (sorted, the
// last +Inf).
func bucketQuantile(p float64, bounds, cum []float64) float64 {
	if len(bounds) == 0 || cum[len(cum)-1] <= 0 {
		return 0
	}
	rank := p * cum[len(cum)-1]
	for i, c := range cum {
		if c < rank {
			continue
		}
		if math.IsInf(bounds[i], 1) {
			if i == 0 {
				return 0
			}
			return bounds[i-1]
		}
		lo, below := 0.0, 0.0
		if i > 0 {
			lo, below = bounds[i-1], cum[i-1]
		}
		if c == below {
			return bounds[i]
		}
		return lo + (bounds[i]-lo)*(rank-below)/(c-below)
	}
	return bounds[len(bounds)-1]
}

func secs(s float64) time.Duration {
	if math.IsNaN(s) || math.IsInf(s, 0) {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}

// stagesMark reads the histograms at the start of a phase (nil, with a warning, if it cannot).
func (h *harness) stagesMark(ctx context.Context) map[string]*histogram {
	m, err := h.conn.histograms(ctx)
	if err != nil {
		h.warn("stage histograms: %v", err)
		return nil
	}
	return m
}

// stagesSince is what the histograms gained since stagesMark.
func (h *harness) stagesSince(ctx context.Context, before map[string]*histogram) []Stage {
	if before == nil {
		return nil
	}
	after, err := h.conn.histograms(ctx)
	if err != nil {
		h.warn("stage histograms: %v", err)
		return nil
	}
	return stagesBetween(before, after)
}

// histograms reads the connector's *_seconds histograms from /metrics.
func (c *connector) histograms(ctx context.Context) (map[string]*histogram, error) {
	body, err := c.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	defer body.Close()
	return parseHistograms(body)
}
