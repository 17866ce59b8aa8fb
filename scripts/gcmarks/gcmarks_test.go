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
