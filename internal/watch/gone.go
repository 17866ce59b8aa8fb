package watch

import "container/list"

// GoneThread is what the watcher remembers of a thread that left the list: why
// ("archive" or "removed") and enough to tell whether a client may see it (its
// project) and to name it.
type GoneThread struct {
	Where     string // "archive" or "removed"
	ProjectID string
	Title     string
}

// goneLimit bounds the memory of threads that left the list.
const goneLimit = 10_000

// goneSet remembers the threads that left the list, the newest limit of them:
// a thread seen again (unarchived) is dropped from it at once, and the oldest
// entry goes when one more would pass the limit. One list element per thread,
// so a thread archived, unarchived and archived again is one entry, never a
// stale one that would evict it early.
type goneSet struct {
	limit int
	byID  map[string]*list.Element // of goneEntry
	order *list.List               // oldest first
}

type goneEntry struct {
	id string
	GoneThread
}

func newGoneSet(limit int) *goneSet {
	return &goneSet{limit: limit, byID: map[string]*list.Element{}, order: list.New()}
}

func (s *goneSet) add(id string, g GoneThread) {
	if el, ok := s.byID[id]; ok {
		el.Value = goneEntry{id, g}
		s.order.MoveToBack(el)
		return
	}
	s.byID[id] = s.order.PushBack(goneEntry{id, g})
	for s.order.Len() > s.limit {
		old := s.order.Front()
		s.order.Remove(old)
		delete(s.byID, old.Value.(goneEntry).id)
	}
}

func (s *goneSet) drop(id string) {
	if el, ok := s.byID[id]; ok {
		s.order.Remove(el)
		delete(s.byID, id)
	}
}

func (s *goneSet) get(id string) (GoneThread, bool) {
	el, ok := s.byID[id]
	if !ok {
		return GoneThread{}, false
	}
	return el.Value.(goneEntry).GoneThread, true
}

func (s *goneSet) len() int { return s.order.Len() }
