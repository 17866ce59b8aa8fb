package outbox

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/t3code-mcp/t3code-mcp/internal/store"
)

// stream is the loop's state of one stream with pending events. Only the loop goroutine touches
// it, except bo and ebo, which the one worker holding the stream (busy) uses meanwhile.
type stream struct {
	name  string
	queue []uint64     // pending sequence numbers, oldest first; queue[0] is the head
	head  *store.Event // queue[0]'s header (no body) once read; nil until then
	busy  bool         // a worker holds the head (enrichment, attempt, record)
	ready bool         // in one of the loop's ready queues (ready, toDeliver, toEnrich)
	due   bool         // its scheduled wake-up came: start the head even if NextAttempt says later
	gen   uint64       // bumped whenever a scheduled wake-up of this stream becomes stale

	// body is the head's complete body when the loop holds it: read with the header (stored),
	// or returned by the head's enrichment (enriched: not stored yet; it is stored with the
	// first attempt's record, so every retry sends the same bytes).
	body     []byte
	enriched bool
	// known counts the events at the front of queue known to need no enrichment (complete in
	// the store, or completed in memory): the stage ahead works on queue[known].
	known int
	// done holds the events behind the head that the stage ahead completed: header and complete
	// body, not stored yet (like a head's enriched body, it is stored with the event's first
	// attempt's record; a restart completes it again). Counted in loop.aheadBytes.
	done      map[uint64]store.Event
	enriching bool // an enrichment job (of the head, or ahead of it) is in flight
	inAhead   bool // in loop.ahead
	aheadFail bool // an enrichment ahead failed: none again until the head moves on

	// waitsOutOutage: the head waits for a retry after a failure of the receiver as a whole
	// (no answer, a 5xx without Retry-After); it is in loop.outageWaiters.
	waitsOutOutage bool

	// held is the size of body when body is a handed-over one counted in the hand-over's budget
	// (handover.go); 0 otherwise.
	held int

	// claimedAt is when this replica last claimed the head (replicas: claim.go).
	claimedAt time.Time

	bo  backoff.BackOff // delivery delays of the current head, created at its first dispatch
	ebo backoff.BackOff // enrichment delays of the current head
}

// newHead forgets everything about the previous head (loop.newHead also gives back a
// handed-over body's bytes).
func (s *stream) newHead() {
	s.head, s.bo, s.ebo, s.due, s.waitsOutOutage = nil, nil, nil, false, false
	s.body, s.enriched = nil, false
	s.gen++
}

func (l *loop) newHead(s *stream) {
	l.dropHeld(s)
	s.newHead()
}

// wakeAt is a scheduled wake-up of a stream: its head is due at wall time at (the injected
// clock) or, for wake-ups with a monotonic deadline, when the real monotonic time reaches mono,
// whichever comes first. Retry times are stored as wall-clock times; when the wall clock steps
// back (NTP, a restored VM) a retry would lie that much further in the future and stall its
// stream, so the monotonic deadline decides then.
type wakeAt struct {
	at  time.Time
	s   *stream
	gen uint64
	// claim: a claim retry (claim.go): the head is looked at again, but it is not due by it.
	claim bool
}

