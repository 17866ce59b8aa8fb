package store_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
)

// The store's hot paths under the connector's load: the detector's durable append of events
// (one fsynced bbolt transaction per watched chunk), the outbox's per-event bookkeeping, and the
// per-thread read the detector does for every thread a chunk touches. The files live in
// b.TempDir(), so the fsyncs hit the same disk as the state directory would on this machine.

// benchBody is a webhook body of the size the connector sends for a completed run (~600 bytes).
var benchBody = []byte(`{"id":"evt_0123456789abcdef01234567","type":"thread.completed","occurred_at":"2026-11-29T10:00:00.000Z",` +
	`"machine":"load-007","project":{"id":"project-1","title":"load"},"thread_id":"thread-0123456789abcdef",` +
	`"run_id":"run:thread:thread-0123456789abcdef:ordinal:1","title":"Fix the flaky test in the payment service",` +
	`"origin":"conversation-42","summary":"Done: Fix the flaky test in the payment service. I changed the retry ` +
	`loop so that it waits for the ledger to settle before asserting, ran go test ./... (exit 0) and updated ` +
	`README.md (+3 -1)."}`)

func benchEvent(i int) store.Event {
	return store.Event{
		ID:        "evt_" + strconv.Itoa(i),
		Stream:    "load-007/thread-" + strconv.Itoa(i%1000),
		Body:      benchBody,
		CreatedAt: time.Now(),
	}
}

