package events

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"
)

func cachedState(thread string, n int) cached {
	run := fmt.Sprintf("run:thread:%s:ordinal:%d", thread, n)
	s := seen{Latest: run, Active: run, UpdatedAt: fmt.Sprintf("2026-12-03T01:00:%02d.000Z", n%60), Gen: uint64(n)}
	switch n % 4 {
	case 1:
		s.Active, s.Settled = "", true
	case 2:
		s.Active, s.Open, s.Question, s.Asked = "run:other", []string{"run:a", ""}, "q1", []string{"q0", "q1"}
		s.Lookup, s.Gap, s.GapAfter = true, true, "run:before"
	case 3:
		s.Lookup = true // only a flag differs from case 0's strings
	}
	return cached{s: s, rowAt: time.Unix(1764723600+int64(n), int64(n)*1000)}
}

func equalCached(a, b cached) bool {
	return a.s.equal(b.s) && a.rowAt.Equal(b.rowAt)
}

// TestSeenCacheCollidingIDs: with every id hashing alike, each thread still gets its own state,
// whichever of them the index holds, and deleting the one it holds leaves the others found.
func TestSeenCacheCollidingIDs(t *testing.T) {
	c := newSeenCache()
	c.hashMask = 0 // every id collides: the index holds one entry, the others are clashes
	for i, id := range []string{"a", "b", "c"} {
		c.put(key("m", id), cachedState(id, i))
	}
	for i, id := range []string{"a", "b", "c"} {
		got, ok := c.get(key("m", id))
		if !ok || !equalCached(got, cachedState(id, i)) {
			t.Fatalf("%s: %+v %v, want %+v", id, got, ok, cachedState(id, i))
		}
	}
	c.delete(key("m", "a")) // the index's entry
	if _, ok := c.get(key("m", "a")); ok {
		t.Fatal("a found after its delete")
	}
	c.put(key("m", "d"), cachedState("d", 3)) // takes the index's free hash, and a's slot
	c.delete(key("m", "c"))                   // a clash
	for id, n := range map[string]int{"b": 1, "d": 3} {
		if got, ok := c.get(key("m", id)); !ok || !equalCached(got, cachedState(id, n)) {
			t.Fatalf("%s: %+v %v, want %+v", id, got, ok, cachedState(id, n))
		}
	}
	for _, id := range []string{"a", "c", "e"} {
		if _, ok := c.get(key("m", id)); ok {
			t.Fatalf("%s found, never put or deleted", id)
		}
	}
	if n := c.len(); n != 2 {
		t.Fatalf("len %d, want 2", n)
	}
}

// TestSeenCacheReusesDeletedEntries: a pruned thread's slot goes to the next thread put, which
// does not inherit anything of the state it held, and the table does not grow.
func TestSeenCacheReusesDeletedEntries(t *testing.T) {
	c := newSeenCache()
	for i := 0; i < 100; i++ {
		c.put(key("m", fmt.Sprint("old-", i)), cachedState("old", 2))
	}
	for i := 0; i < 100; i++ {
		c.delete(key("m", fmt.Sprint("old-", i)))
		id := fmt.Sprint("new-", i)
		c.put(key("m", id), cachedState(id, 1))
	}
	tb := c.table("m")
	if len(tb.entries) != 100 || len(tb.free) != 0 {
		t.Fatalf("%d entries (%d free) for 100 threads, want the deleted ones reused", len(tb.entries), len(tb.free))
	}
	for i := 0; i < 100; i++ {
		if _, ok := c.get(key("m", fmt.Sprint("old-", i))); ok {
			t.Fatalf("old-%d found after its delete", i)
		}
		id := fmt.Sprint("new-", i)
		if got, ok := c.get(key("m", id)); !ok || !equalCached(got, cachedState(id, 1)) {
			t.Fatalf("%s: %+v %v, want %+v", id, got, ok, cachedState(id, 1))
		}
	}
	for i := 0; i < 100; i++ {
		c.delete(key("m", fmt.Sprint("new-", i)))
	}
	if c.table("m") != nil {
		t.Fatal("a machine with no state left keeps its table")
	}
}

// TestSeenCacheCompactsAndKeepsViews: a thread whose updatedAt moves at every row leaves its old
// records as garbage; the arena is rebuilt once garbage is over half of it, so it stays within
// about twice the live bytes, and the strings handed out before stay what they were (views of
// the old arena, never written again).
func TestSeenCacheCompactsAndKeepsViews(t *testing.T) {
	c := newSeenCache()
	for i := 0; i < 50; i++ {
		id := fmt.Sprint("thread-", i)
		c.put(key("m", id), cachedState(id, 0))
	}
	type held struct {
		v    cached
		want cached
	}
	var views []held
	compactions := 0
	for n := 1; n < 5000; n++ {
		id := fmt.Sprint("thread-", n%50)
		tb := c.table("m")
		before := len(tb.arena)
		c.put(key("m", id), cachedState(id, n))
		if len(tb.arena) < before {
			compactions++
		}
		if len(tb.arena) > 2*tb.live+compactMinArena+512 {
			t.Fatalf("row %d: arena %d bytes for %d live", n, len(tb.arena), tb.live)
		}
		if n%97 == 0 {
			v, _ := c.get(key("m", id))
			views = append(views, held{v, cachedState(id, n)})
		}
	}
	if compactions == 0 {
		t.Fatal("the arena was never compacted")
	}
	for _, h := range views {
		if !equalCached(h.v, h.want) {
			t.Fatalf("a state read before a compaction changed: %+v, want %+v", h.v.s, h.want.s)
		}
	}
	for i := 0; i < 50; i++ {
		id := fmt.Sprint("thread-", i)
		last := 4999 - (4999-i)%50 // the last n with n%50 == i
		if got, ok := c.get(key("m", id)); !ok || !equalCached(got, cachedState(id, last)) {
			t.Fatalf("%s: %+v %v, want %+v", id, got.s, ok, cachedState(id, last).s)
		}
	}
}

// TestSeenCacheMatchesAMap: random puts, deletes and machine drops, with few hash values (many
// collisions), give what a map[string]cached gives.
func TestSeenCacheMatchesAMap(t *testing.T) {
	c := newSeenCache()
	c.hashMask = 3 // four hash values for 40 ids
	want := map[string]cached{}
	rng := rand.New(rand.NewPCG(1, 2))
	machines := []string{"m1", "m2", "m3"}
	for step := 0; step < 20000; step++ {
		m := machines[rng.IntN(len(machines))]
		id := fmt.Sprint("t", rng.IntN(40))
		k := key(m, id)
		switch r := rng.IntN(100); {
		case r < 70:
			v := cachedState(id, rng.IntN(1000))
			c.put(k, v)
			want[k] = v
		case r < 98:
			c.delete(k)
			delete(want, k)
		default:
			c.dropMachine(m)
			for wk := range want {
				if got, _, _ := splitKey(wk); got == m {
					delete(want, wk)
				}
			}
		}
		if step%100 != 0 {
			continue
		}
		for _, m := range machines {
			for i := 0; i < 40; i++ {
				k := key(m, fmt.Sprint("t", i))
				got, ok := c.get(k)
				w, wok := want[k]
				if ok != wok || ok && (!equalCached(got, w) || !reflect.DeepEqual(got.s.Open, w.s.Open)) {
					t.Fatalf("step %d, %q: %+v %v, want %+v %v", step, k, got, ok, w, wok)
				}
			}
		}
		if c.len() != len(want) {
			t.Fatalf("step %d: len %d, want %d", step, c.len(), len(want))
		}
	}
}
