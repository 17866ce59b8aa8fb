package pgstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
	"github.com/t3code-mcp/t3code-mcp/internal/store/storetest"
)

// benchCommit commits n events per transaction, each in a stream of its own.
func benchCommit(b *testing.B, n int) {
	s, _ := open(b)
	i := 0
	for b.Loop() {
		evs := make([]store.Event, n)
		for j := range evs {
			evs[j] = storetest.Ev(fmt.Sprintf("e%d", i), fmt.Sprintf("m/t%d", i%100))
			i++
		}
		if err := s.Commit(store.Batch{Events: evs, Detector: map[string][]byte{"m\x00t": []byte(`{}`)}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "events/s")
}

func BenchmarkCommitEvent(b *testing.B)    { benchCommit(b, 1) }
func BenchmarkCommitEvents64(b *testing.B) { benchCommit(b, 64) }

// BenchmarkRecord32Claimed: claim 32 heads (one ClaimHeads), then record them delivered in one
// transaction (a replica's delivery path).
func BenchmarkRecord32Claimed(b *testing.B) {
	s, _ := open(b)
	const n = 32
	streams := make([]string, n)
	for j := range streams {
		streams[j] = fmt.Sprintf("m/t%d", j)
	}
	i := 0
	for b.Loop() {
		b.StopTimer()
		evs := make([]store.Event, n)
		for j := range evs {
			evs[j] = storetest.Ev(fmt.Sprintf("e%d", i+j), streams[j])
		}
		if err := s.Commit(store.Batch{Events: evs}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		cs, err := s.ClaimHeads(streams, "bench", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		ops := make([]store.Op, 0, n)
		for _, c := range cs {
			if !c.Claimed {
				b.Fatalf("%s not claimed", c.Stream)
			}
			ops = append(ops, store.Op{ID: c.Event.ID, Kind: store.OpDelivered, At: time.Now()})
		}
		if _, err := s.Record(ops); err != nil {
			b.Fatal(err)
		}
		i += n
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkClaimHeadsAgain32: ask again for 32 heads one holds (a replica's loop asking for heads
// that still wait for a slot, or renewing claims it made a moment ago).
func BenchmarkClaimHeadsAgain32(b *testing.B) {
	s, _ := open(b)
	const n = 32
	streams := make([]string, n)
	evs := make([]store.Event, n)
	for j := range streams {
		streams[j] = fmt.Sprintf("m/t%d", j)
		evs[j] = storetest.Ev(fmt.Sprintf("e%d", j), streams[j])
	}
	if err := s.Commit(store.Batch{Events: evs}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		cs, err := s.ClaimHeads(streams, "bench", time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range cs {
			if !c.Claimed {
				b.Fatalf("%s not claimed", c.Stream)
			}
		}
	}
}
