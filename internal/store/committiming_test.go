package store

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	bolt "go.etcd.io/bbolt"
)

// ObserveCommits gets each transaction of the group taken apart: its batches, ops and events, the
// pages bbolt wrote and the dirty nodes of each bucket it changed.
func TestObserveCommitsTakesEachTransactionApart(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g := NewGroup(s)
	var seen []CommitTiming
	if !g.ObserveCommits(func(ct CommitTiming) { seen = append(seen, ct) }) {
		t.Fatal("ObserveCommits refused the bbolt store")
	}
	ev := Event{ID: "evt-1", Stream: "m/t", Body: []byte(`{"type":"thread.completed"}`), CreatedAt: time.Now()}
	if err := g.Commit(Batch{Detector: map[string][]byte{"m\x00t": []byte(`{"run":"r1"}`)}, Events: []Event{ev}}); err != nil {
		t.Fatal(err)
	}
	if errs, err := g.Record([]Op{{ID: "evt-1", Kind: OpDelivered, At: time.Now()}}); err != nil || errs[0] != nil {
		t.Fatal(errs, err)
	}
	// Commit and Record return after the writer released them; it notes the timing after
	// that: wait for the writer to end (it ends once nothing is pending).
	waitWriterIdle(t, g)
	if len(seen) != 2 {
		t.Fatalf("%d transactions observed, want 2", len(seen))
	}
	c, r := seen[0], seen[1]
	if c.Batches != 1 || c.Ops != 0 || c.Events != 1 || r.Batches != 0 || r.Ops != 1 || r.Events != 0 {
		t.Errorf("requests: commit %d/%d/%d, record %d/%d/%d", c.Batches, c.Ops, c.Events, r.Batches, r.Ops, r.Events)
	}
	for _, b := range []string{"detector_journal", "ev_ids_journal", "ev_pending", "ev_streams"} {
		if c.Nodes[b] < 1 {
			t.Errorf("the commit's dirty nodes %v: none in %s", c.Nodes, b)
		}
	}
	// The event's body is in its record (ev_pending): no other bucket is written for it.
	for b := range c.Nodes {
		if !strings.Contains(" detector_journal ev_ids_journal ev_pending ev_streams ", " "+b+" ") && b != "" {
			t.Errorf("the commit's dirty nodes %v: %s is none of the four buckets a commit writes", c.Nodes, b)
		}
	}
	for _, b := range []string{"ev_pending", "ev_delivered", "ev_delivered_at", "ev_streams"} {
		if r.Nodes[b] < 1 {
			t.Errorf("the record's dirty nodes %v: none in %s", r.Nodes, b)
		}
	}
	if _, ok := r.Nodes["detector_journal"]; ok {
		t.Errorf("the record's dirty nodes %v: it wrote no detector state", r.Nodes)
	}
	// At least the root's page and the meta page (a small bucket lives inline in the root's).
	for _, ct := range seen {
		if ct.Pages < 2 || ct.Commit <= 0 || ct.Write <= 0 {
			t.Errorf("%+v: the commit's pages and parts must be measured", ct)
		}
	}
}

// Another store (PostgreSQL's) has no bbolt transaction to take apart.
func TestObserveCommitsOnlyOnBolt(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if NewGroup(struct{ Store }{s}).ObserveCommits(func(CommitTiming) {}) {
		t.Error("ObserveCommits accepted a store that is not the bbolt one")
	}
}