// wakeHeap is a min-heap of wake-ups by time; stale entries (gen changed) are skipped on pop.
type wakeHeap []wakeAt

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h wakeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)        { *h = append(*h, x.(wakeAt)) }
func (h *wakeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// loop is the state of one Run.
type loop struct {
	o       *Outbox
	ctx     context.Context
	streams map[string]*stream
	ready   []*stream // FIFO: a stream goes to the back after each event, so none starves
	// A ready stream's head is looked at (header read, due?) and then waits in one of these for
	// a slot: toDeliver for a delivery worker, toEnrich for an enrichment worker (its body must
	// be completed from T3 first). Both hold at most a few more than their slots.
	toDeliver []*stream
	toEnrich  []*stream
	// claimed holds, when replicas share the queue, the ready streams whose heads this turn
	// claimed (claim.go); dispatch looks at them instead of ready.
	claimed []*stream
	// scanDue: replicas scan for new events only when they may have come (see Run).
	scanDue bool
	// skipped counts the events found delivered by another replica since skipLogged.
	skipped    int
	skipLogged time.Time
	// delivered counts the events delivered since deliveredSince, and maxLag is the longest of
	// their lags: summed up at Info once per summaryEvery (summarise), the per-event line being
	// Debug.
	delivered      int
	deliveredSince time.Time
	maxLag         time.Duration
	// ahead holds streams with events behind a complete head that still need enrichment; spare
	// enrichment slots work on them, so that a stream's next events are complete by the time
	// they become its head (a delivery worker never waits on T3 for them).
	ahead      []*stream
	aheadBytes int      // the bodies held in the streams' done maps (at most aheadBudget, about)
	wall       wakeHeap // by the injected clock
	mono       wakeHeap // by the real monotonic clock (time.Now with its monotonic reading)
	last       uint64   // the highest sequence number taken into the queues
	more       bool     // the last scan hit scanLimit: look again without sleeping

	// The hand-over (handover.go): handed is intake's buffer; mem holds the handed-over events
	// (with their bodies) not yet their stream's head, by sequence number; lastScan is when the
	// store was last scanned (with the hand-over, once every handScanEvery at least).
	handed   []handed
	mem      map[uint64]store.Event
	lastScan time.Time

	// Receiver outages. After outageAfter failed attempts in a row (across all streams) with no
	// success between them, the receiver counts as down; the first delivery after that ends the
	// outage and wakes every head waiting out a retry of it at once, instead of each one waiting
	// for its backoff (up to 5 minutes): the backlog an outage leaves drains as soon as the
	// receiver is back. One failing thread among working ones never counts as an outage (the
	// others' successes reset the count), so its backoff stands.
	failsInARow   int
	outage        bool
	outageWaiters []*stream

	// limit is how many requests may be in flight now (see adapt): from the start value up to
	// Concurrency while heads wait for a slot and the receiver accepts, halved when it fails.
	// saturated: the last dispatch left heads waiting with every slot taken. tickets
	// number the deliveries started (by the loop and by the hand-over's direct starts, hence
	// atomic); shrunkAt is the ticket issued when limit was last halved (the failures of
	// requests started before it are of the same overload: one halving). limitNow is limit
	// for the hand-over's direct starts (startHanded), which run on the group writer.
	limit     int
	limitNow  atomic.Int64
	slotsFull bool // the last dispatch left heads waiting for a request slot
	saturated bool
	tickets   atomic.Uint64
	shrunkAt  uint64

	// idleSince is when the loop last found nothing to deliver and nothing in flight, while it
	// still keeps its waiting workers and the burst client's connections (shedWhenIdle); zero
	// otherwise.
	idleSince time.Time
	// burstUsed: a request went out on the burst client since it last dropped its connections.
	burstUsed bool

	// inflight counts the requests in flight (at most limit: takeSlot takes one, for the loop's
	// dispatch or a start from the hand-over, freeSlot gives it back); a worker frees its slot
	// once its outcome is handed to the recorder, so the next stream's request does not wait
	// for this one's fsync. unsettled counts the outcomes not yet back from the recorder (their
	// streams are busy until then; at most maxUnrecorded of them are deliveries); unsettledNow
	// is its value at the loop's last turn, for the starts from the hand-over.
	inflight     atomic.Int64
	unsettled    int
	unsettledNow atomic.Int64
	jobs         sync.WaitGroup
	// A worker that finished frees its slot and wakes the loop on freed only when the loop
	// asked for it (wantSlot: every slot was taken when it last dispatched). With slots to
	// spare no head waits for one, so a finished request costs the loop no turn of its own:
	// the outcome's record, which the loop waits for anyway, brings it round (one goroutine
	// hand-off per delivery fewer at 1,000 events/s, where the limit is never reached).
	wantSlot atomic.Bool
	freed    chan struct{} // worker → loop: a slot is free and the loop wants one (capacity 1)
	work     chan job      // loop → an idle worker (unbuffered: taken only by one waiting for it)
	// retire is closed when the outbox goes idle: the workers waiting for a job end (nil: idle).
	retire   atomic.Pointer[chan struct{}]
	toRec    *mailbox      // workers → recorder
	fromRec  *mailbox      // recorder → loop
	recorded []outcome     // take's buffer for fromRec
	recStop  chan struct{} // closed by settle: the recorder returns once its mailbox is empty
	recDone  chan struct{}

	// Enrichment jobs (at most EnrichConcurrency) come back on fromEnrich with the body in
	// memory: a head's is delivered next, one ahead of the head waits in its stream's done map;
	// either is stored with the event's first attempt's record.
	enriching   int
	enrichFreed chan struct{}
	fromEnrich  chan outcome
}

func (o *Outbox) newLoop(ctx context.Context) *loop {
	l := &loop{
		o: o, ctx: ctx, streams: map[string]*stream{}, skipLogged: time.Now(), deliveredSince: time.Now(), scanDue: true,
		limit: min(o.cfg.Concurrency, startInFlight),
		// Every slot freed fits in the channel, and the mailboxes never block, so neither a
		// worker nor the recorder ever waits for a loop that is busy elsewhere, nor a worker
		// for the recorder.
		freed:       make(chan struct{}, 1),
		work:        make(chan job),
		toRec:       newMailbox(),
		fromRec:     newMailbox(),
		recStop:     make(chan struct{}),
		recDone:     make(chan struct{}),
		enrichFreed: make(chan struct{}, o.cfg.EnrichConcurrency),
		fromEnrich:  make(chan outcome, o.cfg.EnrichConcurrency),
	}
	l.limitNow.Store(int64(l.limit))
	o.m.inflightLimit.Set(float64(l.limit))
	return l
}

// Run delivers events until ctx is done, then cancels the requests in flight, records the
// outcomes already known, waits for its goroutines and returns. An event whose request was
// cancelled by the shutdown is not counted as an attempt; it is sent again on the next Run.
func (o *Outbox) Run(ctx context.Context) {
	o.running.Lock()
	defer o.running.Unlock()
	defer o.client.CloseIdleConnections()
	defer o.burst.CloseIdleConnections()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if o.fast != nil {
		// Stopping closes the poster's connections: a request in flight ends at once.
		o.fast.start()
		defer o.fast.stop()
		defer context.AfterFunc(ctx, o.fast.stop)()
	}
	l := o.newLoop(ctx)
	go func() { defer close(l.recDone); o.recorder(l.toRec, l.fromRec, l.recStop) }()
	defer func() {
		cancel()
		l.o.hand.detach(l) // no start from the hand-over from now on
		l.settle()
		l.releaseHeld()
		l.summarise(time.Now(), true)
		if o.claimer != nil {
			o.releaseClaims()
		}
	}()

	l.rebuild()
	l.o.hand.attach(l)

	var lastPrune, lastGauges time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		o.turns.Add(1)
		now := o.cfg.Clock()
		if now.Sub(lastPrune) >= o.cfg.PruneEvery || now.Before(lastPrune) {
			// On an error too, the next try is PruneEvery later: pruning is housekeeping and
			// must not spin.
			lastPrune = now
			o.prune(now)
		}
		// From a shared database (replicas) the scan is a query: it runs when new events may
		// have come (a Notify, the poll timer, a full scan before), not after every outcome.
		// With the hand-over, the events the group commit handed over are taken in without a
		// read, and the store is scanned only when they leave a gap, after a Notify, and
		// once every handScanEvery (handover.go).
		handOver := l.handOver()
		if handOver && (l.intake() || time.Since(l.lastScan) >= o.handScanEvery) {
			l.scanDue = true
		}
		if (l.o.claimer == nil && !handOver) || l.scanDue || l.more {
			l.scanDue = false
			if handOver {
				// No delivery is started from the hand-over until the loop has taken in what
				// the scan finds (resync), and those started until now are taken in first:
				// the scan must not take one of them for a new event.
				l.o.hand.unsync()
				l.intake()
			}
			l.scan()
			l.lastScan = time.Now()
		}
		l.due(now)
		l.dispatch(now)
		l.unsettledNow.Store(int64(l.unsettled))
		if handOver {
			l.resync()
		}
		// From a shared database (replicas) the gauges are a query: once a poll at most.
		if o.claimer == nil || now.Sub(lastGauges) >= pollEvery || now.Before(lastGauges) {
			o.updateGauges()
			lastGauges = now
		}
		l.summarise(time.Now(), false)
		l.shedWhenIdle(time.Now())

		timer.Reset(l.sleepFor(now, lastPrune))
		if !l.await(timer.C) {
			return
		}
	}
}

