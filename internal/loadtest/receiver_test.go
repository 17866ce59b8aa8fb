package loadtest

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/t3fake"
)

// hookBody is a delivery as the connector sends it (docs/events.md's example, with the harness's
// ids).
func hookBody(id, thread, run string) string {
	return `{"id":"` + id + `","type":"thread.completed","occurred_at":"2026-12-01T20:00:00Z","machine":"load-000",` +
		`"project":{"id":"project-1","title":"load"},"thread_id":"` + thread + `","run_id":"` + run + `",` +
		`"title":"Load thread 0","summary":"Done: \"quoted\" \u00e9"}`
}

// The receiver, served on 127.0.0.1 and fed by net/http's client over kept-alive connections as
// the connector's deliveries are: a new event is counted and joined to its run with its arrival
// time, a repeated event id is a duplicate, a body whose id the webhook-id header does not repeat
// (or no JSON object) is bad, each thread's runs are kept in the order their first events
// arrived, while down every delivery is refused with 503 and not recorded, and the connections
// opened to it are counted.
func TestReceiverCountsAndOrders(t *testing.T) {
	r, err := newReceiver()
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	post := func(webhookID, body string) int {
		t.Helper()
		return postHook(t, client, r.url, webhookID, body)
	}
	before := time.Now()
	for _, d := range []struct{ id, thread, run string }{
		{"evt_1", "thread-a", "run-a1"}, {"evt_2", "thread-b", "run-b1"}, {"evt_3", "thread-a", "run-a2"},
		{"evt_4", "thread-a", "run-a1"}, // a second event of run-a1: counted, its first arrival kept
	} {
		if code := post(d.id, hookBody(d.id, d.thread, d.run)); code != http.StatusNoContent {
			t.Fatalf("delivery %s: status %d", d.id, code)
		}
	}
	if code := post("evt_1", hookBody("evt_1", "thread-a", "run-a1")); code != http.StatusNoContent {
		t.Fatalf("duplicate: status %d", code)
	}
	post("evt_other", hookBody("evt_5", "thread-a", "run-a3")) // header and body disagree
	post("evt_6", `not json`)
	post("evt_7", hookBody("evt_7", "thread-a", "run-a5")+strings.Repeat(" ", maxHookBody)) // too large: bad

	r.down.Store(true)
	if code := post("evt_8", hookBody("evt_8", "thread-a", "run-a4")); code != http.StatusServiceUnavailable {
		t.Fatalf("while down: status %d, want 503", code)
	}
	r.down.Store(false)

	if got := r.count(); got != 4 {
		t.Errorf("count %d, want 4 distinct events", got)
	}
	st := r.stats()
	conns := st.Connections
	st.Connections = 0
	if st != (Receiver{Distinct: 4, Duplicates: 1, Bad: 3, Refused: 1}) {
		t.Errorf("receiver stats %+v, want 4 distinct, 1 duplicate, 3 bad, 1 refused", st)
	}
	// The connections the client opened: at least the one kept alive, and one more after the
	// client dropped its idle ones.
	if conns < 1 {
		t.Errorf("%d connections counted for 9 deliveries", conns)
	}
	client.CloseIdleConnections()
	post("evt_2", hookBody("evt_2", "thread-b", "run-b1"))
	if got := r.stats().Connections; got != conns+1 {
		t.Errorf("after the client dropped its connections: %d connections, want %d", got, conns+1)
	}
	if got := r.arrivals("thread-a"); strings.Join(got, ",") != "run-a1,run-a2" {
		t.Errorf("thread-a's runs arrived as %v, want [run-a1 run-a2]", got)
	}
	d, ok := r.forRun("run-b1")
	if !ok || d.id != "evt_2" || d.typ != "thread.completed" || d.thread != "thread-b" || d.at.Before(before) || d.at.After(time.Now()) {
		t.Errorf("run-b1: %+v, %v", d, ok)
	}
	for _, run := range []string{"run-a3", "run-a4", "run-a5"} {
		if _, ok := r.forRun(run); ok {
			t.Errorf("%s recorded, but its delivery was bad or refused", run)
		}
	}
}

