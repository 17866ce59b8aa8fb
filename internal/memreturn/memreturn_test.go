package memreturn

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const mib = 1 << 20

// looks feeds samples to a Returner with the defaults and says which looks returned memory.
func looks(r *Returner, samples ...Sample) []int {
	var at []int
	for i, s := range samples {
		if r.look(s) {
			at = append(at, i)
		}
	}
	return at
}

// busyThenQuiet is a busy spell (100 MiB between two looks) then n quiet looks (1 MiB each),
// with spare heap memory held.
func busyThenQuiet(n int, spare uint64) []Sample {
	s := []Sample{{Allocs: 0}, {Allocs: 100 * mib, Spare: spare}}
	for i := 1; i <= n; i++ {
		s = append(s, Sample{Allocs: 100*mib + uint64(i)*mib, Spare: spare})
	}
	return s
}

func TestReturnsOnceQuietAfterABusySpell(t *testing.T) {
	r := &Returner{}
	// Looks 0 (the first, nothing to compare), 1 (busy), 2–4 (quiet): the third quiet look returns.
	if got := looks(r, busyThenQuiet(6, 64*mib)...); len(got) != 1 || got[0] != 4 {
		t.Fatalf("returned at looks %v, want [4]: after three quiet looks, once", got)
	}
}

func TestNeverReturnsWithoutABusySpell(t *testing.T) {
	r := &Returner{}
	var s []Sample
	for i := range 10 { // quiet from the start: a process idle since its start-up returned its garbage
		s = append(s, Sample{Allocs: uint64(i) * mib, Spare: 64 * mib})
	}
	if got := looks(r, s...); len(got) != 0 {
		t.Fatalf("returned at looks %v without a busy spell", got)
	}
}

func TestBusyLookStartsTheQuietCountAgain(t *testing.T) {
	r := &Returner{}
	s := busyThenQuiet(2, 64*mib)                             // looks 0–3: busy, two quiet
	s = append(s, Sample{Allocs: 200 * mib, Spare: 64 * mib}) // look 4: busy again
	for i := 1; i <= 3; i++ {                                 // looks 5–7: quiet
		s = append(s, Sample{Allocs: 200*mib + uint64(i)*mib, Spare: 64 * mib})
	}
	if got := looks(r, s...); len(got) != 1 || got[0] != 7 {
		t.Fatalf("returned at looks %v, want [7]: three quiet looks after the last busy one", got)
	}
}

func TestNotWhileLittleIsSpare(t *testing.T) {
	r := &Returner{}
	s := busyThenQuiet(4, 8*mib) // quiet long enough, but only 8 MiB spare
	if got := looks(r, s...); len(got) != 0 {
		t.Fatalf("returned at looks %v with 8 MiB spare", got)
	}
	// Still quiet, more garbage held now (a collection freed spans): it returns then.
	last := s[len(s)-1]
	if !r.look(Sample{Allocs: last.Allocs + mib, Spare: 40 * mib}) {
		t.Fatal("no return once 40 MiB were spare after the busy spell")
	}
}

func TestOneReturnPerBusySpell(t *testing.T) {
	r := &Returner{}
	s := busyThenQuiet(3, 64*mib)
	for i := 4; i <= 12; i++ { // idle on, garbage held again: no second return without new work
		s = append(s, Sample{Allocs: 100*mib + uint64(i)*mib, Spare: 64 * mib})
	}
	if got := looks(r, s...); len(got) != 1 {
		t.Fatalf("returned at looks %v, want one return for one busy spell", got)
	}
}

func TestSettingsOverrideTheDefaults(t *testing.T) {
	r := &Returner{QuietAlloc: 512 << 10, QuietLooks: 1, MinSpare: mib}
	// 1 MiB between looks is busy under a 512 KiB quiet limit; then one quiet look returns.
	got := looks(r, Sample{}, Sample{Allocs: mib, Spare: 2 * mib}, Sample{Allocs: mib + 100<<10, Spare: 2 * mib})
	if len(got) != 1 || got[0] != 2 {
		t.Fatalf("returned at looks %v, want [2]", got)
	}
}