// settle runs at shutdown, after the loop's context is cancelled: the workers return at once
// now, and their outcomes are still recorded. It waits for every worker and the recorder.
func (l *loop) settle() {
	if l.handOver() {
		l.intake() // the deliveries the hand-over started count as unsettled
	}
	for l.unsettled > 0 {
		l.take(nil, nil, nil) // outcomes and freed slots only
	}
	l.jobs.Wait()
	close(l.recStop)
	<-l.recDone
}

// prune removes the delivered events older than the retention.
func (o *Outbox) prune(now time.Time) {
	if n, err := o.q.Prune(now.Add(-o.cfg.Retention)); err != nil {
		o.log.Error("outbox: pruning delivered events", "err", err)
	} else if n > 0 {
		o.log.Debug("outbox: pruned delivered events", "count", n)
	}
}

// sleepFor is how long the loop may sleep unless woken (Notify, an outcome, shutdown): until the
// next due time, the next prune at the latest, or the earliest scheduled wake-up.
func (l *loop) sleepFor(now, lastPrune time.Time) time.Duration {
	wait := max(0, lastPrune.Add(l.o.cfg.PruneEvery).Sub(now))
	if l.more {
		wait = 0
	}
	if l.o.claimer != nil {
		// Other replicas commit and deliver too: look for their events, and retry the heads
		// they held, at least every pollEvery.
		wait = min(wait, pollEvery)
	}
	if l.delivered > 0 {
		wait = min(wait, max(0, time.Until(l.deliveredSince.Add(l.o.summaryEvery))))
	}
	if l.handOver() {
		wait = min(wait, max(0, time.Until(l.lastScan.Add(l.o.handScanEvery))))
	}
	if len(l.wall) > 0 {
		wait = min(wait, max(0, l.wall[0].at.Sub(now)))
	}
	if len(l.mono) > 0 {
		wait = min(wait, max(0, time.Until(l.mono[0].at)))
	}
	if !l.idleSince.IsZero() {
		wait = min(wait, max(0, time.Until(l.idleSince.Add(l.o.idleLinger))))
	}
	return wait
}

// await sleeps until something happens: an outcome (taken), a freed slot, Notify or the timer.
// It reports false when the loop's context is done.
func (l *loop) await(timer <-chan time.Time) bool {
	// Every slot taken at the dispatch: a worker finishing must wake the loop (wantSlot). A
	// slot freed after the dispatch and before wantSlot was set is seen here instead: either
	// the worker's release comes before this load, or its check of wantSlot comes after the
	// store.
	l.wantSlot.Store(l.slotsFull)
	if l.slotsFull && l.inflight.Load() < int64(l.limit) {
		return l.ctx.Err() == nil
	}
	return l.take(l.ctx.Done(), l.o.wake, timer)
}

// take waits for one thing to happen and takes it: an outcome (with every other outcome already
// recorded), a freed slot, a wake-up or the timer. It reports false when done is closed. A nil
// channel is never ready: settle waits on outcomes and slots alone.
func (l *loop) take(done <-chan struct{}, wake <-chan struct{}, timer <-chan time.Time) bool {
	select {
	case <-done:
		return false
	case <-l.fromRec.ready:
		// Every outcome recorded so far, before the next turn. The hand-over first: an
		// outcome may be of a delivery started from it (startHanded), whose stream the loop
		// takes in from there.
		if l.handOver() && l.intake() {
			l.scanDue = true
		}
		l.recorded = l.fromRec.take(l.recorded[:0], 0)
		for _, r := range l.recorded {
			l.finish(r)
		}
		clear(l.recorded)
	case r := <-l.fromEnrich:
		l.finish(r)
	case <-l.freed:
		// A slot is free (inflight): the next turn's dispatch takes it.
	case <-l.enrichFreed:
		l.enriching--
	case <-wake:
		// A Notify asks for a scan; a hand-over (Committed) is taken by intake.
		l.scanDue = l.scanDue || l.o.scanAsked.Swap(false)
	case <-timer:
		// The store's new events are looked for at every turn, or with the hand-over every
		// handScanEvery (Run), or, with replicas, when the poll timer fires.
		l.scanDue = l.scanDue || !l.handOver()
	}
	return true
}