// postHook delivers one webhook to url and returns the status.
func postHook(t *testing.T, client *http.Client, url, webhookID, body string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, url, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("webhook-id", webhookID)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

// FuzzDecodeDelivery: any body decodes without a panic, and a body that decodes with an id
// gives back exactly the strings it carried.
func FuzzDecodeDelivery(f *testing.F) {
	f.Add([]byte(hookBody("evt_3f1c9a0e5b7d2c4a6e8f0b1d", "thread-edec8901", "run:thread:thread-edec8901:ordinal:1")))
	f.Add([]byte(`{"id":"evt_9","type":"thread.question","question":{"kind":"user_input","questions":[{"id":"format"}]},"run_id":null}`))
	f.Add([]byte(`{"id":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		d, err := decodeDelivery(body)
		if err != nil || d.id == "" {
			return
		}
		again, err := decodeDelivery(body)
		if err != nil || again != d {
			t.Fatalf("decoding %q twice: %+v then %+v (%v)", body, d, again, err)
		}
	})
}

// One driver moves every machine: a command naming several machines runs for all of them or,
// if one is no longer driven, for none; a machine whose tick fails (here its fake was given a run
// behind the driver's back, so the driver's mirror of the step queue is wrong) stops being driven
// and reports why through do, while the other machine's runs still take their steps.
func TestDriverStopsOnlyTheFailingMachine(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ms []*machine
	for i, name := range []string{"a", "b"} {
		m, err := newMachine(i, name, t3fake.Options{}, "")
		if err != nil {
			t.Fatal(err)
		}
		defer m.close()
		if err := m.seed(ctx, 2); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	a, b := ms[0], ms[1]
	dctx, dcancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	d := newDriver(ms)
	go func() {
		defer close(stopped)
		d.run(dctx)
	}()
	defer func() { dcancel(); <-stopped }()

	if _, err := a.fk.StartRun(a.threads[0], Prompt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.done:
	case <-ctx.Done():
		t.Fatal("machine a was never stopped")
	}
	if err := a.do(ctx, func() {}); err == nil || !strings.Contains(err.Error(), "lost track") {
		t.Errorf("a command for the stopped machine: %v, want its tick's error", err)
	}
	ran := 0
	if err := d.do(ctx, []*machine{b, a}, func(*machine) { ran++ }); err == nil || ran != 0 {
		t.Errorf("a command for both machines: %v after running for %d of them, want the error and none", err, ran)
	}
	if err := d.do(ctx, []*machine{b}, func(*machine) { ran++ }); err != nil || ran != 1 {
		t.Errorf("a command for machine b: %v, ran %d times", err, ran)
	}

	var runs []*run
	var serr error
	if err := b.do(ctx, func() {
		runs, serr = b.startHang(b.threads[:1], roleWait, func(int) time.Time { return time.Now().Add(time.Hour) })
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	select {
	case <-runs[0].parkedCh: // stepped twice by the driver after a stopped
	case <-b.done:
		t.Fatalf("machine b stopped too: %v", b.failure())
	case <-ctx.Done():
		t.Fatal("machine b's run never parked")
	}
	dcancel()
	<-stopped
	<-b.done
	if e := b.err.Load(); e != nil {
		t.Errorf("machine b: %v", *e)
	}
}

// BenchmarkReceiverRecord is the receiver's bookkeeping per delivery (record: the event's id, its
// run's first arrival, the thread's order) over 75,000 distinct events, a throughput window's at
// 5,000/s: grown, maps made empty (before 12-02); hinted, made for receiverHint events.
func BenchmarkReceiverRecord(b *testing.B) {
	const n = 75_000
	ds := make([]delivery, n)
	ids := make([][]byte, n)
	for i := range ds {
		ds[i] = delivery{id: fmt.Sprintf("evt_%032x", i), typ: "run.completed", run: fmt.Sprintf("run:thread:%d:ordinal:2", i),
			thread: fmt.Sprintf("thread-%08x-1111-4222-8333-%012x", i%99_750, i), at: time.Now()}
		ids[i] = []byte(ds[i].id)
	}
	for _, c := range []struct {
		name string
		hint int
	}{{"grown", 0}, {"hinted", receiverHint}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				r := &receiver{}
				r.reset(c.hint)
				for i, d := range ds {
					r.record(d, nil, ids[i])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/delivery")
		})
	}
}