// With metrics, every transaction is observed in each part of t3code_mcp_store_commit_part_seconds.
func TestGroupMetricsCommitParts(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	reg := prometheus.NewRegistry()
	m, err := NewGroupMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	g := NewGroup(s).WithMetrics(m)
	const commits = 3
	for i := range commits {
		if err := g.Commit(Batch{Detector: map[string][]byte{fmt.Sprintf("m\x00t%d", i): []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
	}
	waitWriterIdle(t, g)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	parts := map[string]uint64{}
	for _, f := range fams {
		if f.GetName() != "t3code_mcp_store_commit_part_seconds" {
			continue
		}
		for _, mt := range f.GetMetric() {
			parts[label(mt, "part")] = mt.GetHistogram().GetSampleCount()
		}
	}
	for _, p := range []string{"writes", "sync", "handover", "release"} {
		if parts[p] != commits {
			t.Errorf("part %s observed %d times, want %d (%v)", p, parts[p], commits, parts)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// waitWriterIdle waits until g's writer has ended (nothing pending, no transaction running).
func waitWriterIdle(t *testing.T, g *Group) {
	t.Helper()
	for {
		g.mu.Lock()
		idle := !g.writing && len(g.pending) == 0
		g.mu.Unlock()
		if idle {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// The buckets written in key order and never rewritten fill their pages: appended one small
// transaction at a time (the event-id journal at every commit, the delivered records at every
// delivery), their leaves end up nearly full instead of half full (bbolt's default split), so the
// tail page splits half as often. The pending events' records keep the default (rewritten in
// place by retries, moved by deliveries).
func TestAppendBucketsFillTheirPages(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := []byte(`{"type":"thread.completed","summary":"Done: fixed the flaky payment test, 3 files changed"}`)
	for i := range 400 {
		evs := make([]Event, 4)
		ops := make([]Op, len(evs))
		for j := range evs {
			id := fmt.Sprintf("evt-%04d-%d", i, j)
			evs[j] = Event{ID: id, Stream: "m/" + id, Body: body, CreatedAt: time.Now()}
			ops[j] = Op{ID: id, Kind: OpDelivered, At: time.Now()}
		}
		if err := s.Commit(Batch{Events: evs}); err != nil {
			t.Fatal(err)
		}
		if errs, err := s.Record(ops); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
	}
	fill := func(tx *bolt.Tx, name []byte) float64 {
		st := tx.Bucket(name).Stats()
		if st.LeafPageN < 4 {
			t.Fatalf("%s: %d leaf pages: too few to judge", name, st.LeafPageN)
		}
		return float64(st.LeafInuse) / float64(st.LeafAlloc)
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		// The tail page is as full as the appends left it; every other one was split full.
		for _, name := range [][]byte{bIDJournal, bDelivered, bDeliveredAt} {
			if f := fill(tx, name); f < 0.8 {
				t.Errorf("%s: leaves %.0f %% full, want ≥ 80 %%", name, 100*f)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A body is rewritten in place only by an enrichment, which makes its record larger: that may
// split the record's page, and every body, the rewritten one and its neighbours on that page, must
// read back as written, also after the file is reopened.
func TestEnrichedBodyOnAFullPage(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.Close() }()
	bodyOf := func(i int) []byte {
		return fmt.Appendf(nil, `{"type":"thread.failed","n":%d,"pad":"%s"}`, i, strings.Repeat("x", 300))
	}
	const n = 60 // ~25 pages of bodies at ~350 bytes
	evs := make([]Event, n)
	for i := range evs {
		id := fmt.Sprintf("evt-%03d", i)
		evs[i] = Event{ID: id, Stream: "m/" + id, Body: bodyOf(i), Enrich: true, CreatedAt: time.Now()}
	}
	if err := s.Commit(Batch{Events: evs}); err != nil {
		t.Fatal(err)
	}
	enriched := map[string][]byte{}
	for _, i := range []int{0, 23, 24, 41, n - 1} {
		id := fmt.Sprintf("evt-%03d", i)
		enriched[id] = fmt.Appendf(nil, `{"type":"thread.failed","n":%d,"thread":"%s"}`, i, strings.Repeat("y", 2500))
		if errs, err := s.Record([]Op{{ID: id, Kind: OpBody, Body: enriched[id]}}); err != nil || errs[0] != nil {
			t.Fatal(errs, err)
		}
	}
	check := func() {
		t.Helper()
		for i := range n {
			id := fmt.Sprintf("evt-%03d", i)
			e, err := s.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			want, ok := enriched[id]
			if !ok {
				want = bodyOf(i)
			}
			if !bytes.Equal(e.Body, want) || e.Enrich == ok {
				t.Fatalf("%s: body %.60q (enrich %v), want %.60q (enrich %v)", id, e.Body, e.Enrich, want, !ok)
			}
		}
	}
	check()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if s, err = Open(dir); err != nil {
		t.Fatal(err)
	}
	check()
}
