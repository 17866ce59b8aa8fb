package memreturn

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"golang.org/x/sys/unix"
)

// tightHeap is a Heap in its tight state without a Settle (no collection, no return): Check's rule
// alone, on collections counted by the test. Its own percent is the process's, so a loosening
// leaves the test process as it was.
func tightHeap(t *testing.T, cycles func() uint64) *Heap {
	t.Helper()
	own := debug.SetGCPercent(100)
	debug.SetGCPercent(own)
	t.Cleanup(func() { debug.SetGCPercent(own) })
	h := &Heap{Cycles: cycles}
	h.reserve, h.tight, h.own, h.percent = 16<<20, true, own, 25
	h.cycles = cycles()
	return h
}

func TestCheckLoosensOnThreeCollectionsWithinTheWindow(t *testing.T) {
	var cycles uint64 = 7
	h := tightHeap(t, func() uint64 { return cycles })
	t0 := time.Unix(1000, 0)
	if h.Check(t0) {
		t.Fatal("loosened with no collection")
	}
	cycles += 2 // two collections: a burst of calls went through the reserve twice
	if h.Check(t0.Add(time.Second)) {
		t.Fatal("loosened after two collections")
	}
	cycles++ // the third 10 s after them: the first two are out of the window
	if h.Check(t0.Add(11 * time.Second)) {
		t.Fatal("loosened with two collections 10 s before")
	}
	cycles++ // a fourth 5 s later: two in the window
	if h.Check(t0.Add(16 * time.Second)) {
		t.Fatal("loosened with two collections in the window")
	}
	cycles++ // and a fifth 4 s after that: three within 10 s, busy
	if !h.Check(t0.Add(20 * time.Second)) {
		t.Fatal("still tight after three collections within 10 s")
	}
	if tight, _ := h.Tight(); tight || h.Stats().Loosens != 1 {
		t.Fatalf("tight %v, loosens %d after loosening", tight, h.Stats().Loosens)
	}
	cycles += 5 // loose: collections no longer count
	if h.Check(t0.Add(21 * time.Second)) {
		t.Fatal("loosened twice")
	}
}

func TestCheckLoosensOnThreeCollectionsInOneLook(t *testing.T) {
	var cycles uint64
	h := tightHeap(t, func() uint64 { return cycles })
	cycles += 3
	if !h.Check(time.Unix(1000, 0)) {
		t.Fatal("still tight after three collections in one look")
	}
	if got := readUint64("/gc/gogc:percent"); int(got) != h.own {
		t.Fatalf("GC percent %d after loosening, want the process's own %d", got, h.own)
	}
}

// threadMinorFaults is the calling thread's minor page faults so far (RUSAGE_THREAD: no other
// thread's).
func threadMinorFaults(t *testing.T) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// TestSettleKeepsTheReserveMapped: after a Settle with a reserve, allocating less than the reserve
// in small pieces finds mapped pages (few faults), and the collector's goal is the live heap plus
// the reserve; after a plain return (no reserve) the same allocation faults on about every page.
func TestSettleKeepsTheReserveMapped(t *testing.T) {
	const reserve = 16 << 20
	const alloc = 8 << 20 // half the reserve
	pages := int64(alloc / os.Getpagesize())

	own := debug.SetGCPercent(100)
	debug.SetGCPercent(own)
	t.Cleanup(func() { debug.SetGCPercent(own) })
	ballast := make([][]byte, 64) // a live heap of 64 MiB: the reserve's goal is 25 % of it
	for i := range ballast {
		ballast[i] = make([]byte, 1<<20)
	}

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var sink [][]byte
	allocFaults := func() int64 {
		before := threadMinorFaults(t)
		sink = make([][]byte, 0, alloc/warmPiece)
		for range alloc / warmPiece {
			p := make([]byte, warmPiece)
			for off := 0; off < warmPiece; off += 4096 {
				p[off] = 1
			}
			sink = append(sink, p)
		}
		n := threadMinorFaults(t) - before
		sink = nil
		return n
	}
	// median of three rounds: a round's count also holds whatever else the runtime did on this
	// thread meanwhile.
	median := func(h *Heap) int64 {
		var rounds []int64
		for range 3 {
			h.Settle()
			rounds = append(rounds, allocFaults())
		}
		h.Loosen()
		slices.Sort(rounds)
		return rounds[1]
	}

	plain := median(&Heap{})

	h := &Heap{}
	h.SetReserve(reserve)
	h.Settle()
	tight, percent := h.Tight()
	if live := readUint64("/gc/heap/live:bytes"); !tight || percent < 10 || uint64(percent) > reserve*100/(live*9/10) {
		t.Fatalf("after Settle: tight %v at %d %%, want about %d %% (a 16 MiB reserve over a %d MiB live heap)",
			tight, percent, reserve*100/live, live>>20)
	}
	if got := readUint64("/gc/gogc:percent"); int(got) != percent {
		t.Fatalf("the runtime's GC percent is %d, the Heap says %d", got, percent)
	}
	h.Loosen()
	if got := readUint64("/gc/gogc:percent"); int(got) != own {
		t.Fatalf("GC percent %d after Loosen, want the process's own %d", got, own)
	}
	warmed := median(h)
	runtime.KeepAlive(ballast)

	t.Logf("faults allocating %d pages: %d after a plain return, %d with the reserve", pages, plain, warmed)
	if plain < pages/2 {
		t.Fatalf("a plain return: %d faults for %d new pages; the test no longer sees returned memory", plain, pages)
	}
	if warmed > plain-pages/2 {
		t.Fatalf("with the reserve: %d faults for %d pages, against %d after a plain return: the reserve is not mapped", warmed, pages, plain)
	}
}

