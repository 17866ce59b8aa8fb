package store

import (
	"bytes"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"
)

// BenchmarkGrowingCommit: 100 machines' chunks (one event of a ~1.2 KB body and one detector
// state each) committed through the group, so the file grows as in the latency phase (its
// high-water mark moves up into bbolt's ftruncated tail), with the written headroom (headroom.go)
// and without. One op is one chunk; p50-ms / p99-ms are a chunk's Commit (called → durable).
func BenchmarkGrowingCommit(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("headroom=%v", on), func(b *testing.B) {
			s, err := Open(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			s.headroom.off = !on
			g := NewGroup(s)
			body := append([]byte(`{"type":"thread.completed","reply":"`), bytes.Repeat([]byte("x"), 1200)...)
			body = append(body, `"}`...)
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
							Events: []Event{{ID: id, Stream: fmt.Sprintf("m%03d/t", m), Body: body, CreatedAt: start}}})
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
			var all []time.Duration
			for _, l := range lat {
				all = append(all, l...)
			}
			sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
			q := func(p float64) float64 { return float64(all[min(len(all)-1, int(p*float64(len(all))))]) / 1e6 }
			b.ReportMetric(q(0.5), "p50-ms")
			b.ReportMetric(q(0.99), "p99-ms")
			b.ReportMetric(float64(len(all))/b.Elapsed().Seconds(), "chunks/s")
		})
	}
}
