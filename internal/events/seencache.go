package events

import (
	"encoding/binary"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/t3code-mcp/t3code-mcp/internal/idindex"
)

// seenCache holds the detector's cached states (see cached) of every tracked thread, keyed as
// the store keys them (key(machine, thread)), in a form the garbage collector does not walk.
//
// A map[string]cached of 100,000 threads was ~450,000 heap objects and 21 MB the collector
// scanned at every cycle (a key string, the boxed value, and its strings: ids, run ids, the
// updatedAt, each its own allocation; BenchmarkGCMarkDetectorState), the largest long-lived
// pointerful part of the connector's heap after the watcher's rows: a mark walked it all while
// a latency run's events and wakes waited. Here each machine's states are a few objects without
// pointers (seenTable), whatever the number of threads.
//
// A machine's table is guarded by that machine's lock (Detector.machineLock), which every
// reader and writer of its states holds; the tables' map is safe for concurrent use, so no
// lock is shared by all machines. (Under Detector.mu, which every machine's read loop took for
// every chunk, the loops queued behind whichever held it while its thread was off the CPU: a
// second of goroutines blocked per second at 1,000 transitions/s on two cores.)
type seenCache struct {
	machines sync.Map // machine name → *seenTable
	// hashMask is each new table's index's hash mask (idindex.Index.SetHashMask): all ones, but
	// in tests that force collisions with it.
	hashMask uint64
}

// seenTable is one machine's cached states. An entry's strings are a record in arena, an
// append-only byte slice: bytes below len(arena) are never written again, so the strings get
// hands out are views of it (no copy, no allocation) that stay valid however the table changes;
// a compaction builds a new arena and leaves the old one to the views still holding it.
type seenTable struct {
	// ids: the thread id → its entry, without a pointer per id; a hit is checked against the id
	// in the entry's record.
	ids     idindex.Index
	entries []seenEntry
	free    []uint32 // indexes of entries deleted, for reuse
	arena   []byte
	live    int // bytes of arena the entries' records take; the rest is garbage, left by changes
}

// span is a run of a table's arena.
type span struct{ off, n uint32 }

// seenEntry is one thread's cached state (seen and the row's UpdatedAt) without pointers.
//
// Its record (rec) holds the strings but UpdatedAt, each a uvarint length and its bytes: the
// thread id (to check an index hit), Latest, Active (left out when it is Latest:
// entryActiveIsLatest), Question, GapAfter, then Open and Asked, each a uvarint count and its
// items. They change a few times per run, and a change writes the record anew. UpdatedAt changes
// at every row of a thread (each step of a run) and has a span of its own (updated), so a step
// appends its ~24 bytes alone.
type seenEntry struct {
	rec, updated span
	gen          uint64
	rowSec       int64 // rowAt as Unix seconds and nanoseconds: only compared with Equal
	rowNsec      int32
	flags        uint8
}

const (
	entryUsed uint8 = 1 << iota
	entrySettled
	entryLookup
	entryGap
	entryActiveIsLatest
)

// compactMinArena: a table's arena smaller than this is never compacted (its garbage is small
// whatever its share).
const compactMinArena = 4 << 10

func newSeenCache() *seenCache {
	return &seenCache{hashMask: ^uint64(0)}
}

// table is the machine's table, nil when it has no cached state.
func (c *seenCache) table(machine string) *seenTable {
	if t, ok := c.machines.Load(machine); ok {
		return t.(*seenTable)
	}
	return nil
}

// get returns thread k's cached state. Its strings are views of the arena (see seenTable).
func (c *seenCache) get(k string) (cached, bool) {
	machine, thread, _ := splitKey(k)
	t := c.table(machine)
	if t == nil {
		return cached{}, false
	}
	i, ok := t.find(thread)
	if !ok {
		return cached{}, false
	}
	return t.decode(&t.entries[i]), true
}

// put sets thread k's cached state, copying its strings into the machine's arena (unless they
// are those the entry has: their bytes are kept).
func (c *seenCache) put(k string, v cached) {
	machine, thread, _ := splitKey(k)
	t := c.table(machine)
	if t == nil {
		t = &seenTable{ids: idindex.Make(0)}
		t.ids.SetHashMask(c.hashMask)
		c.machines.Store(machine, t) // the machine's lock is held: no other put races this one
	}
	i, ok := t.find(thread)
	if !ok {
		i = t.insert(thread)
	}
	e := seenEntry{gen: v.s.Gen, rowSec: v.rowAt.Unix(), rowNsec: int32(v.rowAt.Nanosecond()), flags: entryUsed}
	if v.s.Settled {
		e.flags |= entrySettled
	}
	if v.s.Lookup {
		e.flags |= entryLookup
	}
	if v.s.Gap {
		e.flags |= entryGap
	}
	active := v.s.Active
	if active == v.s.Latest {
		e.flags |= entryActiveIsLatest // a running run is both: its id once
		active = ""
	}
	strs := [...]string{thread, v.s.Latest, active, v.s.Question, v.s.GapAfter}
	lists := [...][]string{v.s.Open, v.s.Asked}
	need := len(v.s.UpdatedAt)
	for _, f := range strs {
		need += fieldSize(f)
	}
	for _, l := range lists {
		need += uvarintSize(len(l))
		for _, f := range l {
			need += fieldSize(f)
		}
	}
	t.reserve(need) // may compact: the entry's spans are read after it
	old := t.entries[i]
	off := len(t.arena)
	for _, f := range strs {
		t.arena = appendField(t.arena, f)
	}
	for _, l := range lists {
		t.arena = binary.AppendUvarint(t.arena, uint64(len(l)))
		for _, f := range l {
			t.arena = appendField(t.arena, f)
		}
	}
	e.rec = span{uint32(off), uint32(len(t.arena) - off)}
	if string(t.arena[off:]) == string(t.bytes(old.rec)) {
		// The record did not change (a run's step: only UpdatedAt moved): keep the one the entry
		// has. The bytes just appended were never handed out, so taking them back is safe.
		t.arena = t.arena[:off]
		e.rec = old.rec
	}
	if e.updated = old.updated; t.view(old.updated) != v.s.UpdatedAt {
		e.updated = span{uint32(len(t.arena)), uint32(len(v.s.UpdatedAt))}
		t.arena = append(t.arena, v.s.UpdatedAt...)
	}
	t.live += e.size() - old.size()
	t.entries[i] = e
}

