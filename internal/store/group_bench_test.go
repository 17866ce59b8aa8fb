package store

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// BenchmarkChunkBesideRecords: 100 machines' chunks (one event and one detector state each)
// committed through the group while the outbox records a backlog's outcomes (Record of 2,048
// retries at a time, over and over). One op is one chunk; the figures are a chunk's commit time
// (Commit called → durable) as its machine's watcher waits for it before the Ack.
func BenchmarkChunkBesideRecords(b *testing.B) {
	s, err := Open(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	g := NewGroup(s)
	const recorded = 2048
	seed := make([]Event, recorded)
	ops := make([]Op, recorded)
	for i := range seed {
		id := fmt.Sprintf("r%04d", i)
		seed[i] = Event{ID: id, Stream: "m/" + id, Body: []byte(`{"type":"thread.completed"}`), CreatedAt: time.Now()}
		ops[i] = Op{ID: id, Kind: OpRetry, Next: time.Now(), Error: "HTTP 503"}
	}
	if err := s.Commit(Batch{Events: seed}); err != nil {
		b.Fatal(err)
	}
	stop := make(chan struct{})
	var recorder sync.WaitGroup
	recorder.Add(1)
	go func() {
		defer recorder.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := g.Record(ops); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	const machines = 100
	per := (b.N + machines - 1) / machines
	lat := make([][]time.Duration, machines)
	b.ResetTimer()
	var wg sync.WaitGroup
	for m := range machines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				id := fmt.Sprintf("m%03d-%d", m, i)
				start := time.Now()
				err := g.Commit(Batch{Detector: map[string][]byte{fmt.Sprintf("m%03d\x00t", m): []byte(`{"latest":"` + id + `"}`)},
					Events: []Event{{ID: id, Stream: fmt.Sprintf("m%03d/t", m), Body: []byte(`{"type":"thread.completed"}`), CreatedAt: start}}})
				if err != nil {
					b.Error(err)
					return
				}
				lat[m] = append(lat[m], time.Since(start))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(stop)
	recorder.Wait()
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	q := func(p float64) float64 { return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / 1e6 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(len(all))/b.Elapsed().Seconds(), "chunks/s")
}
