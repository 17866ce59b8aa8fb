package loadtest

import (
	"testing"
	"time"
)

// A wait's clock starts at the first frame that showed its run settled: the thread stream's
// event when it left before the shell row (the connector can be woken by either), the shell row
// otherwise; thread events of other steps (other runs, other sequences) never count.
func TestWakeClockStartsAtTheFirstFrameThatShowedTheSettle(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	m := &machine{name: "m"}
	early := &run{m: m, settleFrom: 10, settleSeq: 12} // its thread event left 40 ms before its row
	late := &run{m: m, settleFrom: 20, settleSeq: 21}  // its row left first
	rowOnly := &run{m: m, settleFrom: 30, settleSeq: 31}
	m.sent = []sentItem{{12, at(50)}, {21, at(60)}, {31, at(70)}}
	m.threadSent = []sentItem{
		{9, at(1)},   // an earlier step's event: not this run's
		{11, at(10)}, // early's step: its run.updated
		{12, at(11)},
		{21, at(65)}, // after late's row
		{32, at(2)},  // a later step's
	}
	h := &harness{}
	got := h.firstSendTimes([]*run{early, late, rowOnly})
	want := map[*run]time.Time{early: at(10), late: at(60), rowOnly: at(70)}
	for r, w := range want {
		if !got[r].Equal(w) {
			t.Errorf("run settling at %d: clock starts %v, want %v", r.settleSeq, got[r].Sub(t0), w.Sub(t0))
		}
	}
	// The event latency's clock stays the shell row's: the webhook is the detector's, which judges rows.
	if rows := h.sendTimes([]*run{early}); !rows[early].Equal(at(50)) {
		t.Errorf("sendTimes = %v, want the row's 50ms", rows[early].Sub(t0))
	}
}
