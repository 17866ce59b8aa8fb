// Package gcmarks joins the collector's mark phases of a runtime trace with the spans of work
// that tracejoin (events) and wakejoin (t3_wait wakes) take apart: how many of the slow ones had
// a mark running while the connector worked on them, against the others, and the times of the
// two groups. A module of its own, used by both scripts through a replace directive.
package gcmarks

import (
	"fmt"
	"io"
	"sort"
)

// RangeName is the runtime trace's name of a collection's concurrent mark phase
// (golang.org/x/exp/trace: EventRangeBegin, EventRangeActive, EventRangeEnd).
const RangeName = "GC concurrent mark phase"

// Span is a stretch of trace time (ns): a mark phase, or one event's or wake's way.
type Span struct{ Begin, End int64 }

// Marks collects a trace's mark phases from its range events (golang.org/x/exp/trace's Range
// names and times, passed in so that this package needs no trace reader of its own).
type Marks struct {
	Spans []Span
	begin int64
}

// Begin notes a range's begin (or, at the trace's start, a range already active).
func (m *Marks) Begin(name string, t int64) {
	if name == RangeName {
		m.begin = t
	}
}

// End notes a range's end: a mark phase whose begin was seen is kept.
func (m *Marks) End(name string, t int64) {
	if name == RangeName && m.begin != 0 {
		m.Spans = append(m.Spans, Span{Begin: m.begin, End: t})
		m.begin = 0
	}
}

// Item is one joined event or wake: its span in the marks' trace and its time as reported (ms).
type Item struct {
	Span Span
	MS   float64
}

// overlaps reports whether any mark runs during s, and whether s began inside one.
func overlaps(marks []Span, s Span) (during, began bool) {
	for _, m := range marks {
		if m.Begin < s.End && s.Begin < m.End {
			during = true
			began = began || (m.Begin <= s.Begin && s.Begin < m.End)
		}
	}
	return during, began
}

// Report writes, for each limit (ms), the share of the items above it with a mark during them
// (and that began inside one) against the share of the others, then the items' p50/p99/max for
// all, those with a mark during them and the rest. Marks outside the items' window are not
// counted in the marks' share of it.
func Report(w io.Writer, what string, marks []Span, items []Item, limits ...float64) {
	if len(items) == 0 {
		return
	}
	lo, hi := items[0].Span.Begin, items[0].Span.End
	for _, it := range items {
		lo, hi = min(lo, it.Span.Begin), max(hi, it.Span.End)
	}
	var inside int64
	n := 0
	for _, m := range marks {
		if b, e := max(m.Begin, lo), min(m.End, hi); b < e {
			inside += e - b
			n++
		}
	}
	fmt.Fprintf(w, "\n[GC marks] %d mark phases in the joined %s' window (%.2f s), %.1f %% of it\n", n, what, float64(hi-lo)/1e9, 100*float64(inside)/float64(max(hi-lo, 1)))
	if len(marks) == 0 {
		fmt.Fprintln(w, "  no mark phase in the trace: is it the connector's?")
		return
	}
	pct := func(n, of int) float64 { return 100 * float64(n) / float64(max(of, 1)) }
	var all, in, out []float64
	for _, it := range items {
		all = append(all, it.MS)
		if d, _ := overlaps(marks, it.Span); d {
			in = append(in, it.MS)
		} else {
			out = append(out, it.MS)
		}
	}
	for _, limit := range limits {
		var slow, slowDuring, slowBegan, fast, fastDuring int
		for _, it := range items {
			during, began := overlaps(marks, it.Span)
			switch {
			case it.MS <= limit:
				fast++
				if during {
					fastDuring++
				}
			case during:
				slow++
				slowDuring++
				if began {
					slowBegan++
				}
			default:
				slow++
			}
		}
		fmt.Fprintf(w, "  above %3.0f ms: %5d %s, %5.1f %% with a mark during them (%5.1f %% began inside one); the other %5d: %5.1f %%\n",
			limit, slow, what, pct(slowDuring, slow), pct(slowBegan, slow), fast, pct(fastDuring, fast))
	}
	for _, g := range []struct {
		name string
		v    []float64
	}{{"all", all}, {"a mark during them", in}, {"no mark during them", out}} {
		if len(g.v) == 0 {
			continue
		}
		sort.Float64s(g.v)
		q := func(p float64) float64 { return g.v[min(len(g.v)-1, int(p*float64(len(g.v))))] }
		fmt.Fprintf(w, "  %-20s n %6d  p50 %7.2f  p99 %7.2f  max %7.2f ms\n", g.name, len(g.v), q(.5), q(.99), g.v[len(g.v)-1])
	}
}