func fieldSize(f string) int { return uvarintSize(len(f)) + len(f) }

func uvarintSize(n int) int {
	var b [binary.MaxVarintLen64]byte
	return len(binary.AppendUvarint(b[:0], uint64(n)))
}

func appendField(b []byte, f string) []byte {
	b = binary.AppendUvarint(b, uint64(len(f)))
	return append(b, f...)
}

// delete forgets thread k's cached state.
func (c *seenCache) delete(k string) {
	machine, thread, _ := splitKey(k)
	t := c.table(machine)
	if t == nil {
		return
	}
	i, ok := t.find(thread)
	if !ok {
		return
	}
	t.ids.Remove(thread, i)
	t.live -= t.entries[i].size()
	t.entries[i] = seenEntry{}
	t.free = append(t.free, i)
	if t.ids.Len() == 0 {
		c.machines.Delete(machine) // its arena and entries with it
	}
}

// dropMachine forgets every cached state of the machine.
func (c *seenCache) dropMachine(machine string) { c.machines.Delete(machine) }

// len is the number of cached states.
func (c *seenCache) len() int {
	n := 0
	c.machines.Range(func(_, t any) bool {
		n += t.(*seenTable).ids.Len()
		return true
	})
	return n
}

// find returns the entry of thread id.
func (t *seenTable) find(id string) (uint32, bool) { return t.ids.Find(id, t.idAt) }

// idAt is the thread id of entry i.
func (t *seenTable) idAt(i uint32) string { return t.threadOf(&t.entries[i]) }

// insert adds an entry for thread id (not in the table), in a deleted one's slot if there is
// one. put writes its record.
func (t *seenTable) insert(id string) uint32 {
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		t.entries = append(t.entries, seenEntry{})
		i = uint32(len(t.entries) - 1)
	}
	t.entries[i] = seenEntry{flags: entryUsed}
	t.ids.Add(id, i)
	return i
}

// bytes is the arena's bytes of a span.
func (t *seenTable) bytes(s span) []byte { return t.arena[s.off : s.off+s.n] }

// view is the string of a span, sharing the arena's bytes.
func (t *seenTable) view(s span) string {
	if s.n == 0 {
		return ""
	}
	return unsafe.String(&t.arena[s.off], int(s.n))
}

// size is the number of arena bytes the entry refers to.
func (e *seenEntry) size() int { return int(e.rec.n + e.updated.n) }

// fields reads a record's strings in turn, as views of the arena.
type fields struct {
	arena []byte
	off   int
}

func (f *fields) uvarint() int {
	n, w := binary.Uvarint(f.arena[f.off:])
	f.off += w
	return int(n)
}

func (f *fields) next() string {
	n := f.uvarint()
	if n == 0 {
		return ""
	}
	s := unsafe.String(&f.arena[f.off], n)
	f.off += n
	return s
}

func (f *fields) list() []string {
	n := f.uvarint()
	if n == 0 {
		return nil
	}
	out := make([]string, n) // a new slice: callers append to it (observe clones it anyway)
	for i := range out {
		out[i] = f.next()
	}
	return out
}

func (t *seenTable) threadOf(e *seenEntry) string {
	f := fields{t.arena, int(e.rec.off)}
	return f.next()
}

func (t *seenTable) decode(e *seenEntry) cached {
	f := fields{t.arena, int(e.rec.off)}
	f.next() // the thread id
	var s seen
	s.Latest, s.Active, s.Question, s.GapAfter = f.next(), f.next(), f.next(), f.next()
	s.Open, s.Asked = f.list(), f.list()
	if e.flags&entryActiveIsLatest != 0 {
		s.Active = s.Latest
	}
	s.UpdatedAt = t.view(e.updated)
	s.Settled, s.Lookup, s.Gap, s.Gen = e.flags&entrySettled != 0, e.flags&entryLookup != 0, e.flags&entryGap != 0, e.gen
	return cached{s: s, rowAt: time.Unix(e.rowSec, int64(e.rowNsec))}
}

// reserve makes room for need more bytes in the arena. When garbage (the records and updatedAts
// of states changed since) would be over half of it, it builds a new arena of the live bytes
// alone instead of growing this one, so a table holds about twice its live bytes at most, and a
// compaction's copy is paid for by at least as many bytes appended since the one before. Views
// of the old arena keep it alive until they go.
func (t *seenTable) reserve(need int) {
	n := len(t.arena) + need
	if n <= cap(t.arena) && n <= 2*(t.live+need) {
		return
	}
	if n < compactMinArena || n <= 2*(t.live+need) {
		t.arena = slices.Grow(t.arena, need)
		return
	}
	arena := make([]byte, 0, 2*(t.live+need))
	for i := range t.entries {
		e := &t.entries[i]
		if e.flags&entryUsed == 0 {
			continue
		}
		off := len(arena)
		arena = append(arena, t.bytes(e.rec)...)
		e.rec.off = uint32(off)
		off = len(arena)
		arena = append(arena, t.bytes(e.updated)...)
		e.updated.off = uint32(off)
	}
	t.arena = arena
}