// benchCommit commits b.N events, perCommit per transaction, each transaction with the detector
// state of every thread it touched (as events.Detector.Apply does).
func benchCommit(b *testing.B, perCommit int) {
	s := storetest.OpenBolt(b)
	state := []byte(`{"run":"run:thread:thread-1:ordinal:1","settled":true}`)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for n < b.N {
		batch := store.Batch{Detector: map[string][]byte{}}
		for j := 0; j < perCommit && n < b.N; j++ {
			e := benchEvent(n)
			batch.Events = append(batch.Events, e)
			batch.Detector["load-007\x00"+e.Stream] = state
			n++
		}
		if err := s.Commit(batch); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkCommitEvent is the durable append of one event per fsynced transaction: the detector's
// cost when every chunk carries one transition. ns/op is one event.
func BenchmarkCommitEvent(b *testing.B) { benchCommit(b, 1) }

// BenchmarkCommitEvents16 and 64 are group commits: a chunk that settled 16 or 64 runs is one
// transaction. ns/op is still one event.
func BenchmarkCommitEvents16(b *testing.B) { benchCommit(b, 16) }

func BenchmarkCommitEvents64(b *testing.B) { benchCommit(b, 64) }

// BenchmarkCommitStateOnly is the commit the detector makes when a watched thread starts a new
// run (its last-seen run changes, no event): one fsync.
func BenchmarkCommitStateOnly(b *testing.B) {
	s := storetest.OpenBolt(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := fmt.Sprintf("load-007\x00thread-%d", i%1000)
		if err := s.Commit(store.Batch{Detector: map[string][]byte{k: []byte(`{"run":"r` + strconv.Itoa(i) + `"}`)}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMarkDelivered is the outbox's record of one delivered event: one fsynced transaction
// per event, after every webhook 2xx.
func BenchmarkMarkDelivered(b *testing.B) {
	s := storetest.OpenBolt(b)
	const chunk = 256
	var batch []store.Event
	for i := 0; i < b.N; i++ {
		batch = append(batch, benchEvent(i))
		if len(batch) == chunk || i == b.N-1 {
			if err := s.Commit(store.Batch{Events: batch}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if errs, err := s.Record([]store.Op{{ID: "evt_" + strconv.Itoa(i), Kind: store.OpDelivered, At: now}}); err != nil || errs[0] != nil {
			b.Fatal(err, errs)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkHeads1000 is the outbox loop's scan of every stream's head with 1,000 streams pending:
// it runs on every wake-up of the delivery loop (each Notify and each finished delivery).
func BenchmarkHeads1000(b *testing.B) {
	s := storetest.OpenBolt(b)
	var batch []store.Event
	for i := 0; i < 1000; i++ {
		batch = append(batch, benchEvent(i))
	}
	if err := s.Commit(store.Batch{Events: batch}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		h, err := s.Heads(0)
		if err != nil || len(h) != 1000 {
			b.Fatal(len(h), err)
		}
	}
}

// BenchmarkGetThread is the read the detector makes for every thread of every chunk (is it
// tracked and watched?), with 100,000 tracked threads.
func BenchmarkGetThread(b *testing.B) {
	s := storetest.OpenBolt(b)
	const n = 100_000
	now := time.Now()
	var threads []store.Thread
	for i := 0; i < n; i++ {
		threads = append(threads, store.Thread{
			ID: fmt.Sprintf("thread-%08d-aaaa-bbbb-cccc-%012d", i, i), Machine: fmt.Sprintf("load-%03d", i%100),
			ProjectID: "project-1", ProjectTitle: "load", Title: "load thread", Watch: true, CreatedAt: now, UpdatedAt: now,
		})
	}
	if err := s.Commit(store.Batch{Threads: threads}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, err := s.GetThread(threads[i%n].ID); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkCommitEventLargeStore is BenchmarkCommitEvent in the state file of a connector that
// watches 100,000 threads (their records and detector states written first): what each of the
// detector's commits costs at that scale.
func BenchmarkCommitEventLargeStore(b *testing.B) {
	s := storetest.OpenBolt(b)
	now := time.Now()
	const n = 100_000
	var threads []store.Thread
	det := map[string][]byte{}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("thread-%08d-aaaa-bbbb-cccc-%012d", i, i)
		threads = append(threads, store.Thread{ID: id, Machine: fmt.Sprintf("load-%03d", i%100), ProjectID: "project-1",
			ProjectTitle: "load", Title: "load thread", Watch: true, CreatedAt: now, UpdatedAt: now})
		det[fmt.Sprintf("load-%03d\x00%s", i%100, id)] = []byte(`{"run":"run:thread:` + id + `:ordinal:1","settled":true}`)
	}
	if err := s.Commit(store.Batch{Threads: threads, Detector: det}); err != nil {
		b.Fatal(err)
	}
	state := []byte(`{"run":"run:thread:thread-1:ordinal:2","settled":true}`)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		e := benchEvent(i)
		k := fmt.Sprintf("load-%03d\x00%s", i%100, threads[i%n].ID)
		if err := s.Commit(store.Batch{Events: []store.Event{e}, Detector: map[string][]byte{k: state}}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// benchRecord records b.N deliveries, perTx outcomes per transaction (the outbox's recorder
// batches whatever outcomes wait for it): ns/op is per event.
func benchRecord(b *testing.B, perTx int) { benchRecordOps(b, perTx, false) }

// benchRecordOps is benchRecord, the ops giving each event's sequence number when bySeq (Op.Seq,
// as the outbox records).
func benchRecordOps(b *testing.B, perTx int, bySeq bool) {
	s := storetest.OpenBolt(b)
	var batch []store.Event
	for i := 0; i < b.N; i++ {
		batch = append(batch, benchEvent(i))
		if len(batch) == 256 || i == b.N-1 {
			if err := s.Commit(store.Batch{Events: batch}); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	seqs := make([]uint64, b.N)
	if bySeq {
		p, err := s.Pending(0)
		if err != nil || len(p) != b.N {
			b.Fatalf("Pending = %d events, %v", len(p), err)
		}
		for i, e := range p { // in insertion order: evt_i is the i-th
			seqs[i] = e.Seq
		}
	}
	now := time.Now()
	ops := make([]store.Op, 0, perTx)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ops = append(ops, store.Op{ID: "evt_" + strconv.Itoa(i), Seq: seqs[i], Kind: store.OpDelivered, At: now})
		if len(ops) == perTx || i == b.N-1 {
			errs, err := s.Record(ops)
			if err != nil {
				b.Fatal(err)
			}
			for _, err := range errs {
				if err != nil {
					b.Fatal(err)
				}
			}
			ops = ops[:0]
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkRecord1: one delivery per transaction (as BenchmarkMarkDelivered).
func BenchmarkRecord1(b *testing.B) { benchRecord(b, 1) }

// BenchmarkRecord32: 32 deliveries per transaction (a full round of the default concurrency).
func BenchmarkRecord32(b *testing.B) { benchRecord(b, 32) }

// BenchmarkRecord256: 256 deliveries per transaction (a drained backlog's batches).
func BenchmarkRecord256(b *testing.B) { benchRecord(b, 256) }

// BenchmarkRecord256BySeq is BenchmarkRecord256 with each op's sequence number (Op.Seq), as the
// outbox records: the pending event is found without a read of the id index.
func BenchmarkRecord256BySeq(b *testing.B) { benchRecordOps(b, 256, true) }

// BenchmarkPruneNothingDue100000Delivered is one prune turn (the detector's, every prune
// interval) over 100,000 delivered events none of which is due yet: it reads the delivery-time
// index up to the cutoff, so its cost is that of what it deletes (here nothing) whatever is kept.
// Before the index it decoded every delivered header.
func BenchmarkPruneNothingDue100000Delivered(b *testing.B) {
	s := storetest.OpenBolt(b)
	const n = 100_000
	at := time.Now()
	ops := make([]store.Op, 0, 1024)
	for i := 0; i < n; i += 1024 {
		var evs []store.Event
		ops = ops[:0]
		for j := i; j < min(i+1024, n); j++ {
			evs = append(evs, benchEvent(j))
			ops = append(ops, store.Op{ID: "evt_" + strconv.Itoa(j), Kind: store.OpDelivered, At: at})
		}
		if err := s.Commit(store.Batch{Events: evs}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Record(ops); err != nil {
			b.Fatal(err)
		}
	}
	cutoff := at.Add(-time.Hour)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if got, err := s.Prune(cutoff); err != nil || got != 0 {
			b.Fatalf("Prune = %d %v", got, err)
		}
	}
}
