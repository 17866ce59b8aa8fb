package idindex

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestIndexMatchesAMap adds and removes ids at random, the owner's slots kept as a table with a
// free list as the watcher's rows and the detector's states keep them, and after every step
// compares Find for every id with a plain map. It runs with the real hash and with masks under
// which ids collide (all of them, or four hash values for 40 ids), so the side map's adds,
// finds and removes, and a hash freed while its clashes stay, are all checked.
func TestIndexMatchesAMap(t *testing.T) {
	for _, mask := range []uint64{^uint64(0), 0, 3} {
		t.Run(fmt.Sprintf("mask-%x", mask), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(1, 2))
			x := Make(0)
			x.SetHashMask(mask)
			var ids []string // the owner's id at each slot ("" free)
			var free []uint32
			idAt := func(s uint32) string { return ids[s] }
			want := map[string]uint32{}
			for step := range 3000 {
				id := fmt.Sprintf("thread-%d", rnd.IntN(40))
				if s, had := want[id]; had {
					if rnd.IntN(2) == 0 {
						x.Remove(id, s)
						ids[s] = ""
						free = append(free, s)
						delete(want, id)
					}
				} else {
					var s uint32
					if n := len(free); n > 0 {
						s, free = free[n-1], free[:n-1]
					} else {
						s = uint32(len(ids))
						ids = append(ids, "")
					}
					ids[s] = id
					x.Add(id, s)
					want[id] = s
				}
				for i := range 40 {
					id := fmt.Sprintf("thread-%d", i)
					s, ok := x.Find(id, idAt)
					ws, wok := want[id]
					if ok != wok || (ok && s != ws) {
						t.Fatalf("step %d: Find(%s) = %d %v, want %d %v", step, id, s, ok, ws, wok)
					}
				}
				if x.Len() != len(want) {
					t.Fatalf("step %d: Len %d, want %d", step, x.Len(), len(want))
				}
			}
			if mask != ^uint64(0) && x.Clashes() == 0 {
				t.Fatal("no id went to the side map")
			}
			x.Reset(0)
			if x.Len() != 0 {
				t.Fatalf("Len %d after Reset", x.Len())
			}
			if _, ok := x.Find("thread-1", idAt); ok {
				t.Fatal("thread-1 found after Reset")
			}
		})
	}
}

// TestFindDoesNotAllocate: a lookup with an id built on the caller's stack allocates nothing
// (the id must not escape through Find: the detector looks its states up by keys it builds).
func TestFindDoesNotAllocate(t *testing.T) {
	x := Make(1)
	ids := []string{"thread-7"}
	x.Add("thread-7", 0)
	idAt := func(s uint32) string { return ids[s] }
	buf := []byte("m\x00thread-7")
	allocs := testing.AllocsPerRun(100, func() {
		id := string(buf[2:]) // a conversion that stays on the stack unless id escapes
		if _, ok := x.Find(id, idAt); !ok {
			t.Fatal("thread-7 not found")
		}
	})
	if allocs != 0 {
		t.Fatalf("Find allocates %.1f times per lookup", allocs)
	}
}

func BenchmarkFind(b *testing.B) {
	x := Make(1000)
	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprintf("thread-%d", i)
		x.Add(ids[i], uint32(i))
	}
	idAt := func(s uint32) string { return ids[s] }
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, ok := x.Find(ids[i%1000], idAt); !ok {
			b.Fatal("not found")
		}
	}
}
