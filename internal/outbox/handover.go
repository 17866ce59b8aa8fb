package outbox

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// The hand-over: the group commit that made events durable hands them to the outbox in memory
// (store.Group.OnDurable → Outbox.Committed), header and body, so that the loop takes them into
// its queues without reading the store (no scan decoding their headers) and delivers them without
// reading them back (no read of the head before its attempt). The store stays the truth: what
// the hand-over does not carry is read from it as before, and nothing is delivered that is not
// durable (an event is handed over only after its transaction is).
//
// What falls back to the store:
//   - everything after a restart (the queues are rebuilt from the store's index; nothing is in
//     memory);
//   - a gap: a handed-over event whose sequence number does not follow the last one the loop
//     took in (an event committed other than through the group, or a hand-over dropped because
//     the buffer was full): the loop scans the store from its cursor, and the handed-over bodies
//     it holds are used for the events the scan finds;
//   - bodies beyond handBudget (the bodies held in memory, from the hand-over until the event's
//     first attempt starts): such events are handed over without their body and read when sent;
//   - a retry, or a head that waited for a retry: its body is read again when it is due (as
//     before: a waiting head holds no body unless its body is one of the budget's).
//
// Events committed other than through the group are found by Notify (a scan), and by a scan once
// every handScanEvery at the latest.

const (
	// handBudget bounds the bytes of handed-over bodies held in memory (in the hand-over buffer,
	// in the loop's waiting map, as a head's body until its first attempt starts): 16 MiB, some
	// 30,000 events of a typical size. Past it events are handed over without their bodies.
	handBudget = 16 << 20
	// handMax bounds the events waiting in the hand-over buffer for the loop (their headers):
	// past it they are dropped, and the loop, seeing the gap, scans the store for them.
	handMax = 1 << 16
	// handScanEvery is how often, at least, the loop fed by the hand-over scans the store anyway,
	// for events committed other than through the group whose committer did not Notify.
	handScanEvery = time.Second
)

// handover is the buffer between the group commit's writer and the loop: Committed appends, the
// loop takes all at each turn. held counts the bytes of bodies held, here and in the loop, against
// handBudget; the loop releases its part when it hands a body to a worker or drops it.
type handover struct {
	mu   sync.Mutex
	evs  []store.Event
	lost bool // events were dropped since the loop last took: it must scan the store
	// held is atomic, not under mu: the loop gives bytes back at every delivery, and only
	// Committed adds (one group writer at a time), so its check against the budget cannot race
	// with another add.
	held atomic.Int64
}

// Committed takes events the group commit has just made durable (store.Group.OnDurable): the
// loop takes them into its queues, with their bodies (within handBudget), and delivers them
// without reading them back. It never blocks on the loop, and it does not keep evs (it copies
// the events; their bodies must not be modified afterwards). Set Config.HandOver when the
// outbox is fed this way.
func (o *Outbox) Committed(evs []store.Event) {
	if len(evs) == 0 {
		return
	}
	h := &o.hand
	h.mu.Lock()
	for _, e := range evs {
		if len(h.evs) >= o.handMax {
			h.lost = true // the loop sees the gap and scans for them
			continue
		}
		if h.held.Load()+int64(len(e.Body)) > int64(o.handBudget) {
			e.Body = nil // read when sent
		}
		h.held.Add(int64(len(e.Body)))
		h.evs = append(h.evs, e)
	}
	h.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// handOver reports whether the loop takes new events from the hand-over (Config.HandOver, and
// the only deliverer of its queue).
func (l *loop) handOver() bool { return l.o.cfg.HandOver && l.o.claimer == nil }

// take moves the buffered events into buf and reports whether some were dropped since the last
// take.
func (h *handover) take(buf []store.Event) ([]store.Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	buf = append(buf, h.evs...)
	clear(h.evs)
	h.evs = h.evs[:0]
	if cap(h.evs) > 1024 && len(buf) < cap(h.evs)/4 {
		h.evs = nil // a burst's buffer is not kept
	}
	lost := h.lost
	h.lost = false
	return buf, lost
}

// release gives n bytes of held bodies back to the budget.
func (h *handover) release(n int) {
	if n != 0 {
		h.held.Add(-int64(n))
	}
}

// releaseHeld gives back, when Run ends, the bytes of the bodies the loop still holds.
func (l *loop) releaseHeld() {
	for seq := range l.mem {
		l.unhold(seq)
	}
	for _, s := range l.streams {
		l.dropHeld(s)
	}
}

// intake takes the handed-over events into the queues, in sequence order, and reports whether
// the store must be scanned: a gap (an event the hand-over did not carry) or dropped events. A
// handed-over event past a gap waits with its body in l.mem for the scan to take it in.
func (l *loop) intake() (gap bool) {
	var lost bool
	l.handed, lost = l.o.hand.take(l.handed[:0])
	gap = lost
	for i := range l.handed {
		e := &l.handed[i]
		switch {
		case e.Seq <= l.last:
			// A scan took it in before it was handed over: it is read when sent.
			l.o.hand.release(len(e.Body))
		case !gap && e.Seq == l.last+1:
			l.last = e.Seq
			l.takeIn(e, true)
		default:
			gap = true
			if e.Body != nil {
				l.hold(e)
			}
		}
	}
	clear(l.handed) // the bodies are the queues' now
	if cap(l.handed) > 4096 {
		l.handed = nil // a burst's buffer is not kept
	}
	return gap
}

// hold keeps e's handed-over body in l.mem until e becomes its stream's head.
func (l *loop) hold(e *store.Event) {
	if l.mem == nil {
		l.mem = map[uint64]store.Event{}
	}
	l.mem[e.Seq] = *e
}

// unhold forgets seq's held body, if any (the event was delivered, dropped or given up).
func (l *loop) unhold(seq uint64) {
	if e, ok := l.mem[seq]; ok {
		l.forget(seq)
		l.o.hand.release(len(e.Body))
	}
}

// forget deletes seq from l.mem, and l.mem itself once it is empty: a map keeps the buckets of
// its largest size, and a backlog's would stay allocated after it drained.
func (l *loop) forget(seq uint64) {
	delete(l.mem, seq)
	if len(l.mem) == 0 {
		l.mem = nil
	}
}

// fromMem makes s's head the held event at its front, with its body, when the loop holds it:
// no read of the store. It reports whether it did.
func (l *loop) fromMem(s *stream) bool {
	e, ok := l.mem[s.queue[0]]
	if !ok {
		return false
	}
	l.forget(s.queue[0])
	l.setHeld(s, e.Body)
	e.Body = nil
	s.head = &e
	return true
}

// setHeld makes body, a handed-over one counted in the budget, s's head's body.
func (l *loop) setHeld(s *stream, body []byte) {
	l.dropHeld(s)
	s.body, s.held = body, len(body)
}

// dropHeld gives the budget back the bytes of s's head's handed-over body: it was handed to a
// worker, or is dropped.
func (l *loop) dropHeld(s *stream) {
	if s.held > 0 {
		l.o.hand.release(s.held)
		s.held = 0
	}
}
