// Package memreturn gives the Go heap's spare memory back to the OS once the process has gone
// quiet after a busy spell.
//
// Why: the Go runtime keeps the pages a busy spell touched (its heap grows to the collector's
// goal, about twice the live heap) and its scavenger returns only what lies above that goal. After
// a burst of t3_thread calls a connector watching 100 machines × 1,000 threads stayed at 255–284 MB
// for the four minutes it then sat idle, against 211–225 MB right after start-up, when the
// snapshot gate (internal/watch/gate.go) had just returned start-up's garbage
// (docs/benchmarks.md, "Idle after a busy spell"). A Returner looks at the heap every little while
// and, after a busy spell followed by a quiet one, returns what is spare (debug.FreeOSMemory).
//
// The price is paid by the calls after a return: the pages they allocate are new to the kernel
// again, a minor fault each, which on some virtual machines costs milliseconds per call. So it
// returns only after a busy spell, once the process has been quiet for a while, and only when there
// is enough to return; while the process stays busy it never does. And with a Heap (reserve.go) a
// return keeps a warm reserve mapped, with the collector's goal set to cycle inside it while the
// process stays quiet, so that those calls find mapped pages.
package memreturn

import (
	"context"
	"log/slog"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Sample is what a Returner reads of the heap at each look.
type Sample struct {
	// Allocs is the bytes allocated since the process began (cumulative).
	Allocs uint64
	// Spare is the heap memory the process holds that is neither live nor returned to the OS:
	// garbage not yet collected, free space in spans and free spans not yet returned.
	Spare uint64
}

// Defaults: a look every 10 s; quiet means under 8 MiB allocated between two looks (an idle
// connector at 100 machines allocates ~2–3 MB in 10 s); three quiet looks in a row; and at least
// 32 MiB spare.
const (
	DefaultEvery = 10 * time.Second
	// DefaultCheckEvery: how often a Heap is checked for the end of its quiet spell. A load that
	// starts runs on the tight goal until the check after its third collection (a few hundred
	// ms at 1,000 transitions/s); a check is one runtime/metrics read.
	DefaultCheckEvery = 250 * time.Millisecond
	DefaultQuietAlloc = 8 << 20
	DefaultQuietLooks = 3
	DefaultMinSpare   = 32 << 20
)

// Returner returns spare heap memory after a busy spell. The zero value of a field means its
// default; Read and Return default to the Go runtime's (ReadRuntime, and Heap.Settle with a Heap,
// else debug.FreeOSMemory).
type Returner struct {
	Every      time.Duration
	QuietAlloc uint64 // at most this allocated between two looks: a quiet look
	QuietLooks int    // quiet looks in a row before a return
	MinSpare   uint64 // at least this spare for a return
	Read       func() Sample
	Return     func()
	Log        *slog.Logger
	// Heap, when set, is the process's heap policy (reserve.go): checked every CheckEvery
	// (default DefaultCheckEvery) for a busy spell that ends its tight goal, and settled by each
	// return.
	Heap       *Heap
	CheckEvery time.Duration

	// What it did, for /metrics (read from any goroutine).
	looks, returns, returned atomic.Uint64

	// The state between looks; one goroutine (Run) owns it.
	last   Sample
	looked bool
	busy   bool // a busy look since the last return (or since the start)
	quiet  int  // quiet looks in a row
	// loosened: the Heap's tight goal ended since the last return; the next quiet return
	// tightens it again, however little is spare.
	loosened bool
}

// Stats is what a Returner has done since it started.
type Stats struct {
	Looks    uint64 // looks at the heap, the first one at the start of Run
	Returns  uint64 // returns of spare memory to the OS
	Returned uint64 // the spare bytes those returns found (the OS may take back somewhat less)
}

// Stats reads what r has done so far; safe while Run runs.
func (r *Returner) Stats() Stats {
	return Stats{Looks: r.looks.Load(), Returns: r.returns.Load(), Returned: r.returned.Load()}
}

// Register puts r's counters on reg: t3code_mcp_memory_return_looks_total,
// t3code_mcp_memory_returns_total and t3code_mcp_memory_returned_bytes_total; with a Heap also
// t3code_mcp_memory_heap_settles_total, t3code_mcp_memory_heap_loosens_total and the gauge
// t3code_mcp_memory_heap_reserve_gc_percent.
func (r *Returner) Register(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t3code_mcp_memory_return_looks_total",
			Help: "Looks at the Go heap by the return of spare memory after busy spells (one at start, then every 10 s)."},
			func() float64 { return float64(r.looks.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t3code_mcp_memory_returns_total",
			Help: "Returns of the heap's spare memory to the OS once the process turned quiet after a busy spell."},
			func() float64 { return float64(r.returns.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t3code_mcp_memory_returned_bytes_total",
			Help: "The spare heap bytes those returns found (the OS may take back somewhat less)."},
			func() float64 { return float64(r.returned.Load()) }),
	}
	if h := r.Heap; h != nil {
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t3code_mcp_memory_heap_settles_total",
				Help: "Returns of the heap's spare memory by the heap policy (keeping its warm reserve when one is set), the snapshot gate's at the end of start-up included."},
				func() float64 { return float64(h.Stats().Settles) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "t3code_mcp_memory_heap_loosens_total",
				Help: "Busy spells that gave the collector back its own goal (GOGC) after the warm reserve's tighter one."},
				func() float64 { return float64(h.Stats().Loosens) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "t3code_mcp_memory_heap_reserve_gc_percent",
				Help: "The GC percent set while quiet so that the heap cycles inside its warm reserve; 0 while busy or without a reserve."},
				func() float64 {
					if tight, p := h.Tight(); tight {
						return float64(p)
					}
					return 0
				}),
		)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Run looks at once (the first look is the baseline for the next), then every r.Every until ctx