// rebuild fills the queues from the store's stream index: keys only, no record is decoded. A
// head's header is read when the stream is first dispatched.
func (l *loop) rebuild() {
	last, err := l.o.q.PendingIndex(func(name string, seq uint64) {
		s := l.stream(name)
		s.queue = append(s.queue, seq)
	})
	if err != nil {
		// The queues stay empty; every event is still found by the scan from 0, just with its
		// header decoded.
		l.o.log.Error("outbox: reading the queue index", "err", err)
		l.streams, l.last = map[string]*stream{}, 0
		return
	}
	l.last = last
	for _, s := range l.streams {
		l.makeReady(s)
	}
}

// forgetStream deletes a stream with nothing pending from l.streams. While the hand-over can
// start deliveries (startHanded, on the group writer), which looks streams up in l.streams under
// the hand-over's lock, the loop deletes them under it (it adds them only while holding it, or
// while no start is possible: rebuild, scan; its own reads need no lock, it is the only writer).
func (l *loop) forgetStream(name string) {
	if !l.handOver() {
		delete(l.streams, name)
		return
	}
	l.o.hand.mu.Lock()
	delete(l.streams, name)
	l.o.hand.mu.Unlock()
}

func (l *loop) stream(name string) *stream {
	s := l.streams[name]
	if s == nil {
		s = &stream{name: name}
		l.streams[name] = s
	}
	return s
}

// scan takes the events committed since the last scan into their streams' queues: a cursor
// seek past the last known sequence number, so the cost is that of the new events only.
func (l *loop) scan() {
	evs, err := l.o.q.PendingAfter(l.last, scanLimit)
	if err != nil {
		l.o.log.Error("outbox: reading new events", "err", err)
		l.more = false
		return
	}
	l.more = len(evs) == scanLimit
	for i := range evs {
		e := &evs[i]
		l.last = max(l.last, e.Seq)
		l.takeIn(e, false)
	}
}

// takeIn queues e, committed after every event queued so far, on its stream: as the head, with
// its header (and a handed-over body, or one held in l.mem), or behind it (a handed-over body
// held in l.mem until it is the head).
func (l *loop) takeIn(e *store.Event, handed bool) {
	s := l.stream(e.Stream)
	if n := len(s.queue); n > 0 && s.queue[n-1] >= e.Seq {
		if handed {
			l.o.hand.release(len(e.Body))
		}
		return // already queued (sequence numbers only grow)
	}
	s.queue = append(s.queue, e.Seq)
	if len(s.queue) > 1 {
		if handed && e.Body != nil {
			l.hold(e)
		}
		l.maybeAhead(s)
		return
	}
	l.newHead(s)
	h := *e // a copy: a pointer into evs would keep the whole scan's array alive
	h.Body = nil
	s.head = &h
	switch {
	case handed && e.Body != nil:
		l.setHeld(s, e.Body)
	case !handed:
		l.fromMem(s) // handed over past a gap: its body was held for this scan
	}
	l.makeReady(s)
}

func (l *loop) makeReady(s *stream) {
	if s.ready || s.busy || len(s.queue) == 0 {
		return
	}
	s.ready = true
	l.ready = append(l.ready, s)
}

// schedule wakes s at wall time at, or after the real time d at the latest (the clock-step
// guard).
func (l *loop) schedule(s *stream, at time.Time, d time.Duration) { l.wakeAt(s, at, d, false) }

func (l *loop) wakeAt(s *stream, at time.Time, d time.Duration, claim bool) {
	s.gen++
	heap.Push(&l.wall, wakeAt{at: at, s: s, gen: s.gen, claim: claim})
	heap.Push(&l.mono, wakeAt{at: time.Now().Add(max(0, d)), s: s, gen: s.gen, claim: claim})
}

// due makes ready the streams whose wake-up came, by either clock.
func (l *loop) due(now time.Time) {
	pop := func(h *wakeHeap, reached func(time.Time) bool) {
		for len(*h) > 0 {
			w := (*h)[0]
			if w.gen != w.s.gen {
				heap.Pop(h) // stale
				continue
			}
			if !reached(w.at) {
				return
			}
			heap.Pop(h)
			w.s.gen++ // the entry in the other heap is stale now
			// By the monotonic clock a retry this process scheduled is due even when the wall
			// clock, stepped back, says it lies in the future.
			w.s.due = w.s.due || !w.claim
			l.makeReady(w.s)
		}
	}
	pop(&l.wall, func(at time.Time) bool { return !at.After(now) })
	mono := time.Now()
	pop(&l.mono, func(at time.Time) bool { return !at.After(mono) })
}

