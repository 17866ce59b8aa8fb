package outbox

import (
	"errors"
	"time"
)

// Delivery by several replicas (a store.Claimer queue, PostgreSQL): each replica's loop keeps
// its own in-memory streams (every replica's commits reach them through the scan), and when fewer
// claimed heads wait than it has free slots it claims the heads of that many ready streams and a
// slot set more, all in one query
// (store.Claimer.ClaimHeads), before it enriches or sends any of them. The store grants a claim
// only for a stream's head that no live claimant holds, so one event is never sent by two
// replicas at the same time and a stream's events go out in order whichever replica sends them.
// The claim's answer also carries the head's header and body (no read per event) and where the
// stream's head is now: the events before it, which another replica delivered meanwhile, are
// dropped from the queue in one go.
//
// A claim is renewed when its head is dispatched again (after its enrichment, for a retry) with
// less than two thirds of its TTL left (the store answers a fresher claim of ours as it is, with no
// write), ends with the event's final outcome, and is released when Run returns (a replica stopped: the
// others take its heads at once); the claim of a replica that died expires after ClaimTTL and
// another replica takes the event over (sending it again with the same webhook-id: at least once,
// as always). The bbolt store has no claims: this file is not on its path.

const (
	// pollEvery bounds how long the loop sleeps when replicas share the queue: their commits do
	// not wake it (Notify is per process).
	pollEvery = time.Second
	// claimRetry is when a head another replica holds is tried again.
	claimRetry = time.Second
	// DefaultClaimTTL is how long a delivery claim lasts (T3CODE_MCP_CLAIM_TTL): it must outlast
	// one job on the head (an enrichment or an attempt, each bounded by Timeout) and its record.
	DefaultClaimTTL = 30 * time.Second
)

// claimReady claims the heads of the ready streams there are slots for (and renews those claimed
// at an earlier turn that are still waiting) in one query, and files each stream by the answer:
// claimed (l.claimed, looked at by dispatch), held by another replica (tried again after
// claimRetry) or with nothing pending any more (forgotten).
func (l *loop) claimReady(now time.Time) {
	cfg := l.o.cfg
	room := l.limit - int(l.inflight.Load()) - len(l.toDeliver)
	if cfg.Enricher != nil {
		room += cfg.EnrichConcurrency - l.enriching - len(l.toEnrich)
	}
	// Claimed heads still waiting for a slot (they stay in l.claimed: keepClaimed) are not asked
	// for again until their claim is a third through its TTL, then it is renewed with this
	// turn's claims (the store renews a claim of ours only then too: asked earlier, it answers
	// without a write). A turn claims only when fewer heads wait
	// than there are free slots, and then a slot set ahead (limit more), so that the turns
	// that follow a freed slot or two start their heads without a query.
	var batch, fresh []*stream
	for _, s := range l.claimed {
		if now.Sub(s.claimedAt) < cfg.ClaimTTL/3 && !now.Before(s.claimedAt) {
			fresh = append(fresh, s)
		} else {
			batch = append(batch, s)
		}
	}
	l.claimed = fresh
	if len(batch) == 0 && len(fresh) >= room {
		return
	}
	for len(batch)+len(fresh) < room+l.limit && len(l.ready) > 0 {
		s := pop(&l.ready)
		if len(s.queue) == 0 {
			s.ready = false
			if !s.enriching && !s.busy {
				l.forgetStream(s.name)
			}
			continue
		}
		batch = append(batch, s)
	}
	if len(batch) == 0 {
		return
	}
	names := make([]string, len(batch))
	for i, s := range batch {
		names[i] = s.name
	}
	cs, err := l.o.claimer.ClaimHeads(names, cfg.Claimant, cfg.ClaimTTL)
	if err == nil && len(cs) != len(batch) {
		err = errClaimAnswers
	}
	if err != nil {
		l.o.log.Error("outbox: claiming the heads to deliver", "streams", len(batch), "err", err)
		for _, s := range batch {
			s.ready = false
			l.schedule(s, now.Add(storePause), storePause)
		}
		return
	}
	skipped := 0
	for i, s := range batch {
		c := cs[i]
		skipped += l.dropBefore(s, c.Head)
		if c.Head == 0 {
			s.ready = false
			if !s.enriching && !s.busy {
				l.forgetStream(s.name)
			}
			continue
		}
		if len(s.queue) == 0 || s.queue[0] != c.Head {
			// A head this loop had not seen yet (committed after its last scan, or requeued).
			s.queue = append([]uint64{c.Head}, s.queue...)
			l.newHead(s)
			s.known = 0
		}
		if !c.Claimed {
			s.ready = false
			l.scheduleClaim(s, now)
			continue
		}
		e := c.Event
		if !s.enriched {
			s.body = e.Body
		}
		e.Body = nil
		s.head = &e
		s.ready = true
		// When it was claimed for ClaimTTL, as the store's answer tells it: a head this loop
		// already held comes back unrenewed while two thirds of its claim are left.
		s.claimedAt = now.Add(min(c.Left, cfg.ClaimTTL) - cfg.ClaimTTL)
		l.claimed = append(l.claimed, s)
	}
	l.skip(skipped)
}

