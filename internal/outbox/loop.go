package outbox

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
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
	ready bool         // in the ready queue
	due   bool         // its scheduled wake-up came: start the head even if NextAttempt says later
	gen   uint64       // bumped whenever a scheduled wake-up of this stream becomes stale

	// waitsOutOutage: the head waits for a retry after a failure of the receiver as a whole
	// (no answer, a 5xx without Retry-After); it is in loop.outageWaiters.
	waitsOutOutage bool

	bo  backoff.BackOff // delivery delays of the current head, created at its first dispatch
	ebo backoff.BackOff // enrichment delays of the current head
}

// newHead forgets everything about the previous head.
func (s *stream) newHead() {
	s.head, s.bo, s.ebo, s.due, s.waitsOutOutage = nil, nil, nil, false, false
	s.gen++
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
	wall    wakeHeap  // by the injected clock
	mono    wakeHeap  // by the real monotonic clock (time.Now with its monotonic reading)
	last    uint64    // the highest sequence number taken into the queues
	more    bool      // the last scan hit scanLimit: look again without sleeping

	// Receiver outages. After outageAfter failed attempts in a row (across all streams) with no
	// success between them, the receiver counts as down; the first delivery after that ends the
	// outage and wakes every head waiting out a retry of it at once, instead of each one waiting
	// for its backoff (up to 5 minutes): the backlog an outage leaves drains as soon as the
	// receiver is back. One failing thread among working ones never counts as an outage (the
	// others' successes reset the count), so its backoff stands.
	failsInARow   int
	outage        bool
	outageWaiters []*stream

	// inflight counts the workers (at most Concurrency: the bound on requests in flight); a
	// worker frees its slot once its outcome is handed to the recorder, so the next stream's
	// request does not wait for this one's fsync. unsettled counts the outcomes not yet back
	// from the recorder (their streams are busy until then).
	inflight  int
	unsettled int
	jobs      sync.WaitGroup
	freed     chan struct{} // worker → loop: a slot is free
	toRec     chan outcome  // workers → recorder
	fromRec   chan outcome  // recorder → loop
	recDone   chan struct{}
}

func (o *Outbox) newLoop(ctx context.Context) *loop {
	return &loop{
		o: o, ctx: ctx, streams: map[string]*stream{},
		// Every outcome in flight fits in either channel, so neither a worker nor the recorder
		// ever blocks on a loop that is busy elsewhere.
		freed:   make(chan struct{}, o.cfg.Concurrency),
		toRec:   make(chan outcome, o.cfg.Concurrency),
		fromRec: make(chan outcome, o.cfg.Concurrency),
		recDone: make(chan struct{}),
	}
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
	l := o.newLoop(ctx)
	go func() { defer close(l.recDone); o.recorder(l.toRec, l.fromRec) }()
	defer func() {
		cancel()
		for l.unsettled > 0 { // the workers return at once now; their outcomes are still recorded
			select {
			case r := <-l.fromRec:
				l.finish(r)
			case <-l.freed:
				l.inflight--
			}
		}
		l.jobs.Wait()
		close(l.toRec)
		<-l.recDone
	}()

	// A requeue before this point is in the index already; dropping the list avoids nothing but
	// work (putting an event in twice is harmless).
	o.requeuedMu.Lock()
	o.requeued = nil
	o.requeuedMu.Unlock()
	l.rebuild()

	var lastPrune time.Time
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := o.cfg.Clock()
		if now.Sub(lastPrune) >= pruneEvery || now.Before(lastPrune) {
			// On an error too, the next try is pruneEvery later: pruning is housekeeping and
			// must not spin.
			lastPrune = now
			if n, err := o.q.Prune(now.Add(-o.cfg.Retention)); err != nil {
				o.log.Error("outbox: pruning delivered events", "err", err)
			} else if n > 0 {
				o.log.Debug("outbox: pruned delivered events", "count", n)
			}
		}
		l.takeRequeued()
		l.scan()
		l.due(now)
		l.dispatch(now)
		o.updateGauges()
		if l.inflight == 0 && l.unsettled == 0 && len(l.ready) == 0 && o.burst != o.client {
			o.burst.CloseIdleConnections() // a no-op unless a burst left connections behind
		}

		// Sleep until woken (Notify, an outcome, shutdown) or the next due time: the next
		// prune at the latest, or the earliest scheduled wake-up.
		wait := max(0, lastPrune.Add(pruneEvery).Sub(now))
		if l.more {
			wait = 0
		}
		if len(l.wall) > 0 {
			wait = min(wait, max(0, l.wall[0].at.Sub(now)))
		}
		if len(l.mono) > 0 {
			wait = min(wait, max(0, time.Until(l.mono[0].at)))
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case r := <-l.fromRec:
			l.finish(r)
			// Take every outcome already recorded before the next turn.
			for drained := false; !drained; {
				select {
				case r := <-l.fromRec:
					l.finish(r)
				default:
					drained = true
				}
			}
		case <-l.freed:
			l.inflight--
		case <-o.wake:
		case <-timer.C:
		}
	}
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
		s := l.stream(e.Stream)
		if n := len(s.queue); n > 0 && s.queue[n-1] >= e.Seq {
			continue // already queued (sequence numbers only grow)
		}
		s.queue = append(s.queue, e.Seq)
		if len(s.queue) == 1 {
			s.newHead()
			h := *e // a copy: a pointer into evs would keep the whole scan's array alive
			s.head = &h
			l.makeReady(s)
		}
	}
}

