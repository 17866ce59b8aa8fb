package loadtest

import (
	"bufio"
	"context"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
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

// parseHistograms reads the *_seconds histograms of a Prometheus text exposition, by series
// (name and labels without le). Lines it does not understand are skipped; a summary's _sum and
// _count come without buckets, and stagesBetween leaves them out.
func parseHistograms(r io.Reader) (map[string]*histogram, error) {
	out := map[string]*histogram{}
	get := func(k string) *histogram {
		h := out[k]
		if h == nil {
			h = &histogram{buckets: map[float64]float64{}}
			out[k] = h
		}
		return h
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		series, val, ok := cutValue(line)
		if !ok {
			continue
		}
		name, labels := series, ""
		if i := strings.IndexByte(series, '{'); i >= 0 && strings.HasSuffix(series, "}") {
			name, labels = series[:i], series[i+1:len(series)-1]
		}
		switch {
		case strings.HasSuffix(name, "_seconds_bucket"):
			rest, le, found := splitLabel(labels, "le")
			if !found {
				continue
			}
			ub, err := strconv.ParseFloat(le, 64)
			if err != nil {
				continue
			}
			get(seriesKey(strings.TrimSuffix(name, "_bucket"), rest)).buckets[ub] = val
		case strings.HasSuffix(name, "_seconds_sum"):
			get(seriesKey(strings.TrimSuffix(name, "_sum"), labels)).sum = val
		case strings.HasSuffix(name, "_seconds_count"):
			get(seriesKey(strings.TrimSuffix(name, "_count"), labels)).count = val
		}
	}
	return out, sc.Err()
}

// cutValue splits "series value [timestamp]" after the series (whose labels may hold spaces).
func cutValue(line string) (series string, v float64, ok bool) {
	end := strings.LastIndexByte(line, '}')
	if end < 0 {
		end = strings.IndexByte(line, ' ') - 1
	}
	if end < 0 || end+1 >= len(line) {
		return "", 0, false
	}
	f := strings.Fields(line[end+1:])
	if len(f) == 0 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return line[:end+1], v, err == nil
}

func seriesKey(name, labels string) string {
	if labels == "" {
		return name
	}
	return name + "{" + labels + "}"
}

// splitLabel takes the label key out of a label list (k="v",k2="v2"), quoted values with
// escapes allowed, and returns the rest and key's value.
func splitLabel(labels, key string) (rest, value string, found bool) {
	var kept []string
	for len(labels) > 0 {
		eq := strings.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return "", "", false
		}
		k := strings.TrimSpace(labels[:eq])
		i := eq + 2
		for i < len(labels) && labels[i] != '"' {
			if labels[i] == '\\' {
				i++
			}
			i++
		}
		if i >= len(labels) {
			return "", "", false
		}
		pair, v := labels[:i+1], labels[eq+2:i]
		if k == key {
			value, found = v, true
		} else {
			kept = append(kept, strings.TrimSpace(pair))
		}
		labels = strings.TrimPrefix(labels[i+1:], ",")
	}
	return strings.Join(kept, ","), value, found
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
		if n <= 0 || len(a.buckets) == 0 { // no observations, or a summary (go_gc_duration_seconds)
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
