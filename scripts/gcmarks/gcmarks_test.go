package gcmarks

import (
	"strings"
	"testing"
)

func TestReportCountsTheSlowItemsDuringAMark(t *testing.T) {
	marks := []Span{{100, 200}, {1000, 1100}}
	items := []Item{
		{Span{150, 160}, 60},   // slow, began inside the first mark
		{Span{50, 120}, 70},    // slow, a mark began during it
		{Span{300, 400}, 80},   // slow, no mark
		{Span{10, 20}, 5},      // fast, no mark
		{Span{1050, 1060}, 40}, // fast, inside the second mark
	}
	var b strings.Builder
	Report(&b, "events", marks, items, 50)
	out := b.String()
	for _, want := range []string{
		"2 mark phases in the joined events' window",
		"above  50 ms:     3 events,  66.7 % with a mark during them ( 33.3 % began inside one); the other     2:  50.0 %",
		"a mark during them   n      3",
		"no mark during them  n      2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestReportWithoutMarksSaysSo(t *testing.T) {
	var b strings.Builder
	Report(&b, "wakes", nil, []Item{{Span{0, 10}, 3}}, 10)
	if !strings.Contains(b.String(), "no mark phase in the trace") {
		t.Errorf("report: %s", b.String())
	}
}

// Marks keeps the mark phases whose begin it saw, and nothing of other ranges.
func TestMarksPairsTheMarkPhases(t *testing.T) {
	var m Marks
	m.End(RangeName, 5) // a phase begun before the trace: no begin seen
	m.Begin(RangeName, 10)
	m.Begin("GC incremental sweep", 12)
	m.End("GC incremental sweep", 14)
	m.End(RangeName, 20)
	m.Begin(RangeName, 30)
	m.End(RangeName, 45)
	if len(m.Spans) != 2 || m.Spans[0] != (Span{10, 20}) || m.Spans[1] != (Span{30, 45}) {
		t.Fatalf("spans %v, want [{10 20} {30 45}]", m.Spans)
	}
}
