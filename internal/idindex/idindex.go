// Package idindex maps string ids to uint32 slots without holding a pointer per id, so that the
// garbage collector does not walk it: the index of the watcher's rows (internal/watch) and of
// the detector's cached states (internal/events), 100,000 ids each at the load run's scale, whose
// marks a latency run's events and wakes waited behind (docs/benchmarks.md, issue 12).
//
// The index keeps a hash of each id (map[uint64]uint32: neither key nor value a pointer), not
// the id: its owner keeps the id with the slot (in a pointer-free arena), and Find checks a hit
// against it. An id whose hash another id holds already (a 64-bit collision: nearly never) is
// kept by the id itself in a side map, nil until the first one.
package idindex

import (
	"hash/maphash"
	"strings"
)

// Index is an id → slot index. The zero value is not ready: use Make. Not safe for concurrent
// use; its owner guards it.
type Index struct {
	byHash map[uint64]uint32
	clash  map[string]uint32
	seed   maphash.Seed
	// mask is and-ed to every hash: all ones, but fewer bits in tests that force collisions
	// (SetHashMask). A hash function in a field instead would make every id passed in escape to
	// the heap (an unknown callee), and with it the keys callers build on the stack.
	mask uint64
}

// Make returns an empty index with room for n ids.
func Make(n int) Index {
	return Index{byHash: make(map[uint64]uint32, n), seed: maphash.MakeSeed(), mask: ^uint64(0)}
}

// Reset empties the index, with room for n ids; the seed and the mask stay.
func (x *Index) Reset(n int) {
	x.byHash = make(map[uint64]uint32, n)
	x.clash = nil
}

// SetHashMask makes every hash h&mask from now on (tests: mask 0 makes every id collide). Set
// it while the index is empty.
func (x *Index) SetHashMask(mask uint64) { x.mask = mask }

func (x *Index) hash(id string) uint64 { return maphash.String(x.seed, id) & x.mask }

// Find returns the slot of id. idAt returns the id its owner keeps at a slot: the index's hit
// under id's hash is taken only when it is id.
func (x *Index) Find(id string, idAt func(slot uint32) string) (uint32, bool) {
	if s, ok := x.byHash[x.hash(id)]; ok && idAt(s) == id {
		return s, true
	}
	if x.clash == nil {
		return 0, false
	}
	s, ok := x.clash[id]
	return s, ok
}

// Add indexes id (not in the index) at slot.
func (x *Index) Add(id string, slot uint32) {
	h := x.hash(id)
	if _, taken := x.byHash[h]; !taken {
		x.byHash[h] = slot
		return
	}
	if x.clash == nil {
		x.clash = map[string]uint32{}
	}
	x.clash[strings.Clone(id)] = slot // a copy: the caller's id may share a larger string (a key, a frame)
}

// Remove takes id, indexed at slot, out of the index.
func (x *Index) Remove(id string, slot uint32) {
	h := x.hash(id)
	if s, ok := x.byHash[h]; ok && s == slot {
		delete(x.byHash, h)
		return
	}
	delete(x.clash, id)
}

// Len is the number of ids indexed.
func (x *Index) Len() int { return len(x.byHash) + len(x.clash) }

// Clashes is the number of ids kept by the id itself (their hash taken by another id).
func (x *Index) Clashes() int { return len(x.clash) }