// ends.
func (r *Returner) Run(ctx context.Context) {
	every := r.Every
	if every <= 0 {
		every = DefaultEvery
	}
	read, ret := r.Read, r.Return
	if read == nil {
		read = ReadRuntime
	}
	if ret == nil {
		ret = debug.FreeOSMemory
		if r.Heap != nil {
			ret = r.Heap.Settle
		}
	}
	checkEvery := r.CheckEvery
	if checkEvery <= 0 {
		checkEvery = DefaultCheckEvery
	}
	if r.Log != nil {
		r.Log.Debug("memory return: looking at the heap", "every", every.String())
	}
	lookOnce := func() {
		s := read()
		r.looks.Add(1)
		if !r.look(s) {
			return
		}
		start := time.Now()
		ret()
		r.returns.Add(1)
		r.returned.Add(s.Spare)
		if r.Log != nil {
			r.Log.Debug("returned spare heap memory to the OS after a busy spell", "spare_mb", s.Spare>>20, "ms", time.Since(start).Milliseconds())
		}
	}
	lookOnce()
	t := time.NewTicker(every)
	defer t.Stop()
	var check <-chan time.Time
	if r.Heap != nil {
		c := time.NewTicker(checkEvery)
		defer c.Stop()
		check = c.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			lookOnce()
		case now := <-check:
			if r.Heap.Check(now) {
				r.loosened, r.busy, r.quiet = true, true, 0
				if r.Log != nil {
					r.Log.Debug("busy: the heap's goal back to the process's own until it is quiet again")
				}
			}
		}
	}
}

// look takes in one sample and says whether to return memory now.
func (r *Returner) look(s Sample) bool {
	quietAlloc, quietLooks, minSpare := r.QuietAlloc, r.QuietLooks, r.MinSpare
	if quietAlloc == 0 {
		quietAlloc = DefaultQuietAlloc
	}
	if quietLooks <= 0 {
		quietLooks = DefaultQuietLooks
	}
	if minSpare == 0 {
		minSpare = DefaultMinSpare
	}
	prev, looked := r.last, r.looked
	r.last, r.looked = s, true
	if !looked {
		return false // nothing to compare with yet
	}
	if s.Allocs-prev.Allocs > quietAlloc {
		r.busy, r.quiet = true, 0
		return false
	}
	r.quiet++
	if !r.busy || r.quiet < quietLooks || (s.Spare < minSpare && !r.loosened) {
		return false
	}
	r.busy, r.quiet, r.loosened = false, 0, false
	return true
}

// The runtime/metrics the runtime's Sample is made of.
var runtimeMetrics = []string{
	"/gc/heap/allocs:bytes",
	"/gc/heap/live:bytes",
	"/memory/classes/heap/objects:bytes",
	"/memory/classes/heap/unused:bytes",
	"/memory/classes/heap/free:bytes",
}

// ReadRuntime reads a Sample of this process's Go heap (runtime/metrics; no stop of the world).
func ReadRuntime() Sample {
	ms := make([]metrics.Sample, len(runtimeMetrics))
	for i, name := range runtimeMetrics {
		ms[i].Name = name
	}
	metrics.Read(ms)
	v := func(i int) uint64 { return uint64Value(ms[i]) }
	held := v(2) + v(3) + v(4) // objects (live and not yet collected), unused in spans, free spans
	s := Sample{Allocs: v(0)}
	if live := v(1); held > live {
		s.Spare = held - live
	}
	return s
}
