package loadtest

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

const metricsBefore = `# HELP t3code_mcp_wait_result_seconds A t3_wait result's stages.
# TYPE t3code_mcp_wait_result_seconds histogram
t3code_mcp_wait_result_seconds_bucket{stage="read",le="0.001"} 0
t3code_mcp_wait_result_seconds_bucket{stage="read",le="0.01"} 2
t3code_mcp_wait_result_seconds_bucket{stage="read",le="0.1"} 2
t3code_mcp_wait_result_seconds_bucket{stage="read",le="+Inf"} 2
t3code_mcp_wait_result_seconds_sum{stage="read"} 0.01
t3code_mcp_wait_result_seconds_count{stage="read"} 2
t3code_mcp_watch_chunk_items_bucket{le="1"} 5
t3code_mcp_active_waits 3
# TYPE go_gc_duration_seconds summary
go_gc_duration_seconds{quantile="0.5"} 0.001
go_gc_duration_seconds_sum 0.01
go_gc_duration_seconds_count 2
`

const metricsAfter = `# TYPE t3code_mcp_wait_result_seconds histogram
t3code_mcp_wait_result_seconds_bucket{stage="read",le="0.001"} 0
t3code_mcp_wait_result_seconds_bucket{stage="read",le="0.01"} 52
t3code_mcp_wait_result_seconds_bucket{stage="read",le="0.1"} 100
t3code_mcp_wait_result_seconds_bucket{stage="read",le="+Inf"} 102
t3code_mcp_wait_result_seconds_sum{stage="read"} 3.01
t3code_mcp_wait_result_seconds_count{stage="read"} 102
t3code_mcp_wait_result_seconds_bucket{stage="render",le="0.001"} 0
t3code_mcp_wait_result_seconds_count{stage="render"} 0
# TYPE t3code_mcp_store_commit_seconds histogram
t3code_mcp_store_commit_seconds_bucket{le="0.01"} 4
t3code_mcp_store_commit_seconds_bucket{le="+Inf"} 4
t3code_mcp_store_commit_seconds_sum 0.02
t3code_mcp_store_commit_seconds_count 4
go_gc_duration_seconds{quantile="0.5"} 0.001
go_gc_duration_seconds_sum 0.02
go_gc_duration_seconds_count 5
`

// The stage histograms of a phase are what each *_seconds series gained between two scrapes:
// count, mean from the sums, quantiles interpolated within buckets as histogram_quantile does
// (the highest finite bound for a rank in +Inf); series without new observations and
// histograms of other units and summaries (go_gc_duration_seconds) are left out.
func TestStagesBetweenScrapes(t *testing.T) {
	before, err := parseHistograms(strings.NewReader(metricsBefore))
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseHistograms(strings.NewReader(metricsAfter))
	if err != nil {
		t.Fatal(err)
	}
	got := stagesBetween(before, after)
	want := []Stage{
		{Name: "t3code_mcp_store_commit_seconds", N: 4, Mean: 5 * time.Millisecond, P50: 5 * time.Millisecond, P99: 9900 * time.Microsecond},
		// 100 new reads: 50 in (1 ms, 10 ms], 48 in (10 ms, 100 ms], 2 over 100 ms.
		{Name: `t3code_mcp_wait_result_seconds{stage="read"}`, N: 100, Mean: 30 * time.Millisecond, P50: 10 * time.Millisecond, P99: 100 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("stages %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		near := func(a, b time.Duration) bool { return a-b < time.Microsecond && b-a < time.Microsecond }
		if g.Name != w.Name || g.N != w.N || !near(g.Mean, w.Mean) || !near(g.P50, w.P50) || !near(g.P99, w.P99) {
			t.Errorf("stage %d: %+v, want %+v", i, g, w)
		}
	}
}

// FuzzParseHistograms: any /metrics text parses without a panic, and every series it reports
// has a name.
func FuzzParseHistograms(f *testing.F) {
	f.Add(metricsBefore)
	f.Add(metricsAfter)
	f.Add(`x_seconds_bucket{a="b\"}",le="1"} 3`)
	f.Fuzz(func(t *testing.T, text string) {
		hs, err := parseHistograms(strings.NewReader(text))
		if err != nil {
			return
		}
		for k := range hs {
			if k == "" {
				t.Fatalf("a series without a name in %q", text)
			}
		}
		_ = stagesBetween(nil, hs)
	})
}

// What the connector's own registry writes (promhttp's text exposition) parses into the series
// the report names: the histogram's labels but le, summaries and other units left out.
func TestParseHistogramsOfARealRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "t3code_mcp_wait_result_seconds", Buckets: []float64{0.01, 0.1}}, []string{"stage"})
	reg.MustRegister(h, prometheus.NewSummary(prometheus.SummaryOpts{Name: "other_seconds"}),
		prometheus.NewHistogram(prometheus.HistogramOpts{Name: "t3code_mcp_watch_chunk_items"}))
	h.WithLabelValues("read").Observe(0.005)
	h.WithLabelValues("read").Observe(0.05)
	h.WithLabelValues("read").Observe(5)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	hs, err := parseHistograms(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got := hs[`t3code_mcp_wait_result_seconds{stage="read"}`]
	if len(hs) != 1 || got == nil {
		t.Fatalf("series %v, want only the wait_result read histogram", hs)
	}
	if got.count != 3 || got.buckets[0.01] != 1 || got.buckets[0.1] != 2 || got.buckets[math.Inf(1)] != 3 {
		t.Errorf("histogram %+v", got)
	}
}

// The t3_thread sources come from the connector's counter as its registry exposes it, by label;
// a connector without the counter gives none (the report then leaves the field out), and the
// difference of two scrapes is what the calls between them added.
func TestThreadSourcesFromTheCounter(t *testing.T) {
	reg := prometheus.NewRegistry()
	results := prometheus.NewCounterVec(prometheus.CounterOpts{Name: threadResults}, []string{"source"})
	reg.MustRegister(results)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	c := &connector{base: srv.URL, http: client}
	ctx := context.Background()
	if by, found, err := c.counterBy(ctx, threadResults, "source"); err != nil || found || by != nil {
		t.Fatalf("no series yet: %v %v %v", by, found, err) // a CounterVec with no child is not exposed
	}
	results.WithLabelValues("read").Add(2)
	before, found, err := c.counterBy(ctx, threadResults, "source")
	if err != nil || !found || before["read"] != 2 {
		t.Fatalf("before: %v %v %v", before, found, err)
	}
	results.WithLabelValues("read").Inc()
	results.WithLabelValues("feed").Add(50)
	after, _, err := c.counterBy(ctx, threadResults, "source")
	if err != nil {
		t.Fatal(err)
	}
	if got := sourcesSince(before, after); len(got) != 2 || got["read"] != 1 || got["feed"] != 50 {
		t.Errorf("sources since: %v", got)
	}
	if got := sourcesSince(before, nil); got != nil {
		t.Errorf("without the counter: %v", got)
	}
	if by, found, err := c.counterBy(ctx, "t3code_mcp_no_such_total", "source"); err != nil || found || by != nil {
		t.Errorf("a counter the connector lacks: %v %v %v", by, found, err)
	}
}