// TestRunLoosensAndTightensAgain: a Returner with a Heap checks it between its looks; three
// collections while tight end the tight goal at the next check, and the next quiet spell returns
// and settles the heap again even with little spare (a busy spell the reserve's goal could not
// hold). /metrics shows the loosening and the tight percent.
func TestRunLoosensAndTightensAgain(t *testing.T) {
	var cycles atomic.Uint64
	h := tightHeap(t, cycles.Load)
	reg := prometheus.NewRegistry()
	var settled atomic.Int64
	r := &Returner{
		Every: 5 * time.Millisecond, CheckEvery: time.Millisecond, Heap: h,
		Read:   func() Sample { return Sample{Allocs: 1 << 20, Spare: 1 << 20} }, // quiet, little spare
		Return: func() { settled.Add(1) },
	}
	if err := r.Register(reg); err != nil {
		t.Fatal(err)
	}
	gauge := func(want string) {
		t.Helper()
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "t3code_mcp_memory_heap_loosens_total", "t3code_mcp_memory_heap_reserve_gc_percent"); err != nil {
			t.Fatal(err)
		}
	}
	gauge(`
# HELP t3code_mcp_memory_heap_loosens_total Busy spells that gave the collector back its own goal (GOGC) after the warm reserve's tighter one.
# TYPE t3code_mcp_memory_heap_loosens_total counter
t3code_mcp_memory_heap_loosens_total 0
# HELP t3code_mcp_memory_heap_reserve_gc_percent The GC percent set while quiet so that the heap cycles inside its warm reserve; 0 while busy or without a reserve.
# TYPE t3code_mcp_memory_heap_reserve_gc_percent gauge
t3code_mcp_memory_heap_reserve_gc_percent 25
`)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// Quiet looks alone, tight: no return (nothing was busy).
	time.Sleep(50 * time.Millisecond)
	if settled.Load() != 0 {
		t.Fatal("returned without a busy spell")
	}
	cycles.Add(LoosenCollections)
	deadline := time.After(10 * time.Second)
	for settled.Load() == 0 {
		select {
		case <-deadline:
			t.Fatalf("no return after the loosening: stats %+v", h.Stats())
		case <-time.After(time.Millisecond):
		}
	}
	if tight, _ := h.Tight(); tight || h.Stats().Loosens != 1 {
		t.Fatalf("tight %v, %d loosens after three collections in a check", tight, h.Stats().Loosens)
	}
	gauge(`
# HELP t3code_mcp_memory_heap_loosens_total Busy spells that gave the collector back its own goal (GOGC) after the warm reserve's tighter one.
# TYPE t3code_mcp_memory_heap_loosens_total counter
t3code_mcp_memory_heap_loosens_total 1
# HELP t3code_mcp_memory_heap_reserve_gc_percent The GC percent set while quiet so that the heap cycles inside its warm reserve; 0 while busy or without a reserve.
# TYPE t3code_mcp_memory_heap_reserve_gc_percent gauge
t3code_mcp_memory_heap_reserve_gc_percent 0
`)
}

// SetReserve(0) turns the reserve off at once: a tight heap gets the process's own goal back.
func TestSetReserveZeroLoosens(t *testing.T) {
	h := tightHeap(t, func() uint64 { return 0 })
	h.SetReserve(0)
	if tight, _ := h.Tight(); tight || h.Stats().Loosens != 1 {
		t.Fatalf("tight %v, %d loosens after SetReserve(0)", tight, h.Stats().Loosens)
	}
	if got := readUint64("/gc/gogc:percent"); int(got) != h.own {
		t.Fatalf("GC percent %d after SetReserve(0), want the process's own %d", got, h.own)
	}
}