// dispatch looks at the ready streams' heads and starts workers while slots are free: delivery
// workers (at most Concurrency) on complete heads, enrichment workers (at most
// EnrichConcurrency) on heads whose body must first be completed from T3, and with the
// enrichment slots left, on events behind a complete head (ahead of delivery).
func (l *loop) dispatch(now time.Time) {
	cfg := l.o.cfg
	// Look at as many ready heads as there is room for; a head that must wait for a slot of
	// the other kind keeps its place at the back of the ready queue.
	// Heads put back count: while only enrichment has room, look at no more of them than it has
	// slots, so that a turn stays O(slots), not O(ready streams).
	putBack := 0
	// slotShort: a head may have been left waiting for a request slot, the slots and nothing
	// else being short (a worker freeing one must wake the loop: await; with too many outcomes
	// unrecorded, the records wake it).
	slotShort := false
	src := &l.ready
	if l.o.claimer != nil {
		l.claimReady(now)
		src = &l.claimed
	}
	for n := len(*src); n > 0 && len(*src) > 0 && l.ctx.Err() == nil && putBack < cfg.EnrichConcurrency; n-- {
		slotsLeft := int(l.inflight.Load())+len(l.toDeliver) < l.limit
		deliverRoom := slotsLeft && l.unsettled < l.o.unrecordedMax
		slotShort = slotShort || (!slotsLeft && l.unsettled < l.o.unrecordedMax)
		enrichRoom := cfg.Enricher != nil && l.enriching+len(l.toEnrich) < cfg.EnrichConcurrency
		if !deliverRoom && !enrichRoom {
			break
		}
		s := pop(src)
		s.ready = false
		if !l.lookAt(s, now) {
			continue
		}
		switch {
		case !l.needsEnrich(s) && deliverRoom:
			s.ready = true
			l.toDeliver = append(l.toDeliver, s)
		case l.needsEnrich(s) && s.enriching:
			// The stage ahead is completing this very event; its outcome makes s ready again.
		case l.needsEnrich(s) && enrichRoom:
			s.ready = true
			l.toEnrich = append(l.toEnrich, s)
		case l.o.claimer != nil:
			l.keepClaimed(s) // claim.go: it waits claimed, not claimed again next turn
			putBack++
		default:
			if !s.enriched && s.held == 0 {
				// Read again when its turn comes: a waiting head holds no body, unless it is
				// a handed-over one within the hand-over's budget.
				s.body = nil
			}
			l.makeReady(s)
			putBack++
		}
	}
	for len(l.toDeliver) > 0 && l.unsettled < l.o.unrecordedMax && l.ctx.Err() == nil && l.takeSlot() {
		s := pop(&l.toDeliver)
		s.ready = false
		l.startDelivery(s)
	}
	// Heads left waiting for a slot: a freed slot must wake the loop (await). Decided by what
	// this dispatch saw, not by the count now: a slot freed since it looked is seen by await.
	if len(l.toDeliver) > 0 && l.unsettled < l.o.unrecordedMax {
		slotShort = true // takeSlot found every slot taken
	}
	waiting := len(*src) > 0 || len(l.toDeliver) > 0
	l.slotsFull = waiting && slotShort
	// Every request slot taken and heads still waiting: the limit may grow (adapt).
	l.saturated = int(l.inflight.Load()) >= l.limit && waiting
	for l.enriching < cfg.EnrichConcurrency && len(l.toEnrich) > 0 && l.ctx.Err() == nil {
		s := pop(&l.toEnrich)
		s.ready = false
		l.startEnrich(s, 0)
	}
	for l.enriching < cfg.EnrichConcurrency && len(l.ahead) > 0 && l.aheadBytes < aheadBudget && l.ctx.Err() == nil {
		s := pop(&l.ahead)
		s.inAhead = false
		for s.known < len(s.queue) && s.known > 0 {
			if _, ok := s.done[s.queue[s.known]]; !ok {
				break
			}
			s.known++ // completed already (the queue changed under it)
		}
		if l.canEnrichAhead(s) {
			l.startEnrich(s, s.known)
		}
	}
	// Drop the consumed front of the queues' backing arrays now and then.
	for _, q := range []*[]*stream{&l.ready, &l.toDeliver, &l.toEnrich, &l.ahead, &l.claimed} {
		if cap(*q) > 1024 && len(*q) < cap(*q)/4 {
			*q = slices.Clone(*q)
		}
	}
}

// pop takes the first stream of a FIFO queue.
func pop(q *[]*stream) *stream {
	s := (*q)[0]
	(*q)[0] = nil // the backing array must not keep it
	*q = (*q)[1:]
	return s
}

// lookAt reads s's head header (and its body with it, in the same read) when the loop does not
// hold it yet, and reports whether the head is to be started now: false when s has nothing
// pending (it is forgotten), when the store failed (retried later) or when the head is not due
// yet (s is woken when it is).
func (l *loop) lookAt(s *stream, now time.Time) bool {
	if len(s.queue) == 0 {
		if !s.enriching {
			l.forgetStream(s.name)
		}
		return false
	}
	if (s.head == nil || s.body == nil) && !s.enriched {
		l.fromMem(s) // handed over by the group commit and held since: no read of the store
	}
	if s.head == nil {
		e, err := l.o.q.PendingEvent(s.queue[0], true)
		if errors.Is(err, store.ErrNotPending) {
			// Not pending any more (never the case while this process is the only writer):
			// drop it rather than block the stream.
			l.notPending(s.name, s.queue[0], err)
			l.unhold(s.queue[0])
			s.queue = s.queue[1:]
			s.known = max(0, s.known-1)
			l.newHead(s)
			l.makeReady(s)
			return false
		}
		if err != nil {
			l.o.log.Error("outbox: reading the queue", "stream", s.name, "err", err)
			l.schedule(s, now.Add(storePause), storePause)
			return false
		}
		// Kept for the worker (sent as it is, or the facts to complete), so that it need not
		// read the event again; a body completed in memory stays.
		if !s.enriched {
			s.body = e.Body
		}
		e.Body = nil
		s.head = &e
	}
	if !s.due && s.head.NextAttempt.After(now) {
		if !s.enriched {
			l.dropHeld(s)
			s.body = nil // read again when due: a waiting head holds no body
		}
		l.schedule(s, s.head.NextAttempt, s.head.NextAttempt.Sub(now))
		return false
	}
	return true
}

// needsEnrich reports whether s's head must be completed from T3 before its first attempt.
func (l *loop) needsEnrich(s *stream) bool {
	return l.o.cfg.Enricher != nil && s.known == 0 && !s.enriched && s.head.Enrich
}

