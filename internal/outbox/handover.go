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
//
// Starts from the hand-over: an event whose thread has nothing pending in the outbox (nothing
// queued, in flight or waiting for a retry) is sent at once by Committed, on the group writer's
// goroutine: it takes a request slot and hands the job to a delivery worker waiting for one,
// without a turn of the loop in between (startHanded). Before, the event waited for two
// goroutines to get a core after its commit, the loop woken by the hand-over and then the worker
// it woke; in a trace of the latency phase the hand-over → attempt stage was p50 8.5 / p99 51 ms,
// the loop's own work in it 0.16 ms. The loop stays the owner of everything else: it takes the
// started event into its queues as in flight (its stream busy) before it takes the outcome, so
// the retries, the order behind it, the backlog and the records are as before. It is done only
// when nothing can be ahead of the event in its thread:
//   - the loop is in sync with the hand-over (synced): every event up to the last one handed over
//     is in the loop's queues or in the buffer, which holds them in sequence order without a gap
//     (an event committed aside, or dropped, leaves a gap in the sequence numbers: no start until
//     the loop's scan has taken it in and resync finds the two in step again); while the loop
//     scans, no start (a scan would take a started event in as a new one);
//   - the thread is neither in the loop's streams nor in the buffer;
//   - the event is complete (no enrichment due), has its body, and is on its first attempt;
//   - a slot is free (inflight below the loop's limit), the outcomes not yet recorded are below
//     maxUnrecorded, and a delivery worker is waiting for a job (no goroutine is started on the
//     writer: a worker that outlived its last job takes it).
// Otherwise the event goes through the buffer and the loop, as before.

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
	evs  []handed
	lost bool // events were dropped since the loop last took: it must scan the store
	// held is atomic, not under mu: the loop gives bytes back at every delivery, and only
	// Committed adds (one group writer at a time), so its check against the budget cannot race
	// with another add.
	held atomic.Int64

	// The starts from the hand-over (startHanded). loop is the running loop that takes them in
	// (nil: none runs, or it does not take the hand-over); synced says the loop is in step with
	// the hand-over (see above); lastSeen is the highest sequence number handed over (or taken
	// in by the loop, at a resync); contiguous says the buffer's events follow one another
	// without a gap since the loop last took it; inBuf counts the buffer's events per thread;
	// started counts the started events in the buffer.
	loop       *loop
	synced     bool
	lastSeen   uint64
	contiguous bool
	inBuf      map[string]int
	started    int
}

// handed is an event in the hand-over's buffer; started, when set, says a delivery of it is in
// flight already (startHanded) and is the stream the loop takes it into.
type handed struct {
	store.Event
	started *stream
	burst   bool // its request went out on the burst client (net/http only)
}

