package memreturn

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// Why a warm reserve: returning every spare page to the OS (debug.FreeOSMemory) leaves a quiet
// process with a heap that must grow again, page by page, up to the collector's goal, about twice
// the live heap, before a collection hands it pages that are still mapped. Each new page is a minor
// fault; on some virtual machines a fault costs ~10 µs, and the first t3_thread calls after
// start-up (or after a return) took 35–45 of them each, most of the 9–11 ms of CPU they cost
// against 2–3 ms once the heap had cycled (docs/benchmarks.md, "The first call's kernel time").
// Keeping the whole goal mapped instead costs ~80 MB of RSS at 100 machines × 1,000 threads.
//
// So, while the process is quiet, a Heap keeps a small part mapped — the reserve — and sets the
// collector's goal (GOGC) so that the heap cycles inside it: a collection comes after about a
// reserve's worth of allocation, and its freed pages are the ones the next calls get (the runtime
// hands out the lowest free pages first, mapped or not, so the reserve is touched right after a
// return, when it is the lowest free memory). A quiet process allocates a reserve's worth rarely
// (an idle connector at 100 machines ~0.3 MB/s), so the tighter goal costs little collection.
// Once the process is busy — LoosenCollections collections within LoosenWithin while tight — the
// goal goes back to the process's own (GOGC, 100 by default), and the Returner tightens it again
// with the next return once the process has turned quiet. (A tight collection at 100 machines ×
// 1,000 threads costs 6–25 ms of CPU and comes after ~10 MB; at 1,000 transitions/s the
// connector allocates ~50 MB/s, and three collections come within a second.)

// DefaultReserve is the warm reserve the connector keeps by default. The collector starts before
// its goal, so a tight collection comes after ~10 MB of it: about 30 first t3_thread calls on a
// 5,000-item thread (~330 kB each). It added 5–15 MB of idle RSS at 100 machines × 1,000 threads
// (docs/benchmarks.md, "A warm reserve").
const DefaultReserve = 16 << 20

// LoosenCollections collections within LoosenWithin while tight mean the process is busy: more
// than ~20–30 MB allocated in 10 s at the default reserve. A burst of 40 first t3_thread calls
// (~13 MB) makes one or two.
const (
	LoosenCollections = 3
	LoosenWithin      = 10 * time.Second
)

// minPercent bounds how tight the goal gets for a big live heap (a collection per 10 % of it).
const minPercent = 10

// warmPiece is what the reserve is touched in: one object of the 8 KiB size class fills a span of
// one runtime page, so the pieces take the lowest free pages one by one, however scattered.
const warmPiece = 8 << 10

// Heap is the process's Go heap policy between quiet and busy spells. The zero value keeps no
// reserve: Settle is then debug.FreeOSMemory and nothing else.
type Heap struct {
	mu      sync.Mutex
	reserve uint64
	tight   bool
	own     int // the GC percent the process runs with when not tight (read at the first tightening)
	// The tight spell's collections, for Check.
	cycles  uint64      // /gc/cycles/total at the last Check or Settle
	seen    []time.Time // when Check saw the collections of the last LoosenWithin, one entry each
	percent int         // the tight GC percent set by the last Settle

	settles, loosens atomic.Uint64

	// Cycles reads the collections completed so far; nil: the runtime's (/gc/cycles/total).
	// Tests set it before use.
	Cycles func() uint64
}

// Process is the process's Heap: memory is the process's, so is its policy. The snapshot gate
// (internal/watch) settles it after start-up and the Returner after busy spells.
var Process = &Heap{}

// Settle returns the process's spare memory and keeps its reserve (Process.Settle).
func Settle() { Process.Settle() }

// SetReserve sets the reserve kept from the next Settle on; 0 turns it off (and loosens now).
func (h *Heap) SetReserve(bytes uint64) {
	h.mu.Lock()
	h.reserve = bytes
	h.mu.Unlock()
	if bytes == 0 {
		h.Loosen()
	}
}

// Settle returns the spare heap to the OS, then, with a reserve set, sets the collector's goal to
// the live heap plus the reserve and touches that much of the lowest free memory again, so that
// the allocations until the next collection find mapped pages.
func (h *Heap) Settle() {
	debug.FreeOSMemory() // a collection, then every free page returned
	h.mu.Lock()
	defer h.mu.Unlock()
	defer h.settles.Add(1) // counted once done: a settle seen on /metrics has set the goal
	if h.reserve == 0 {
		return
	}
	live := readUint64("/gc/heap/live:bytes")
	if !h.tight {
		h.own = int(readUint64("/gc/gogc:percent"))
	}
	if h.own <= 0 {
		return // GOGC=off: the collector's goal is not ours to set
	}
	percent := h.own
	if live > 0 {
		percent = int(min(h.reserve*100/live, uint64(h.own)))
	}
	percent = max(percent, min(minPercent, h.own))
	debug.SetGCPercent(percent)
	h.tight, h.percent = true, percent
	warm(min(h.reserve, live*uint64(percent)/100))
	runtime.GC() // the touched pieces freed: free pages still mapped, the lowest ones
	h.cycles, h.seen = h.readCycles(), h.seen[:0]
}

// warm touches bytes of new heap memory in warmPiece pieces, every OS page of each, all held
// until the last is touched (a piece dropped at once could be left untouched by the compiler).
func warm(bytes uint64) {
	pieces := make([][]byte, bytes/warmPiece)
	for i := range pieces {
		p := make([]byte, warmPiece)
		for off := 0; off < warmPiece; off += 4096 {
			p[off] = 1
		}
		pieces[i] = p
	}
	runtime.KeepAlive(pieces)
}

// Check looks at the collections since the last look while tight: LoosenCollections within
// LoosenWithin mean the process is busy, and the goal goes back to the process's own. It says
// whether it loosened.
func (h *Heap) Check(now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.tight {
		return false
	}
	c := h.readCycles()
	n := c - h.cycles
	h.cycles = c
	keep := h.seen[:0]
	for _, at := range h.seen {
		if now.Sub(at) < LoosenWithin {
			keep = append(keep, at)
		}
	}
	for i := uint64(0); i < n && len(keep) < LoosenCollections; i++ {
		keep = append(keep, now)
	}
	h.seen = keep
	if len(keep) >= LoosenCollections {
		h.loosenLocked()
		return true
	}
	return false
}

// Loosen gives the collector back its own goal, if tight.
func (h *Heap) Loosen() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loosenLocked()
}

func (h *Heap) loosenLocked() {
	if !h.tight {
		return
	}
	debug.SetGCPercent(h.own)
	h.tight, h.seen = false, h.seen[:0]
	h.loosens.Add(1)
}

// Tight says whether the heap runs with its reserve's goal now, and that GC percent.
func (h *Heap) Tight() (bool, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tight, h.percent
}

// HeapStats is what a Heap has done.
type HeapStats struct {
	Settles uint64 // returns of spare memory (with or without a reserve)
	Loosens uint64 // busy spells that ended a tight goal
}

// Stats reads what h has done; safe from any goroutine.
func (h *Heap) Stats() HeapStats {
	return HeapStats{Settles: h.settles.Load(), Loosens: h.loosens.Load()}
}

func (h *Heap) readCycles() uint64 {
	if h.Cycles != nil {
		return h.Cycles()
	}
	return readUint64("/gc/cycles/total:gc-cycles")
}

func readUint64(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return uint64Value(s[0])
}

// uint64Value is a sample's value, 0 when the runtime does not know it as a uint64.
func uint64Value(s metrics.Sample) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return s.Value.Uint64()
}
