package loadtest

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The split harness's second process (this test binary re-run: TestMain) serves the webhooks,
// and the first process's mirror keeps what the one-process receiver keeps: first arrival per
// run with its time, duplicates, bad deliveries, the order of each thread's runs, refusals while
// down, connections. A tool call without MCP sessions comes back as an error, not a hang.
func TestSplitReceiverMirrorsDeliveries(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a second process")
	}
	c, err := startClients(splitArgs())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.stop(); err != nil {
			t.Error(err)
		}
	}()
	r := c.rec
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	post := func(webhookID, body string) int {
		return postHook(t, &http.Client{Transport: tr}, r.url, webhookID, body)
	}
	before := time.Now()
	for _, d := range []struct{ id, thread, run string }{
		{"evt_1", "thread-a", "run-a1"}, {"evt_2", "thread-b", "run-b1"}, {"evt_3", "thread-a", "run-a2"},
		{"evt_4", "thread-a", "run-a1"}, {"evt_1", "thread-a", "run-a1"}, // a second event of run-a1; a duplicate
	} {
		if code := post(d.id, hookBody(d.id, d.thread, d.run)); code != http.StatusNoContent {
			t.Fatalf("delivery %s: status %d", d.id, code)
		}
	}
	post("evt_other", hookBody("evt_5", "thread-a", "run-a3")) // header and body disagree: bad
	if err := c.setDown(true); err != nil {
		t.Fatal(err)
	}
	// The child takes D before the next delivery only once it read it: post until refused. Each
	// evt_8 the child took before that counts: the first as distinct, every later one as a
	// duplicate (on a loaded machine the child may read D only after several tries).
	deadline := time.Now().Add(time.Minute)
	taken8 := 0
	for post("evt_8", hookBody("evt_8", "thread-a", "run-a4")) != http.StatusServiceUnavailable {
		taken8++
		if time.Now().After(deadline) {
			t.Fatal("the receiver never went down")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.setDown(false); err != nil {
		t.Fatal(err)
	}
	// The mirror lags the child by the pipe: wait (generously) for the last refusal to cross.
	want := Receiver{Distinct: 4, Duplicates: 1, Bad: 1, Refused: 1}
	if taken8 > 0 {
		want.Distinct++               // evt_8, taken before the child read D
		want.Duplicates += taken8 - 1 // and taken again on each later try
	}
	var st Receiver
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		st = r.stats()
		conns := st.Connections
		st.Connections = 0
		if st == want && conns >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if st != want {
		t.Errorf("mirror stats %+v, want %+v", st, want)
	}
	if got := r.arrivals("thread-a"); !strings.HasPrefix(strings.Join(got, ","), "run-a1,run-a2") {
		t.Errorf("thread-a's runs arrived as %v, want run-a1, run-a2 first", got)
	}
	d, ok := r.forRun("run-b1")
	if !ok || d.id != "evt_2" || d.typ != "thread.completed" || d.thread != "thread-b" || d.at.Before(before) || d.at.After(time.Now()) {
		t.Errorf("run-b1: %+v, %v (taken after %s)", d, ok, before)
	}
	if _, ok := r.forRun("run-a4"); ok != (taken8 > 0) {
		t.Errorf("run-a4 recorded %v, but evt_8 was taken %d times", ok, taken8)
	}
	if _, ok := r.forRun("run-a3"); ok {
		t.Error("run-a3 recorded, but its delivery was bad")
	}
	if _, err := (remoteAgents{c}).call(context.Background(), 0, "t3_wait", map[string]any{"thread_id": "x"}); err == nil || !strings.Contains(err.Error(), "no MCP sessions") {
		t.Errorf("a call without sessions: %v", err)
	}
}
