//go:build linux

package watch

import (
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/t3code-mcp/t3code-mcp/gen/t3rpc"
)

// threadMinorFaults is the calling thread's minor page faults so far (RUSAGE_THREAD: no other
// thread's).
func threadMinorFaults(t *testing.T) int64 {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}

// TestDecodeItemsWritesANewSliceFirst: a lagging chunk's items decoded into a new slice, on memory
// the process has just returned to the OS (as start-up does), take the page faults of writing
// the slice once: one per page (and, under -race, the detector's shadow pages). Without
// writeFirst, decodeItem's reads map the zero page first and each page faults twice, the second a
// copy-on-write that flushes every CPU's TLB: a page more per page.
func TestDecodeItemsWritesANewSliceFirst(t *testing.T) {
	const n = 2048 // 2 MiB of items, far past the pool's reach after the collections below
	values := shellItems(n, n)
	pages := int64(n * int(unsafe.Sizeof(t3rpc.ShellStreamItem{})) / os.Getpagesize())

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// median is the median of five rounds of f on freshly returned memory: a round's count also
	// holds faults of whatever else the runtime does on this thread meanwhile, and now and then a
	// round finds some of its pages still mapped.
	median := func(f func()) int64 {
		var rounds []int64
		for range 5 {
			runtime.GC()
			debug.FreeOSMemory() // empties itemPool (two collections) and unmaps the free pages
			before := threadMinorFaults(t)
			f()
			rounds = append(rounds, threadMinorFaults(t)-before)
		}
		slices.Sort(rounds)
		return rounds[len(rounds)/2]
	}
	// What writing such a slice once costs here: the floor.
	written := median(func() {
		s := make([]t3rpc.ShellStreamItem, n)
		for i := range s {
			s[i].Sequence.Value = int64(i)
		}
	})
	var rs recentStrings
	decoded := median(func() {
		p, err := decodeItems(values, &rs)
		if err != nil {
			t.Fatal(err)
		}
		if len(*p) != n || (*p)[n-1].Thread.Value.ID == "" {
			t.Fatalf("decoded %d items, the last %+v", len(*p), (*p)[n-1].Thread.Value)
		}
		*p = nil // not back to the pool: the next round must allocate anew
	})
	t.Logf("%d pages of items: %d minor faults to write them, %d to decode into them", pages, written, decoded)
	if decoded > written+pages/2 {
		t.Errorf("decoding %d items into a new slice of %d pages took %d page faults, writing it %d: its pages are read before they are written (writeFirst)", n, pages, decoded, written)
	}
}
