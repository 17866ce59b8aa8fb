package watch

import (
	"fmt"
	"testing"
)

// The gone set keeps the newest limit threads. A thread archived, unarchived
// and archived again is one entry, as new as its last archive: a stale entry of
// its first archive must not evict it early (the set once kept an order slice
// with such entries).
func TestGoneSetEvictsOldestOnly(t *testing.T) {
	s := newGoneSet(3)
	s.add("a", GoneThread{Where: "archive"})
	s.drop("a") // unarchived
	s.add("b", GoneThread{Where: "archive"})
	s.add("a", GoneThread{Where: "archive", ProjectID: "p"}) // archived again: newest
	s.add("c", GoneThread{Where: "removed"})
	s.add("d", GoneThread{Where: "archive"}) // one too many: b, the oldest, goes
	if _, ok := s.get("b"); ok {
		t.Fatal("the oldest entry was kept")
	}
	for _, id := range []string{"a", "c", "d"} {
		if _, ok := s.get(id); !ok {
			t.Fatalf("%s was evicted before older entries", id)
		}
	}
	if g, _ := s.get("a"); g.ProjectID != "p" {
		t.Fatalf("a = %+v, want its last record", g)
	}
	if s.len() != 3 || len(s.byID) != 3 {
		t.Fatalf("%d in order, %d by id, want 3", s.len(), len(s.byID))
	}
	// Churn far past the limit stays bounded.
	for i := range 1000 {
		id := fmt.Sprint("t", i)
		s.add(id, GoneThread{Where: "archive"})
		if i%2 == 0 {
			s.drop(id)
		}
	}
	if s.len() > 3 || len(s.byID) != s.len() {
		t.Fatalf("after churn: %d in order, %d by id", s.len(), len(s.byID))
	}
}