func (l *loop) startDelivery(s *stream) {
	s.due = false
	s.known = max(s.known, 1) // complete: its body is sent as it is
	if s.bo == nil {
		s.bo = advanced(l.o.cfg.Backoff, s.head.Attempts)
	}
	if s.ebo == nil {
		s.ebo = l.o.cfg.Backoff.NewBackOff()
	}
	s.busy = true
	l.unsettled++
	j := job{s: s, seq: s.queue[0], bo: s.bo, client: l.o.client, head: *s.head, body: s.body, enriched: s.enriched, ebo: s.ebo, ticket: l.tickets.Add(1)}
	l.dropHeld(s)
	s.body = nil                          // the job's now; an enriched one comes back stored with the attempt's record
	if l.inflight.Load() > baseRequests { // baseRequests others are running already (this one counted)
		j.client = l.o.burst
		l.burstUsed = l.o.burst != l.o.client
	}
	if l.retire.Load() == nil {
		r := make(chan struct{})
		l.retire.Store(&r)
	}
	select {
	case l.work <- j: // an idle worker took it
	default:
		l.jobs.Add(1)
		l.o.workers.Add(1)
		go l.worker(j)
	}
	l.maybeAhead(s) // its next events can be completed while this one is sent
}

// takeSlot takes a slot for a request if one is free (fewer than limit in flight). The loop's
// dispatch and the hand-over's direct starts (startHanded, on the group writer) both take them.
func (l *loop) takeSlot() bool {
	for {
		n := l.inflight.Load()
		if n >= l.limitNow.Load() {
			return false
		}
		if l.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// freeSlot gives a slot back, and wakes the loop when it asked for one (wantSlot: every slot was
// taken at its last dispatch).
func (l *loop) freeSlot() {
	l.inflight.Add(-1)
	if l.wantSlot.CompareAndSwap(true, false) {
		l.o.slotWakes.Add(1)
		select {
		case l.freed <- struct{}{}:
		default: // a wake-up is pending already
		}
	}
}

// idleLinger is how long the loop must find nothing to deliver and nothing in flight before it
// ends its waiting delivery workers and drops the burst client's idle connections, so that an
// idle outbox keeps neither. Doing so at every idle turn, as it once did, did it many times a
// second under a steady stream of events (at 1,000 transitions/s the queue empties between two
// group commits): the next commit's events then started new workers, whose stacks grew again
// through the HTTP client, and the burst client dialled new connections to the receiver, in a
// latency-phase trace one POST in thirty, each a connect and an accept on the event's way, its
// latency's tail. A second or two of idleness is long for a stream of events and short for an
// idle connector.
const idleLinger = 2 * time.Second

// shedWhenIdle ends the waiting workers and drops the burst's idle connections once the loop has
// had nothing to deliver and nothing in flight for idleLinger (sleepFor wakes it then, once); any
// work in between starts the count again.
func (l *loop) shedWhenIdle(now time.Time) {
	if l.inflight.Load() != 0 || l.unsettled != 0 || len(l.ready) != 0 || len(l.toDeliver) != 0 {
		l.idleSince = time.Time{}
		return
	}
	if l.retire.Load() == nil && !l.burstUsed {
		l.idleSince = time.Time{} // nothing to shed: no timer
		return
	}
	if l.idleSince.IsZero() {
		l.idleSince = now
	}
	if l.o.onIdle != nil {
		l.o.onIdle()
	}
	if now.Sub(l.idleSince) < l.o.idleLinger {
		return
	}
	l.idleSince = time.Time{}
	l.retireIdleWorkers() // no idle worker waits for a next job
	if l.burstUsed {
		l.burstUsed = false
		l.o.burst.CloseIdleConnections()
	}
}

// retireIdleWorkers ends the delivery workers waiting for a job, and those about to wait (they
// see the closed channel), so that an idle outbox keeps no goroutines of a burst.
func (l *loop) retireIdleWorkers() {
	if r := l.retire.Load(); r != nil {
		close(*r)
		l.retire.Store(nil)
	}
}

// workerIdle is how long a delivery worker waits for its next job before it ends.
const workerIdle = 30 * time.Second

// worker delivers j, then every job handed to it on l.work until it has waited workerIdle for one
// or the loop stops. The workers outlive their jobs so that a delivery runs on a stack grown
// already: a goroutine per job grew its stack through the store read, the signing and the HTTP
// client every time (4.4 % of the process's CPU in the throughput phase's profile).
func (l *loop) worker(j job) {
	defer l.jobs.Done()
	defer l.o.workers.Add(-1)
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		r := l.o.work(l.ctx, j)
		r.job.body = nil // sent: what is still to store is in the op
		// The slot is counted free before the outcome goes to the recorder, so that the loop
		// sees it free by the time the outcome comes back recorded.
		l.freeSlot()
		l.toRec.put(r)
		idle.Reset(workerIdle)
		var retired <-chan struct{}
		if r := l.retire.Load(); r != nil {
			retired = *r
		} else {
			return // the outbox went idle meanwhile
		}
		l.o.idleWorkers.Add(1)
		select {
		case j = <-l.work:
			l.o.idleWorkers.Add(-1)
		case <-retired:
			l.o.idleWorkers.Add(-1)
			return
		case <-idle.C:
			l.o.idleWorkers.Add(-1)
			return
		case <-l.ctx.Done():
			l.o.idleWorkers.Add(-1)
			return
		}
	}
}

// startEnrich starts the enrichment of s.queue[i]: the head's (i == 0: with retries and the
// partial body at EnrichTimeout, the head waits for it) or, ahead of the head, one try whose
// body is stored for later.
func (l *loop) startEnrich(s *stream, i int) {
	s.enriching = true
	l.enriching++
	l.unsettled++
	l.jobs.Add(1)
	j := job{s: s, seq: s.queue[i]}
	if i == 0 {
		s.due = false
		if s.ebo == nil {
			s.ebo = l.o.cfg.Backoff.NewBackOff()
		}
		s.busy = true
		j.enrich, j.head, j.body, j.ebo = true, *s.head, s.body, s.ebo
		l.dropHeld(s)
		s.body = nil
		go func() {
			defer l.jobs.Done()
			l.fromEnrich <- l.o.enrichHead(l.ctx, j)
			l.enrichFreed <- struct{}{}
		}()
		return
	}
	j.ahead = true
	if e, ok := l.mem[j.seq]; ok {
		// Handed over and held: the facts to complete, without a read (the held copy stays
		// for the head's turn, should this completion fail).
		j.body = e.Body
		e.Body = nil
		j.head = e
	}
	go func() {
		defer l.jobs.Done()
		l.fromEnrich <- l.o.enrichAhead(l.ctx, j)
		l.enrichFreed <- struct{}{}
	}()
}

// canEnrichAhead reports whether s has an event behind its complete head that the stage ahead
// should complete now.
func (l *loop) canEnrichAhead(s *stream) bool {
	return l.o.cfg.Enricher != nil && !s.enriching && !s.aheadFail && s.known >= 1 && s.known < len(s.queue)
}

// maybeAhead queues s for the stage ahead when it has work there.
func (l *loop) maybeAhead(s *stream) {
	if !s.inAhead && l.canEnrichAhead(s) {
		s.inAhead = true
		l.ahead = append(l.ahead, s)
	}
}

// finish takes an outcome back into the stream's state: a delivery's or an enrichment's ahead
// once recorded, a head's enrichment as soon as it is known.
func (l *loop) finish(r outcome) {
	l.unsettled--
	s := r.job.s
	switch {
	case r.job.ahead:
		l.finishAhead(s, r)
		return
	case r.job.enrich:
		l.finishEnrich(s, r)
		return
	}
	s.busy = false
	switch {
	case r.cancelled:
		// Shutting down: nothing happened that needs a record (beyond an enriched body).
	case r.err != nil && (errors.Is(r.err, store.ErrNotPending) || errors.Is(r.err, store.ErrNotFound)):
		l.notPending(s.name, r.job.seq, r.err)
		l.advance(s, r.job.seq)
	case r.err != nil:
		// Not recorded (or not even read): the event stays pending as it was and is attempted again (at least once,
		// never lost), but not at once: a store that cannot record (a full disk) would otherwise
		// have the receiver get the same event again and again without a pause.
		l.o.log.Error("outbox: recording the attempt", "stream", s.name, "seq", r.job.seq, "err", r.err)
		l.newHead(s)
		s.known = 0 // read again from the store, which says what is complete
		l.schedule(s, l.o.cfg.Clock().Add(storePause), storePause)
	case r.final:
		l.advance(s, r.job.seq)
		if r.delivered {
			l.receiverUp()
			l.adapt(true, r.job.ticket)
			l.delivered++
			l.maxLag = max(l.maxLag, r.lag)
		}
	default: // retry
		if r.overload {
			l.adapt(false, r.job.ticket)
		}
		if len(s.queue) == 0 || s.queue[0] != r.job.seq {
			l.makeReady(s) // the head changed meanwhile
			return
		}
		h := r.event
		s.head = &h
		l.dropHeld(s)
		s.body, s.enriched = nil, false // stored with the attempt's record; read again when due
		l.schedule(s, r.retryAt, r.retryIn)
		if r.outage {
			l.receiverFailed(s)
		}
	}
}

// finishEnrich takes back a head's enrichment: its body is delivered next, or the head waits for
// the next try.
func (l *loop) finishEnrich(s *stream, r outcome) {
	s.busy, s.enriching = false, false
	switch {
	case r.cancelled:
	case r.err != nil && (errors.Is(r.err, store.ErrNotPending) || errors.Is(r.err, store.ErrNotFound)):
		l.notPending(s.name, r.job.seq, r.err)
		l.advance(s, r.job.seq)
	case r.err != nil:
		l.o.log.Error("outbox: reading the event to complete it", "stream", s.name, "seq", r.job.seq, "err", r.err)
		l.newHead(s)
		l.schedule(s, l.o.cfg.Clock().Add(storePause), storePause)
	case len(s.queue) == 0 || s.queue[0] != r.job.seq:
		l.makeReady(s) // the head changed meanwhile; this one is completed again later
	case r.body != nil:
		s.body, s.enriched = r.body, true
		s.known = max(s.known, 1)
		l.makeReady(s)
	default: // T3 could not be read: try again at retryAt
		l.schedule(s, r.retryAt, r.retryIn)
	}
}

// finishAhead takes back an enrichment ahead of the head: the complete body waits in the
// stream's done map (or is the head's, when the head came to it meanwhile).
func (l *loop) finishAhead(s *stream, r outcome) {
	s.enriching = false
	i := slices.Index(s.queue, r.job.seq)
	switch {
	case r.cancelled || i < 0:
	case r.err != nil || r.failed:
		// The head's own enrichment tries again, with backoff and the partial body, when this
		// event is the head; until the head moves on nothing more is tried ahead.
		s.aheadFail = true
		switch {
		case r.err != nil && l.o.claimer != nil && errors.Is(r.err, store.ErrNotPending):
			// Another replica delivered it meanwhile: normal with replicas; the claim of the
			// stream's head drops it from the queue.
			l.o.log.Debug("outbox: an event to complete ahead of delivery was delivered by another replica", "stream", s.name, "seq", r.job.seq)
		case r.err != nil:
			l.o.log.Warn("outbox: completing an event ahead of delivery", "stream", s.name, "seq", r.job.seq, "err", r.err)
		}
	case r.body == nil: // complete in the store already
		if i == s.known {
			s.known++
		}
	case i == 0: // it is the head now, waiting for this
		h := r.event
		l.dropHeld(s)
		s.head, s.body, s.enriched = &h, r.body, true
		s.known = max(s.known, 1)
	default:
		if s.done == nil {
			s.done = map[uint64]store.Event{}
		}
		ev := r.event
		ev.Body = r.body
		s.done[r.job.seq] = ev
		l.aheadBytes += len(r.body)
		if i == s.known {
			s.known++
		}
	}
	switch {
	case len(s.queue) == 0 && !s.ready && !s.busy:
		l.forgetStream(s.name)
	case i == 0 && !s.busy:
		l.makeReady(s) // the head was waiting for this
	}
	l.maybeAhead(s)
}

// aheadBudget bounds the bytes of bodies completed ahead of delivery and held in memory; past
// it the stage ahead pauses until deliveries consume some.
const aheadBudget = 32 << 20

// baseRequests is how many requests in flight use the base client's connections (see New).
const baseRequests = 2

// startInFlight is where the limit on requests in flight starts (Concurrency when lower), and
// the least it is halved to: what a receiver is sent at once before it has shown it keeps up.
const startInFlight = 32

// adapt moves the limit on requests in flight with what the receiver shows: a delivery while
// heads waited for a slot raises it by one (so it doubles over a round trip of full slots, up to
// Concurrency); a failure that says the receiver is overloaded or down (no answer, 408, 429, 5xx)
// halves it, down to startInFlight, once for the requests in flight then. So the requests in
// flight follow the backlog while the receiver keeps up — a round trip made long by a busy host
// no longer caps delivery at Concurrency/round trip — and fall back when it does not.
func (l *loop) adapt(delivered bool, ticket uint64) {
	cfg := l.o.cfg
	switch {
	case delivered && l.saturated && l.limit < cfg.Concurrency:
		l.limit++
	case !delivered && ticket > l.shrunkAt && l.limit > min(cfg.Concurrency, startInFlight):
		l.limit = max(min(cfg.Concurrency, startInFlight), l.limit/2)
		l.shrunkAt = l.tickets.Load()
	default:
		return
	}
	l.limitNow.Store(int64(l.limit))
	l.o.m.inflightLimit.Set(float64(l.limit))
}

// outageAfter is how many failed attempts in a row make an outage of the receiver.
const outageAfter = 5

func (l *loop) receiverFailed(s *stream) {
	l.failsInARow++
	if l.failsInARow >= outageAfter && !l.outage {
		l.outage = true
		l.o.log.Warn("outbox: the receiver is failing for every thread; retrying with backoff until it answers again", "failed_in_a_row", l.failsInARow)
	}
	if !s.waitsOutOutage {
		s.waitsOutOutage = true
		l.outageWaiters = append(l.outageWaiters, s)
	}
}

func (l *loop) receiverUp() {
	l.failsInARow = 0
	if len(l.outageWaiters) == 0 {
		return
	}
	// Not an outage (a success came before enough failures): the waiters keep their backoff.
	// Either way the list starts over; it holds the failures since the last success only.
	wasOutage := l.outage
	l.outage = false
	woken := 0
	for _, s := range l.outageWaiters {
		if !s.waitsOutOutage {
			continue // its head changed since
		}
		s.waitsOutOutage = false
		if !wasOutage || s.busy || s.ready {
			continue
		}
		s.gen++ // its scheduled retry is stale now
		s.due = true
		l.makeReady(s)
		woken++
	}
	l.outageWaiters = l.outageWaiters[:0]
	if wasOutage {
		l.o.log.Info("outbox: the receiver answers again; retrying the waiting threads now", "threads", woken)
	}
}

// advance moves s past seq once it is delivered or dead.
func (l *loop) advance(s *stream, seq uint64) {
	l.unhold(seq)
	switch i := slices.Index(s.queue, seq); {
	case i == 0:
		s.queue = s.queue[1:] // the usual case: O(1), a long backlog is not shifted
		s.known = max(0, s.known-1)
	case i > 0:
		s.queue = slices.Delete(s.queue, i, i+1)
		if i < s.known {
			s.known--
		}
		if ev, ok := s.done[seq]; ok {
			delete(s.done, seq)
			l.aheadBytes -= len(ev.Body)
		}
	}
	l.newHead(s)
	s.aheadFail = false
	if len(s.queue) > 0 {
		if ev, ok := s.done[s.queue[0]]; ok { // completed ahead: delivered without reading T3 or the store
			delete(s.done, s.queue[0])
			l.aheadBytes -= len(ev.Body)
			s.body, s.enriched = ev.Body, true
			ev.Body = nil
			s.head = &ev
			s.known = max(s.known, 1)
		}
	}
	if len(s.queue) == 0 {
		if !s.ready && !s.enriching {
			l.forgetStream(s.name)
		}
		return
	}
	l.makeReady(s)
	l.maybeAhead(s)
}

// summaryEvery is how often, at most, the outbox sums up its deliveries in an Info line.
const summaryEvery = time.Minute

// summarise logs, once per summaryEvery while events are delivered, how many were delivered since
// the last summary and the longest lag among them (an event's time in T3 to its delivery): the
// operator's view of a working outbox at Info, where a line per event would cost a write under
// the log handler's mutex for every event (each one is logged at Debug, "event delivered").
// At shutdown (final) the deliveries not summed up yet are.
func (l *loop) summarise(now time.Time, final bool) {
	if l.delivered == 0 {
		l.deliveredSince = now // the next summary covers a minute from the first delivery on
		return
	}
	if now.Sub(l.deliveredSince) < l.o.summaryEvery && !final {
		return
	}
	l.o.log.Info("outbox: events delivered", "count", l.delivered, "since", l.deliveredSince.UTC().Format(time.RFC3339), "max_lag_ms", l.maxLag.Milliseconds())
	l.delivered, l.maxLag, l.deliveredSince = 0, 0, now
}

func (o *Outbox) updateGauges() {
	p, d, _, err := o.q.Counts()
	if err != nil {
		return
	}
	o.m.pending.Set(float64(p))
	o.m.dead.Set(float64(d))
}