// ReadRuntime reads this process's heap: what it allocates shows in Allocs; memory it held and
// dropped shows as spare once collected, and is gone from spare once returned to the OS.
func TestReadRuntimeSeesAllocationAndSpare(t *testing.T) {
	before := ReadRuntime()
	keep := make([][]byte, 0, 1024)
	for range 1024 {
		keep = append(keep, make([]byte, 64<<10)) // 64 MiB
	}
	after := ReadRuntime()
	if after.Allocs-before.Allocs < 64*mib {
		t.Fatalf("allocs moved by %d bytes after allocating 64 MiB", after.Allocs-before.Allocs)
	}
	runtime.GC() // 64 MiB live
	runtime.KeepAlive(keep)
	keep = nil
	runtime.GC() // now free spans, not yet returned (the scavenger returns a little at a time)
	dropped := ReadRuntime()
	if dropped.Spare < 32*mib {
		t.Fatalf("spare %d MiB after 64 MiB were dropped and collected", dropped.Spare/mib)
	}
	debug.FreeOSMemory()
	returned := ReadRuntime()
	if returned.Spare > dropped.Spare-32*mib {
		t.Fatalf("spare %d MiB after returning memory, %d MiB before", returned.Spare/mib, dropped.Spare/mib)
	}
}

func TestRunReturnsAndStops(t *testing.T) {
	var n atomic.Int64
	samples := busyThenQuiet(5, 64*mib)
	var i atomic.Int64
	r := &Returner{
		Every: time.Millisecond,
		Read: func() Sample {
			k := min(int(i.Add(1))-1, len(samples)-1)
			return samples[k]
		},
		Return: func() { n.Add(1) },
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	deadline := time.After(10 * time.Second)
	for n.Load() == 0 {
		select {
		case <-deadline:
			cancel()
			t.Fatal("Run never returned memory")
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	<-done
	if got := n.Load(); got != 1 {
		t.Fatalf("Run returned memory %d times for one busy spell", got)
	}
	// The stats count what Run did: every sample read was a look, one return of 64 MiB spare.
	st := r.Stats()
	if st.Looks != uint64(i.Load()) || st.Returns != 1 || st.Returned != 64*mib {
		t.Fatalf("stats %+v after %d reads, want every read a look, 1 return of %d bytes", st, i.Load(), 64*mib)
	}
	// /metrics shows the same.
	reg := prometheus.NewRegistry()
	if err := r.Register(reg); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf(`
# HELP t3code_mcp_memory_return_looks_total Looks at the Go heap by the return of spare memory after busy spells (one at start, then every 10 s).
# TYPE t3code_mcp_memory_return_looks_total counter
t3code_mcp_memory_return_looks_total %d
# HELP t3code_mcp_memory_returned_bytes_total The spare heap bytes those returns found (the OS may take back somewhat less).
# TYPE t3code_mcp_memory_returned_bytes_total counter
t3code_mcp_memory_returned_bytes_total %d
# HELP t3code_mcp_memory_returns_total Returns of the heap's spare memory to the OS once the process turned quiet after a busy spell.
# TYPE t3code_mcp_memory_returns_total counter
t3code_mcp_memory_returns_total 1
`, st.Looks, 64*mib)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}

// Run's first look is at its start, not a period later: /metrics shows a running Returner at
// once, and the first period is already measured against a baseline.
func TestRunLooksAtOnce(t *testing.T) {
	var reads atomic.Int64
	r := &Returner{Every: time.Hour, Read: func() Sample { reads.Add(1); return Sample{} }, Return: func() {}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	deadline := time.After(10 * time.Second)
	for r.Stats().Looks == 0 {
		select {
		case <-deadline:
			cancel()
			t.Fatal("Run did not look at its start")
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
	<-done
	if st := r.Stats(); st.Looks != 1 || reads.Load() != 1 || st.Returns != 0 {
		t.Fatalf("stats %+v, %d reads: want one look and no return within an hour's period", st, reads.Load())
	}
}
