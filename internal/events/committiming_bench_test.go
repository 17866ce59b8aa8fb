package events_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// commitTimeline collects a benchmark's group transactions, timed (store.Group.ObserveCommits),
// and reports where their time went: each part's p50 and p99, the parts of the slowest 1 %, and
// the dirty nodes per bucket.
type commitTimeline struct {
	mu  sync.Mutex
	all []store.CommitTiming
}

func (c *commitTimeline) observe(t store.CommitTiming) {
	c.mu.Lock()
	c.all = append(c.all, t)
	c.mu.Unlock()
}

func (c *commitTimeline) reset() {
	c.mu.Lock()
	c.all = nil
	c.mu.Unlock()
}

// report adds the timeline's metrics to b (per transaction) and logs the breakdown.
func (c *commitTimeline) report(b *testing.B, runs int) {
	c.mu.Lock()
	all := slices.Clone(c.all)
	c.mu.Unlock()
	if len(all) == 0 {
		return
	}
	total := func(t store.CommitTiming) time.Duration { return t.Writes + t.Commit + t.Durable + t.Release }
	parts := []struct {
		name string
		of   func(store.CommitTiming) time.Duration
	}{
		{"waited", func(t store.CommitTiming) time.Duration { return t.Waited }},
		{"writes", func(t store.CommitTiming) time.Duration { return t.Writes }},
		{"spill", func(t store.CommitTiming) time.Duration { return t.Spill }},
		{"write+sync", func(t store.CommitTiming) time.Duration { return t.Write }},
		{"commit-rest", func(t store.CommitTiming) time.Duration { return t.Commit - t.Spill - t.Write }},
		{"durable", func(t store.CommitTiming) time.Duration { return t.Durable }},
		{"release", func(t store.CommitTiming) time.Duration { return t.Release }},
		{"total", total},
	}
	q := func(ds []time.Duration, p float64) float64 {
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))]) / 1e6
	}
	byTotal := slices.Clone(all)
	sort.Slice(byTotal, func(i, j int) bool { return total(byTotal[i]) < total(byTotal[j]) })
	slowest := byTotal[len(byTotal)*99/100:]
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d transactions, %.2f runs each\n%-12s %8s %8s %8s %12s\n", len(all), float64(runs)/float64(len(all)), "part", "mean-ms", "p50-ms", "p99-ms", "slowest1%-ms")
	for _, p := range parts {
		ds := make([]time.Duration, len(all))
		var sum time.Duration
		for i, t := range all {
			ds[i] = p.of(t)
			sum += ds[i]
		}
		var slow time.Duration
		for _, t := range slowest {
			slow += p.of(t)
		}
		fmt.Fprintf(&sb, "%-12s %8.3f %8.3f %8.3f %12.3f\n", p.name, float64(sum)/float64(len(all))/1e6, q(ds, 0.5), q(ds, 0.99), float64(slow)/float64(len(slowest))/1e6)
		if p.name == "total" || p.name == "writes" || p.name == "write+sync" || p.name == "release" {
			b.ReportMetric(q(ds, 0.99), "tx-"+p.name+"-p99-ms")
		}
	}
	pages, nodes := 0, map[string]int{}
	slowPages := 0
	for _, t := range all {
		pages += t.Pages
		for k, n := range t.Nodes {
			nodes[k] += n
		}
	}
	moved, dropped, slowMoved, slowDropped, pagesMax := 0, 0, 0, 0, 0
	for _, t := range all {
		moved += t.Checkpointed
		dropped += t.Dropped
		pagesMax = max(pagesMax, t.Pages)
	}
	for _, t := range slowest {
		slowPages += t.Pages
		slowMoved += t.Checkpointed
		slowDropped += t.Dropped
	}
	per := func(n, of int) float64 { return float64(n) / float64(of) }
	fmt.Fprintf(&sb, "pages written per transaction %.2f (slowest 1%%: %.2f, max %d), per run %.2f\n", per(pages, len(all)), per(slowPages, len(slowest)), pagesMax, per(pages, runs))
	fmt.Fprintf(&sb, "journal keys checkpointed per transaction %.2f (slowest 1%%: %.2f), dead records deleted %.2f (slowest 1%%: %.2f)\n", per(moved, len(all)), per(slowMoved, len(slowest)), per(dropped, len(all)), per(slowDropped, len(slowest)))
	// The sync's time by the pages written before it: what a page costs in the fdatasync.
	sb.WriteString("write+sync by pages written:")
	for _, r := range [][2]int{{0, 10}, {11, 14}, {15, 18}, {19, 24}, {25, 1 << 30}} {
		var ds []time.Duration
		for _, t := range all {
			if t.Pages >= r[0] && t.Pages <= r[1] {
				ds = append(ds, t.Write)
			}
		}
		if len(ds) > 0 {
			var sum time.Duration
			for _, d := range ds {
				sum += d
			}
			fmt.Fprintf(&sb, " [%d-%d] n=%d mean %.3f p50 %.3f p99 %.3f ms;", r[0], min(r[1], 999), len(ds), float64(sum)/float64(len(ds))/1e6, q(ds, 0.5), q(ds, 0.99))
		}
	}
	sb.WriteString("\ndirty nodes per transaction by bucket:")
	names := make([]string, 0, len(nodes))
	for k := range nodes {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		name := k
		if name == "" {
			name = "(root)"
		}
		fmt.Fprintf(&sb, " %s %.2f", name, float64(nodes[k])/float64(len(all)))
	}
	b.ReportMetric(float64(pages)/float64(len(all)), "pages/tx")
	b.Log(sb.String())
}