// takeRequeued puts dead letters RetryDead moved back into their streams' queues, at their
// place by sequence number.
func (l *loop) takeRequeued() {
	l.o.requeuedMu.Lock()
	evs := l.o.requeued
	l.o.requeued = nil
	l.o.requeuedMu.Unlock()
	for _, e := range evs {
		s := l.stream(e.Stream)
		i, found := slices.BinarySearch(s.queue, e.Seq)
		if found {
			continue
		}
		if i == 0 && s.busy {
			i = 1 // the head in flight stays the head; the requeued event goes next
		}
		s.queue = slices.Insert(s.queue, i, e.Seq)
		if i == 0 {
			s.newHead() // a new head: whatever was scheduled for the old one is stale
			l.makeReady(s)
		}
	}
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
func (l *loop) schedule(s *stream, at time.Time, d time.Duration) {
	s.gen++
	heap.Push(&l.wall, wakeAt{at: at, s: s, gen: s.gen})
	heap.Push(&l.mono, wakeAt{at: time.Now().Add(max(0, d)), s: s, gen: s.gen})
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
			w.s.due = true
			l.makeReady(w.s)
		}
	}
	pop(&l.wall, func(at time.Time) bool { return !at.After(now) })
	mono := time.Now()
	pop(&l.mono, func(at time.Time) bool { return !at.After(mono) })
}

// dispatch starts workers on ready streams while fewer than Concurrency are in flight.
func (l *loop) dispatch(now time.Time) {
	for l.inflight < l.o.cfg.Concurrency && len(l.ready) > 0 && l.ctx.Err() == nil {
		s := l.ready[0]
		l.ready[0] = nil
		l.ready = l.ready[1:]
		s.ready = false
		if len(s.queue) == 0 {
			delete(l.streams, s.name)
			continue
		}
		if s.head == nil {
			e, err := l.o.q.PendingEvent(s.queue[0], false)
			if errors.Is(err, store.ErrNotPending) {
				// Not pending any more (never the case while this process is the only writer):
				// drop it rather than block the stream.
				l.o.log.Warn("outbox: a queued event is no longer pending; skipping it", "stream", s.name, "err", err)
				s.queue = s.queue[1:]
				s.newHead()
				l.makeReady(s)
				continue
			}
			if err != nil {
				l.o.log.Error("outbox: reading the queue", "stream", s.name, "err", err)
				l.schedule(s, now.Add(storePause), storePause)
				continue
			}
			s.head = &e
		}
		if !s.due && s.head.NextAttempt.After(now) {
			l.schedule(s, s.head.NextAttempt, s.head.NextAttempt.Sub(now))
			continue
		}
		s.due = false
		if s.bo == nil {
			s.bo = advanced(l.o.cfg.Backoff, s.head.Attempts)
		}
		if s.ebo == nil {
			s.ebo = l.o.cfg.Backoff.NewBackOff()
		}
		s.busy = true
		l.inflight++
		l.unsettled++
		l.jobs.Add(1)
		j := job{s: s, seq: s.queue[0], bo: s.bo, ebo: s.ebo, client: l.o.client}
		if l.inflight > baseRequests { // baseRequests others are running already (this one counted)
			j.client = l.o.burst
		}
		go func() {
			defer l.jobs.Done()
			l.toRec <- l.o.work(l.ctx, j)
			l.freed <- struct{}{}
		}()
	}
	// Drop the consumed front of the ready queue's backing array now and then.
	if cap(l.ready) > 1024 && len(l.ready) < cap(l.ready)/4 {
		l.ready = slices.Clone(l.ready)
	}
}

// finish takes a recorded outcome back into the stream's state.
func (l *loop) finish(r outcome) {
	l.unsettled--
	s := r.job.s
	s.busy = false
	log := l.o.log.With("stream", s.name, "seq", r.job.seq)
	switch {
	case r.cancelled:
		// Shutting down: nothing happened that needs a record (beyond an enriched body).
	case r.err != nil && (errors.Is(r.err, store.ErrNotPending) || errors.Is(r.err, store.ErrNotFound)):
		log.Warn("outbox: the event is no longer pending; skipping it", "err", r.err)
		l.advance(s, r.job.seq)
	case r.err != nil:
		// Not recorded (or not even read): the event stays pending as it was and is attempted again (at least once,
		// never lost), but not at once: a store that cannot record (a full disk) would otherwise
		// have the receiver get the same event again and again without a pause.
		log.Error("outbox: recording the attempt", "err", r.err)
		s.newHead()
		l.schedule(s, l.o.cfg.Clock().Add(storePause), storePause)
	case r.final:
		l.advance(s, r.job.seq)
		if r.delivered {
			l.receiverUp()
		}
	default: // retry, or enrichment retry
		if len(s.queue) == 0 || s.queue[0] != r.job.seq {
			l.makeReady(s) // the head changed meanwhile (a requeue put an older event first)
			return
		}
		h := r.event
		s.head = &h
		l.schedule(s, r.retryAt, r.retryIn)
		if r.outage {
			l.receiverFailed(s)
		}
	}
}

// baseRequests is how many requests in flight use the base client's connections (see New).
const baseRequests = 2

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
	switch i := slices.Index(s.queue, seq); {
	case i == 0:
		s.queue = s.queue[1:] // the usual case: O(1), a long backlog is not shifted
	case i > 0:
		s.queue = slices.Delete(s.queue, i, i+1)
	}
	s.newHead()
	if len(s.queue) == 0 {
		if !s.ready {
			delete(l.streams, s.name)
		}
		return
	}
	l.makeReady(s)
}

func (o *Outbox) updateGauges() {
	p, d, _, err := o.q.Counts()
	if err != nil {
		return
	}
	o.m.pending.Set(float64(p))
	o.m.dead.Set(float64(d))
}