// Committed takes events the group commit has just made durable (store.Group.OnDurable): the
// loop takes them into its queues, with their bodies (within handBudget), and delivers them
// without reading them back. It never blocks on the loop, and it does not keep evs (it copies
// the events; their bodies must not be modified afterwards). Set Config.HandOver when the
// outbox is fed this way.
//
// An event whose thread has nothing pending is sent at once, when a slot and a waiting worker
// are free (startHanded); the loop is woken only for the others.
func (o *Outbox) Committed(evs []store.Event) {
	if len(evs) == 0 {
		return
	}
	markDurableEvents(evs)
	h := &o.hand
	queued := false
	h.mu.Lock()
	for _, e := range evs {
		if e.Seq != h.lastSeen+1 {
			// Something not handed over lies before it (committed aside), or it was taken in
			// by a scan already: the loop must catch up before the next start.
			h.synced, h.contiguous = false, false
		}
		h.lastSeen = max(h.lastSeen, e.Seq)
		if h.synced && h.loop.startHanded(e) {
			continue
		}
		if len(h.evs) >= o.handMax {
			h.lost = true // the loop sees the gap and scans for them
			h.synced, h.contiguous = false, false
			continue
		}
		if h.held.Load()+int64(len(e.Body)) > int64(o.handBudget) {
			e.Body = nil // read when sent
		}
		h.held.Add(int64(len(e.Body)))
		h.push(handed{Event: e})
		queued = true
	}
	h.mu.Unlock()
	if !queued {
		return // every event is on its way; the loop takes them in with their outcomes
	}
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// push appends e to the buffer (h.mu held).
func (h *handover) push(e handed) {
	if h.inBuf == nil {
		h.inBuf = map[string]int{}
	}
	h.inBuf[e.Stream]++
	if e.started != nil {
		h.started++
	}
	h.evs = append(h.evs, e)
}

// startHanded sends e, just handed over, at once when nothing can be ahead of it in its thread
// (see the top of this file; h.synced is checked by the caller, h.mu held): it takes a slot,
// hands the job to a waiting delivery worker and puts e in the buffer as started, for the loop
// to take into its queues as in flight. It reports whether it did.
func (l *loop) startHanded(e store.Event) bool {
	h := &l.o.hand
	if e.Body == nil || e.Attempts != 0 || !e.NextAttempt.IsZero() || (e.Enrich && l.o.cfg.Enricher != nil) {
		return false
	}
	if h.inBuf[e.Stream] > 0 {
		return false
	}
	if _, ok := l.streams[e.Stream]; ok {
		return false
	}
	if l.unsettledNow.Load()+int64(h.started) >= int64(l.o.unrecordedMax) || !l.takeSlot() {
		return false
	}
	s := &stream{name: e.Stream, bo: l.o.cfg.Backoff.NewBackOff()}
	head := e
	head.Body = nil
	j := job{s: s, seq: e.Seq, bo: s.bo, client: l.o.client, head: head, body: e.Body, ticket: l.tickets.Add(1)}
	burst := l.inflight.Load() > baseRequests
	if burst {
		j.client = l.o.burst
	}
	select {
	case l.work <- j: // a worker waiting for its next job took it
	default:
		l.freeSlot() // none waits: the loop starts one
		return false
	}
	l.o.handStarts.Add(1)
	h.push(handed{Event: head, started: s, burst: burst})
	return true
}

// attach lets Committed start deliveries for l (once the loop is in sync: resync).
func (h *handover) attach(l *loop) {
	if !l.handOver() {
		return
	}
	h.mu.Lock()
	h.loop, h.synced = l, false
	h.mu.Unlock()
}

// detach ends the starts from the hand-over: l stops.
func (h *handover) detach(l *loop) {
	h.mu.Lock()
	if h.loop == l {
		h.loop, h.synced = nil, false
	}
	h.mu.Unlock()
}

// unsync stops the starts from the hand-over until the loop's next resync.
func (h *handover) unsync() {
	h.mu.Lock()
	h.synced = false
	h.mu.Unlock()
}

// resync lets Committed start deliveries again when the loop is in step with the hand-over:
// nothing was dropped, and the loop's queues hold every event up to l.last while the buffer holds
// the ones after it, without a gap. Events held in l.mem past a gap, or found by a scan beyond
// what was handed over and still to be handed over, leave it out of step until the next turns.
func (l *loop) resync() {
	h := &l.o.hand
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.synced || h.loop != l || h.lost || !h.contiguous {
		return
	}
	switch {
	case len(h.evs) == 0 && l.last >= h.lastSeen:
		h.lastSeen = l.last
		h.synced = true
	case len(h.evs) > 0 && h.evs[0].Seq == l.last+1:
		h.synced = true
	}
}

// handOver reports whether the loop takes new events from the hand-over (Config.HandOver, and
// the only deliverer of its queue).
func (l *loop) handOver() bool { return l.o.cfg.HandOver && l.o.claimer == nil }

// take moves the buffered events into buf and reports whether some were dropped since the last
// take (h.mu held).
func (h *handover) take(buf []handed) ([]handed, bool) {
	buf = append(buf, h.evs...)
	clear(h.evs)
	h.evs = h.evs[:0]
	if cap(h.evs) > 1024 && len(buf) < cap(h.evs)/4 {
		h.evs = nil // a burst's buffer is not kept
	}
	clear(h.inBuf)
	if len(h.inBuf) == 0 && len(buf) > 1024 {
		h.inBuf = nil // nor its map
	}
	h.started = 0
	h.contiguous = true
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
// handed-over event past a gap waits with its body in l.mem for the scan to take it in. An event
// started from the hand-over is taken in as in flight. It holds the hand-over's lock throughout,
// so that a thread is always in the buffer or in l.streams for startHanded while it has an event
// pending (the work is in memory, a few µs per event).
func (l *loop) intake() (gap bool) {
	h := &l.o.hand
	h.mu.Lock()
	defer h.mu.Unlock()
	var lost bool
	l.handed, lost = h.take(l.handed[:0])
	gap = lost
	for i := range l.handed {
		e := &l.handed[i]
		switch {
		case e.started != nil:
			// Started from the hand-over: in step (synced), so it follows l.last, and its
			// thread had nothing pending.
			l.last = max(l.last, e.Seq)
			l.takeStarted(e)
		case e.Seq <= l.last:
			// A scan took it in before it was handed over: it is read when sent.
			h.release(len(e.Body))
		case !gap && e.Seq == l.last+1:
			l.last = e.Seq
			l.takeIn(&e.Event, true)
		default:
			gap = true
			if e.Body != nil {
				l.hold(&e.Event)
			}
		}
	}
	clear(l.handed) // the bodies are the queues' now
	if cap(l.handed) > 4096 {
		l.handed = nil // a burst's buffer is not kept
	}
	return gap
}

// takeStarted takes an event whose delivery the hand-over started (startHanded) into its stream,
// new, as the busy head: its outcome comes back like any other delivery's.
func (l *loop) takeStarted(e *handed) {
	s := e.started
	h := e.Event
	s.queue = append(s.queue, e.Seq)
	s.head = &h
	s.busy = true
	s.known = 1
	l.streams[s.name] = s
	l.unsettled++
	if e.burst {
		l.burstUsed = l.o.burst != l.o.client
	}
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