// keepClaimed puts back a claimed head that must wait for a slot of the other kind: it keeps its
// claim (and the body that came with it) and waits in l.claimed, at the back, rather than going
// back to the ready queue to be claimed again at the next turn (a row update, and a WAL flush,
// per head and turn: issue 16's 52 row updates per delivered event).
func (l *loop) keepClaimed(s *stream) {
	s.ready = true
	l.claimed = append(l.claimed, s)
}

// notPending drops a queued event found no longer pending. With replicas that is another
// replica's delivery (counted, summed up in the log); a process that is the only deliverer
// never sees it, so there it is a warning.
func (l *loop) notPending(stream string, seq uint64, err error) {
	if l.o.claimer != nil {
		l.skip(1)
		return
	}
	l.o.log.Warn("outbox: a queued event is no longer pending; skipping it", "stream", stream, "seq", seq, "err", err)
}

// skipLogEvery is how often, at most, a replica logs how many events it skipped.
const skipLogEvery = time.Minute

// skip counts n events skipped because another replica delivered them: normal with replicas,
// so one Info line a minute sums them up (and a Debug line per turn).
func (l *loop) skip(n int) {
	if n == 0 {
		return
	}
	l.o.m.skipped.Add(float64(n))
	l.o.log.Debug("outbox: skipped events another replica delivered", "count", n)
	l.skipped += n
	if now := time.Now(); now.Sub(l.skipLogged) >= skipLogEvery {
		l.o.log.Info("outbox: skipped events another replica delivered or gave up (normal with replicas)", "count", l.skipped, "since", l.skipLogged.Format(time.RFC3339))
		l.skipped, l.skipLogged = 0, now
	}
}

// dropBefore drops s's queued events before head (all of them when head is 0: none is pending),
// which another replica delivered or gave up; it returns how many it dropped.
func (l *loop) dropBefore(s *stream, head uint64) int {
	n := 0
	for n < len(s.queue) && (head == 0 || s.queue[n] < head) {
		l.unhold(s.queue[n])
		if ev, ok := s.done[s.queue[n]]; ok {
			delete(s.done, s.queue[n])
			l.aheadBytes -= len(ev.Body)
		}
		n++
	}
	if n == 0 {
		return 0
	}
	s.queue = s.queue[n:]
	s.known = max(0, s.known-n)
	l.newHead(s)
	s.aheadFail = false
	if len(s.queue) > 0 {
		if ev, ok := s.done[s.queue[0]]; ok { // completed ahead: its body goes with the claim
			delete(s.done, s.queue[0])
			l.aheadBytes -= len(ev.Body)
			s.body, s.enriched = ev.Body, true
			s.known = max(s.known, 1)
		}
	}
	return n
}

// scheduleClaim tries s's head again after claimRetry: another replica holds it. The wake-up is
// not a due retry (see wakeAt.claim): the head's own NextAttempt still counts.
func (l *loop) scheduleClaim(s *stream, now time.Time) {
	l.wakeAt(s, now.Add(claimRetry), claimRetry, true)
}

// releaseClaims ends this outbox's claims once Run has stopped: the other replicas take its heads
// at once instead of after ClaimTTL.
func (o *Outbox) releaseClaims() {
	n, err := o.claimer.ReleaseClaims(o.cfg.Claimant)
	if err != nil {
		o.log.Warn("outbox: could not release this replica's delivery claims; the other replicas take its events when the claims expire", "claim_ttl", o.cfg.ClaimTTL.String(), "err", err)
		return
	}
	o.log.Info("outbox: released this replica's delivery claims", "count", n, "replica", o.cfg.Claimant)
}

var errClaimAnswers = errors.New("the store answered a claim with the wrong number of streams")
