package store

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// BenchmarkGroupCommitPerEvent is the store's part of one transition at scale, as the throughput
// phase makes it: a state file holding 100 machines × 1,000 watched threads' detector states;
// every machine's watcher commits, through the group, a run's end on one of its threads (the
// thread's state and the event; a run's start commits nothing since 97e8696), one after the
// other; the outbox records each event's delivery (Group.Record) as the group hands it over
// (OnDurable). One op is one event.
// cpu-µs/event is the process's CPU (user + system) per event, pages/event the bbolt pages
// written per event (the leaf pages a transaction dirtied, each spilled, written and fsynced).
func BenchmarkGroupCommitPerEvent(b *testing.B) { benchGroupCommitPerEvent(b, 100) }

// BenchmarkGroupCommitPerEventFew is BenchmarkGroupCommitPerEvent with 4 machines committing at a
// time: transactions of a few events each, as the latency phase's 1,000 transitions/s make them
// (a handful of chunks waiting per fsync), where what a transaction costs whatever it holds
// (the leaf pages it reads and grows, its branch pages, its meta page) is paid by few events.
func BenchmarkGroupCommitPerEventFew(b *testing.B) { benchGroupCommitPerEvent(b, 4) }

// benchGroupCommitPerEvent is BenchmarkGroupCommitPerEvent with machines committing at a time
// (the state file holds 100 machines' states whatever the number).
func benchGroupCommitPerEvent(b *testing.B, machines int) {
	const stored, threads = 100, 1000
	dir := b.TempDir()
	s, err := Open(dir)
	if err != nil {
		b.Fatal(err)
	}
	state := []byte(`{"run":"0b5ab2c5-5d3c-4f55-9d5c-4a1b1d6e8f00","settled":true,"updatedAt":"2026-12-01T22:21:04.123Z"}`)
	// The states as a long-running connector has them: in their bucket.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		for m := range stored {
			for th := range threads {
				if err := tx.Bucket(bDetector).Put(fmt.Appendf(nil, "load-%03d\x00thread-%04d", m, th), state); err != nil {
					return err
				}
			}
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	g := NewGroup(s)
	body := []byte(`{"id":"evt","type":"thread.completed","machine":"load-007","thread_id":"thread-0001","summary":"Done: fix the flaky test"}`)

	var mu sync.Mutex
	var due []Op
	wake := make(chan struct{}, 1)
	g.OnDurable(func(evs []Event) {
		mu.Lock()
		for _, e := range evs {
			due = append(due, Op{ID: e.ID, Seq: e.Seq, Kind: OpDelivered, At: time.Now()}) // as the outbox records
		}
		mu.Unlock()
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	stop := make(chan struct{})
	recorded := make(chan struct{})
	go func() { // the outbox: every event delivered at once, its outcome recorded
		defer close(recorded)
		for {
			select {
			case <-wake:
			case <-stop:
				return
			}
			mu.Lock()
			ops := due
			due = nil
			mu.Unlock()
			if _, err := g.Record(ops); err != nil {
				b.Error(err)
				return
			}
		}
	}()

	per := (b.N + machines - 1) / machines
	before := s.db.Stats()
	cpu0 := rusageCPU(b)
	b.ResetTimer()
	var wg sync.WaitGroup
	for m := range machines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(m), 1))
			for i := range per {
				th := rng.IntN(threads)
				k := fmt.Sprintf("load-%03d\x00thread-%04d", m, th)
				// The detector's ids are hashes: random keys.
				ev := Event{ID: fmt.Sprintf("evt_%016x%08x", rng.Uint64(), i), Stream: fmt.Sprintf("load-%03d/thread-%04d", m, th), Body: body, CreatedAt: time.Now()}
				if err := g.Commit(Batch{Detector: map[string][]byte{k: state}, Events: []Event{ev}}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	cpu := rusageCPU(b) - cpu0
	after := s.db.Stats()
	close(stop)
	<-recorded
	events := float64(per * machines)
	d := after.TxStats.Sub(&before.TxStats)
	b.ReportMetric(float64(cpu.Microseconds())/events, "cpu-µs/event")
	b.ReportMetric(float64(d.GetWrite())/events, "pages/event")
	b.ReportMetric(events/b.Elapsed().Seconds(), "events/s")
}

// rusageCPU is the CPU time (user and system) the process has used so far.
func rusageCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
