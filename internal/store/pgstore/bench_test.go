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

// BenchmarkRecord32Claimed: claim 32 heads, then record them delivered in one transaction (a
// replica's delivery path).
func BenchmarkRecord32Claimed(b *testing.B) {
	s, _ := open(b)
	const n = 32
	i := 0
	for b.Loop() {
		b.StopTimer()
		evs := make([]store.Event, n)
		for j := range evs {
			evs[j] = storetest.Ev(fmt.Sprintf("e%d", i+j), fmt.Sprintf("m/t%d", j))
		}
		if err := s.Commit(store.Batch{Events: evs}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		ops := make([]store.Op, n)
		for j := range evs {
			e, err := s.Get(evs[j].ID)
			if err != nil {
				b.Fatal(err)
			}
			if ok, err := s.Claim(e.Seq, "bench", time.Minute); err != nil || !ok {
				b.Fatal(ok, err)
			}
			ops[j] = store.Op{ID: e.ID, Kind: store.OpDelivered, At: time.Now()}
		}
		if _, err := s.Record(ops); err != nil {
			b.Fatal(err)
		}
		i += n
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "events/s")
}
